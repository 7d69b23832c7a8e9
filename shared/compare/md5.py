"""md5 mode (compare.md §6): the dumped CRC-32 (or XOR checksum) of each tensor, equal or not."""

from __future__ import annotations

PASS = "pass"
DIFFERENT = "Different"
NA = "N/A"


def md5_result(npu_md5: str | None, bench_md5: str | None, *, matched: bool) -> str:
    """v1's Result: ``pass`` when the checksums are equal, ``Different`` otherwise, ``N/A`` when unmatched.

    No shape or dtype check (as msprobe): equal bytes are equal data.
    """
    if not matched:
        return NA
    return PASS if npu_md5 == bench_md5 else DIFFERENT
