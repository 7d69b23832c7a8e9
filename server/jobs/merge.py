"""The last step of a comparison: once every rank job has finished, its status, summary and headers.

Called inside the transaction that finishes a rank job (``rank_store``), so the job that finds every other
one finished merges, and exactly one does (the comparison row is locked). The summary is the shared
pipeline's merged summary, with the headline figures the REST body shows.
"""

from __future__ import annotations

import logging

from parity.server.job_repository import TERMINAL, JobRepository
from parity.server.models import Comparison, ComparisonCounts, Job, utcnow
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

__all__ = ["COMPARISON_LOCK", "merge_comparison", "slice_label"]

logger = logging.getLogger(__name__)

#: How a finishing task locks its comparison row: ``FOR NO KEY UPDATE`` on PostgreSQL, which serialises the
#: finishers as ``FOR UPDATE`` did but not against the ``KEY SHARE`` lock that inserting a rank's rows
#: (foreign keys to the comparison) takes: with ``FOR UPDATE`` two ranks finishing at once each held that
#: share and waited for the other's (deadlock detected, seen with two workers on PostgreSQL). SQLite ignores
#: it.
COMPARISON_LOCK: dict[str, bool] = {"key_share": True}



def slice_label(slice_: int) -> str:
    """`` slice K`` for a slice past the first, for logs and errors; nothing for a whole rank."""
    return f" slice {slice_}" if slice_ else ""


def merge_comparison(session: Session, comparison_id: str) -> None:
    """The final step: once every task is finished, the comparison's status, summary and headers.

    Called inside the transaction that finishes a task. The comparison row is locked first (after the task
    row, the order a claim takes them in too), so of two tasks finishing at once the second sees the first
    one's committed state, and exactly one of them merges.
    """
    c = session.get(Comparison, comparison_id, with_for_update=COMPARISON_LOCK)
    if c is None:
        return
    # Two aggregates first: with R ranks, each of the R finishing tasks looks, and loading every task
    # (with its summary document) each time would make the merge checks O(R^2).
    t = Job
    mine = (t.kind == "rank", t.subject == comparison_id)
    unfinished, progress = session.execute(
        select(func.count(), func.coalesce(func.sum(t.progress), 0.0)).where(*mine, t.status.not_in(TERMINAL))
    ).one()
    if unfinished:
        total = session.scalar(select(func.count()).where(*mine)) or 1
        c.progress = (total - unfinished + float(progress)) / total
        return
    tasks = JobRepository(session).for_comparison(comparison_id)
    if not tasks:
        return
    failed = [t for t in tasks if t.status == "failed"]
    # A rank's result: its one task, or the slice that joined its slices (the others hold no summary).
    done = [t for t in tasks if t.status == "succeeded" and t.summary is not None]
    c.progress, c.finished_at = 1.0, utcnow()
    if failed or not done:
        c.status, c.summary, c.headers = "failed", None, None
        why = failed or tasks
        c.error = "; ".join(f"rank {t.rank}{slice_label(t.slice)}: {t.error}" for t in why)[:4000]
        logger.warning("comparison %s failed: %s", comparison_id, c.error)
        return
    c.status, c.error = "succeeded", None
    c.headers = {str(t.rank): list(t.header or []) for t in done}
    from parity.server.services.comparisons import comparison_summary

    c.summary = comparison_summary(
        session, c, [t.summary or {} for t in done],
        skipped=sorted({t.rank for t in tasks if t.status == "skipped"}),
    )  # fmt: skip
    # The ranks stored their calls with their rows; their counts make the calls ready for the pages.
    session.execute(delete(ComparisonCounts).where(ComparisonCounts.comparison_id == comparison_id))
    counts = {status: n for status, n in c.summary["status_counts"].items() if n}
    session.add(ComparisonCounts(comparison_id=comparison_id, counts=counts))
    logger.info(
        "comparison %s succeeded: %d rows over %d rank(s)", comparison_id, c.summary["rows"], len(done)
    )
