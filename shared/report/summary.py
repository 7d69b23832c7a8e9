"""The machine-readable JSON summary written beside the reports (``compare_summary_{ts}.json``).

One document per compare run. For a single rank it is ``CompareResult.summary()`` plus the names of the files
written for it. For a step directory it lists every compared rank (each with its own summary and files) and
the ranks found on one side only, so a script or the server can tell "rank 3 passed" from "rank 3 was never
compared". File names are relative to the output directory, so the folder can be moved or served as is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from parity.shared.compare.result import CompareResult, RowStatus
from parity.shared.report import write_text_atomically

#: Bumped when a key changes meaning or disappears; new keys may appear without a bump.
SUMMARY_FORMAT_VERSION = 1


def rank_summary(result: CompareResult, files: Mapping[str, str | None]) -> dict[str, Any]:
    """``result.summary()`` plus ``files`` (kind → file name, e.g. ``{"xlsx": ..., "advisor": None}``)."""
    doc = result.summary()
    doc["stack_mode"] = result.stack_mode
    doc["files"] = dict(files)
    return doc


def single_rank_summary(result: CompareResult, files: Mapping[str, str | None]) -> dict[str, Any]:
    """The summary document of a compare of two dump.json files."""
    return {"format_version": SUMMARY_FORMAT_VERSION, "kind": "single-rank", **rank_summary(result, files)}


def multi_rank_summary(
    ranks: Sequence[tuple[CompareResult, Mapping[str, str | None]]],
    *,
    npu_only_ranks: Sequence[int | None] = (),
    bench_only_ranks: Sequence[int | None] = (),
    skipped_ranks: Sequence[int | None] = (),
    first_diverged: Mapping[str, Any] | None = None,
    npu_path: str | None = None,
    bench_path: str | None = None,
) -> dict[str, Any]:
    """The summary document of a compare of two step directories: one entry per paired rank, and
    ``first_diverged``: which rank lost precision first (judged around the collectives), or None."""
    totals: dict[str, int] = {status.value: 0 for status in RowStatus}
    for result, _ in ranks:
        for row in result.rows:
            totals[row.status.value] += 1
    return {
        "format_version": SUMMARY_FORMAT_VERSION,
        "kind": "multi-rank",
        "npu_path": npu_path,
        "bench_path": bench_path,
        "mode": ranks[0][0].mode.value if ranks else None,
        "compared_ranks": [result.rank for result, _ in ranks],
        "npu_only_ranks": list(npu_only_ranks),
        "bench_only_ranks": list(bench_only_ranks),
        "skipped_ranks": list(skipped_ranks),
        "status_counts": totals,
        "first_diverged": dict(first_diverged) if first_diverged else None,
        "ranks": [rank_summary(result, files) for result, files in ranks],
    }


def _json_safe(value: Any) -> Any:
    # Summaries hold plain values; a stray NaN would make the file invalid JSON for strict readers.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_summary(doc: Mapping[str, Any], path: Path) -> Path:
    """Write ``doc`` as indented, strictly valid JSON at ``path`` (atomically)."""
    write_text_atomically(
        Path(path), json.dumps(_json_safe(doc), indent=2, allow_nan=False, default=str) + "\n"
    )
    return Path(path)
