"""A finished comparison on the client side: its reports under msprobe's file names, and its verdict as text.

Used by ``parity compare-runs --wait`` and the demo.

Example::

    info = api.wait_for_comparison(comparison_id)
    paths = download_reports(api, info, Path("out"))
    print("\\n".join(summary_lines(info)))
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from parity.client.rest import ApiError, ParityClient
from parity.shared.compare.options import TOP_SUSPECTS
from parity.shared.contract import ComparisonPublic, SuspectPublic
from parity.shared.report import write_text_atomically
from parity.shared.report.advisor import excel_where, suspect_lines

__all__ = ["download_reports", "report_names", "saved_files", "summary_lines"]

log = logging.getLogger(__name__)


def report_names(ranks: Sequence[int], stamp: str) -> list[tuple[int | None, str, str]]:
    """``(rank to ask for, xlsx name, advisor name)``: msprobe's names, per rank when there are several."""
    if len(ranks) <= 1:
        return [(None, f"compare_result_{stamp}.xlsx", f"advisor_{stamp}.txt")]
    return [(r, f"compare_result_rank{r}_{stamp}.xlsx", f"advisor_rank{r}_{stamp}.txt") for r in ranks]


def download_reports(api: ParityClient, info: ComparisonPublic, out_dir: Path) -> list[Path]:
    """Download every report and advisor of a succeeded comparison, then its summary JSON
    (``compare_summary_{ts}.json``), into ``out_dir``; returns their paths. The summary's ``files`` name the
    reports saved beside it, not the server's download names (``saved_files``)."""
    ranks = info.summary.ranks if info.summary is not None else (info.ranks or [])
    stamp = time.strftime("%Y%m%d%H%M%S")
    names = report_names(ranks, stamp)
    paths: list[Path] = []
    for rank, xlsx, advisor in names:
        paths.append(api.download(info.id, "report.xlsx", out_dir / xlsx, rank=rank))
        paths.append(api.download(info.id, "advisor.txt", out_dir / advisor, rank=rank))
    try:
        summary = api.download(info.id, "summary.json", out_dir / f"compare_summary_{stamp}.json")
        doc = json.loads(summary.read_text(encoding="utf-8"))
        # Where it came from, so ``parity plan SUMMARY`` asks that server (it holds the dumps and the level).
        doc = {**saved_files(doc, names), "comparison": info.id, "server": api.server}
        write_text_atomically(summary, json.dumps(doc, indent=2) + "\n")
        paths.append(summary)
    except ApiError as exc:
        if exc.status_code != 404:
            raise
        # A server from before summaries were stored (or a comparison it finished then): the reports suffice.
        log.warning("no summary JSON: %s", exc.detail)
    return paths


def saved_files(doc: dict[str, Any], names: Sequence[tuple[int | None, str, str]]) -> dict[str, Any]:
    """The summary document with each rank's ``files`` naming the reports saved beside it (``names`` from
    :func:`report_names`; a None rank: the only one), so a script reading the summary opens the files that
    are there. A kind the server had no file for stays None; a rank not saved keeps the server's names."""
    saved = {rank: {"xlsx": xlsx, "advisor": advisor} for rank, xlsx, advisor in names}

    def renamed(rank_doc: dict[str, Any]) -> dict[str, Any]:
        files = rank_doc.get("files")
        ours = saved.get(None) or saved.get(rank_doc.get("rank"))
        if not isinstance(files, dict) or ours is None:
            return rank_doc
        return {**rank_doc, "files": {kind: ours.get(kind, name) if name else name
                                      for kind, name in files.items()}}  # fmt: skip

    out = dict(renamed(doc))
    if isinstance(doc.get("ranks"), list):
        out["ranks"] = [renamed(r) if isinstance(r, dict) else r for r in doc["ranks"]]
    return out


def summary_lines(info: ComparisonPublic, limit: int = TOP_SUSPECTS) -> list[str]:
    """The comparison's verdict, then its first divergence and top ``limit`` suspects in the advisor file's
    own words (``shared.report.advisor.suspect_lines``, the one formatter), each naming its rank."""
    summary = info.summary
    if summary is None:
        return [f"comparison {info.id}: {info.status}, no summary"]
    header = (f"comparison {info.id}: {summary.rows} rows, {summary.failing_rows} failing, "
              f"{len(summary.failing_apis)} failing APIs (mode {summary.mode})")  # fmt: skip

    def where(suspect: SuspectPublic) -> str:
        return f"rank {suspect.compare_rank}, {excel_where(suspect)}"

    return [header, *suspect_lines(summary.top_suspects, summary.first_divergence, limit=limit, where=where,
                                   systematic=[f.text for f in summary.systematic])]
