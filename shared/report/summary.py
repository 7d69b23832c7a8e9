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
from parity.shared.compare.options import TOP_SUSPECTS
from parity.shared.compare.result import (
    FAILING_STATUSES,
    CompareResult,
    RowStatus,
    non_finite_text,
    suspect_from_dict,
)
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
    builds it from what each rank's task stored: the server stores and serves this very document.
    ``first_diverged``: the rank that lost precision first, judged around the collectives
    (``localization.first_diverged_rank``), or None. The headline figures over every rank (``rows``,
    ``failing_rows``, ``failing_apis``, ``top_suspects``, ``first_divergence``, ``replay``, ``replay_notes``,
    ``systematic``, each finding once;
    each suspect and verdict with its ``compare_rank``) are read from the ranks' documents here, once.
    """
    totals: dict[str, int] = {status.value: 0 for status in RowStatus}
    for rank in ranks:
        for status, count in rank["status_counts"].items():
            totals[status] += count
    missing = [rank["missing_tensor_files"] for rank in ranks if "missing_tensor_files" in rank]
    firsts = [m["first"] for m in missing if m["first"] is not None]
    missing_total = {"count": sum(m["count"] for m in missing), "first": firsts[0] if firsts else None}
    first_diverged = _first_diverged(ranks)
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
        "first_diverged": first_diverged,
        "missing_tensor_files": missing_total,
        **_headline(ranks, totals, first_diverged),
        "ranks": [dict(rank) for rank in ranks],
    }


def _headline(ranks: Sequence[Mapping[str, Any]], totals: Mapping[str, int],
              first_diverged: Mapping[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """The figures over every rank that the REST body and the pages show, from the ranks' documents."""
    failing_apis: dict[str, None] = {}
    suspects: list[dict[str, Any]] = []
    verdicts: list[dict[str, Any]] = []
    notes: dict[str, None] = {}
    findings: dict[str, dict[str, Any]] = {}
    for rank in ranks:
        for finding in rank.get("systematic") or []:
            findings.setdefault(str(finding.get("text")), dict(finding))
        for api in rank["failing_apis"]:
            failing_apis.setdefault(api)
        suspects += [{**s, "compare_rank": rank["rank"]} for s in rank["suspects"]]
        replay = rank.get("replay") or {}
        verdicts += [{**v, "compare_rank": rank["rank"]} for v in replay.get("verdicts") or []]
        if replay.get("note"):
            notes.setdefault(str(replay["note"]))
    # Ranked by score across ranks; the first divergence is the one of the rank that diverged first.
    suspects.sort(key=lambda s: (-s.get("score", 0.0), _rank_key(s["compare_rank"]),
                                 s.get("position", s.get("rank", 0))))  # fmt: skip
    first = None
    if first_diverged is not None:
        for rank in ranks:
            if rank["rank"] == first_diverged["rank"] and rank.get("first_divergence"):
                first = {**rank["first_divergence"], "compare_rank": rank["rank"]}
    failing = frozenset(status.value for status in FAILING_STATUSES)
    return {
        "rows": sum(totals.values()), "failing_rows": sum(n for s, n in totals.items() if s in failing),
        "failing_apis": list(failing_apis), "top_suspects": suspects[:TOP_SUSPECTS],
        "first_divergence": first, "replay": verdicts, "replay_notes": list(notes),
        "systematic": list(findings.values()),
    }  # fmt: skip


def _rank_key(rank: int | None) -> int:
    return -1 if rank is None else rank


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
