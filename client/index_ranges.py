"""Steps and ranks as the inclusive ranges a config names (``"0-4000000000"``), never expanded to a set.

msprobe's ``step`` and ``rank`` lists take ``"a-b"`` ranges; expanding one into a set of ints made a
few-byte plan a MemoryError inside ``PrecisionDebugger(...)``. The ranges are kept merged and sorted:
membership is a bisection, the size is arithmetic, and it compares equal to the ``frozenset`` it stands for.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Set

__all__ = ["IndexRanges"]


class IndexRanges(Set[int]):
    """A set of ints >= 0 held as merged, sorted inclusive ranges."""

    __slots__ = ("_highs", "_lows")

    def __init__(self, ranges: Iterable[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for lo, hi in sorted(ranges):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self._lows = tuple(lo for lo, _ in merged)
        self._highs = tuple(hi for _, hi in merged)

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        i = bisect.bisect_right(self._lows, value) - 1
        return i >= 0 and value <= self._highs[i]

    def __len__(self) -> int:
        return sum(hi - lo + 1 for lo, hi in zip(self._lows, self._highs, strict=True))

    def __iter__(self) -> Iterator[int]:
        for lo, hi in zip(self._lows, self._highs, strict=True):
            yield from range(lo, hi + 1)

    def __hash__(self) -> int:
        return self._hash()

    def max(self) -> int:
        """The largest index (the set is never empty where one is built)."""
        return self._highs[-1]

    def __repr__(self) -> str:
        pairs = zip(self._lows, self._highs, strict=True)
        parts = (str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in pairs)
        return f"IndexRanges([{', '.join(parts)}])"
