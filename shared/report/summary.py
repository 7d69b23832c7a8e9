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

from parity.shared.compare.localization import first_diverged_rank
from parity.shared.compare.result import CompareResult, RowStatus, non_finite_text, suspect_from_dict
from parity.shared.report import write_text_atomically

#: Bumped when a key changes meaning or disappears; new keys may appear without a bump.
SUMMARY_FORMAT_VERSION = 1


def rank_summary(result: CompareResult, files: Mapping[str, str | None]) -> dict[str, Any]:
    """``result.summary()`` plus ``files`` (kind → file name, e.g. ``{"xlsx": ..., "advisor": None}``)."""
    doc = result.summary()
    doc["stack_mode"] = result.stack_mode
    doc["files"] = dict(files)
    return doc


def single_rank_summary(rank: Mapping[str, Any]) -> dict[str, Any]:
    """The summary document of a compare of two dump.json files, from its ``rank_summary``."""
    return {"format_version": SUMMARY_FORMAT_VERSION, "kind": "single-rank", **rank}


def _first_diverged(ranks: Sequence[Mapping[str, Any]]) -> dict[str, object] | None:
    firsts = {doc.get("rank"): suspect_from_dict(doc["first_divergence"]) if doc.get("first_divergence")
              else None for doc in ranks}  # fmt: skip
    origin = first_diverged_rank(firsts)
    return origin.as_dict() if origin is not None else None


def multi_rank_summary(
    ranks: Sequence[Mapping[str, Any]],
    *,
    npu_only_ranks: Sequence[int | None] = (),
    bench_only_ranks: Sequence[int | None] = (),
    skipped_ranks: Sequence[int | None] = (),
    npu_path: str | None = None,
    bench_path: str | None = None,
) -> dict[str, Any]:
    """The summary document of a compare of two step directories, from each paired rank's ``rank_summary``.

    It needs the ranks' documents only (plain JSON values), not their results, so the server's merge step
    builds it from what each rank's task stored. ``first_diverged``: the rank that lost precision first,
    judged around the collectives (``localization.first_diverged_rank``), or None.
    """
    totals: dict[str, int] = {status.value: 0 for status in RowStatus}
    for rank in ranks:
        for status, count in rank["status_counts"].items():
            totals[status] += count
    missing = [rank["missing_tensor_files"] for rank in ranks if "missing_tensor_files" in rank]
    firsts = [m["first"] for m in missing if m["first"] is not None]
    missing_total = {"count": sum(m["count"] for m in missing), "first": firsts[0] if firsts else None}
    return {
        "format_version": SUMMARY_FORMAT_VERSION,
        "kind": "multi-rank",
        "npu_path": npu_path,
        "bench_path": bench_path,
        "mode": ranks[0]["mode"] if ranks else None,
        "compared_ranks": [rank["rank"] for rank in ranks],
        "npu_only_ranks": list(npu_only_ranks),
        "bench_only_ranks": list(bench_only_ranks),
        "skipped_ranks": list(skipped_ranks),
        "status_counts": totals,
        "first_diverged": _first_diverged(ranks),
        "missing_tensor_files": missing_total,
        "ranks": [dict(rank) for rank in ranks],
    }


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float as its text: strict JSON for files and databases."""
    if isinstance(value, float) and not math.isfinite(value):
        return non_finite_text(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_summary(doc: Mapping[str, Any], path: Path) -> Path:
    """Write ``doc`` as indented, strictly valid JSON at ``path`` (atomically)."""
    write_text_atomically(
        Path(path), json.dumps(json_safe(doc), indent=2, allow_nan=False, default=str) + "\n"
    )
    return Path(path)
