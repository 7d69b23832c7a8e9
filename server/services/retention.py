"""Retention: what ``parity gc`` and the server's periodic sweep remove.

* runs older than ``PARITY_RETENTION_DAYS`` that are not marked ``keep`` (with their comparisons; off unless
  the setting is given),
* orphaned blobs: a blob no row points to (an upload published just before a crash, before its row was
  written), a run's or a comparison's blobs left after the row is gone (a delete interrupted between its
  commit and the store clean-up),
* temp files and job folders left by a killed server or worker.

Anything younger than ``PARITY_TEMP_GRACE_SECONDS`` is left alone: it may belong to an upload between its
publish and its commit, or to a job that is staging. Both the CLI and the server run this concurrently with
live traffic, so every decision is made from the database at the time of the sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from parity.server.db import Database
from parity.server.disk import Reserve
from parity.server.job_repository import JobRepository
from parity.server.models import Comparison, Run, RunFile, utcnow
from parity.server.services.comparisons import ComparisonService
from parity.server.services.runs import RunService
from parity.server.store import BlobStore, sidecar_key
from sqlalchemy import select

logger = logging.getLogger(__name__)

__all__ = ["RetentionService", "SweepReport"]


@dataclass
class SweepReport:
    """What one sweep removed (or, in a dry run, would remove)."""

    expired_runs: list[str] = field(default_factory=list)
    orphan_blobs: list[str] = field(default_factory=list)
    orphan_bytes: int = 0
    temp_entries: int = 0

    def __str__(self) -> str:
        return (f"{len(self.expired_runs)} expired run(s), {len(self.orphan_blobs)} orphaned blob(s) "
                f"({self.orphan_bytes} bytes), {self.temp_entries} temp entr(ies)")  # fmt: skip


class RetentionService:
    def __init__(
        self,
        db: Database,
        store: BlobStore,
        runs: RunService,
        comparisons: ComparisonService,
        *,
        retention_days: float | None,
        grace_seconds: float,
        reserve: Reserve | None = None,
    ) -> None:
        self.db, self.store, self.runs, self.comparisons = db, store, runs, comparisons
        self.retention_days = retention_days
        self.grace_seconds = grace_seconds
        self.reserve = reserve

    def sweep(self, *, dry_run: bool = False, now: datetime | None = None) -> SweepReport:
        """One pass over runs, blobs and temp files; safe to run beside a live server."""
        now = now or utcnow()
        report = SweepReport()
        report.expired_runs = self._expired_runs(now)
        if not dry_run:
            for run_id in report.expired_runs:
                self._delete_run(run_id)
        for key, size in self._orphan_blobs(now.timestamp() - self.grace_seconds):
            report.orphan_blobs.append(key)
            report.orphan_bytes += size
            if not dry_run:
                self.store.delete(key)
        if not dry_run:
            report.temp_entries = self.store.sweep_temp(self.grace_seconds, self._busy_job_folders())
            if self.reserve is not None:
                self.reserve.fill()  # space was freed: the reserve is laid again for the next full disk
        if report.expired_runs or report.orphan_blobs or report.temp_entries:
            logger.info("sweep%s: %s", " (dry run)" if dry_run else "", report)
        return report

    def _expired_runs(self, now: datetime) -> list[str]:
        if self.retention_days is None:
            return []
        cutoff = now - timedelta(days=self.retention_days)
        with self.db.read() as session:
            # A project's baseline is kept as if marked: the comparisons queued against it need it.
            stmt = (
                select(Run.id)
                .where(Run.created_at < cutoff, Run.keep.is_(False), Run.baseline.is_(False))
                .order_by(Run.created_at)
            )
            return list(session.scalars(stmt))

    def _delete_run(self, run_id: str) -> None:
        from parity.server.errors import NotFound

        try:
            # An expired run goes with its comparisons: the retention period is the operator's explicit ask.
            self.comparisons.forget(self.runs.delete(run_id, with_comparisons=True))
        except NotFound:
            return  # deleted meanwhile by a user
        logger.info("run %s deleted: older than PARITY_RETENTION_DAYS=%g", run_id, self.retention_days)

    def _orphan_blobs(self, older_than: float) -> Iterator[tuple[str, int]]:
        """(key, size) of each blob no row points to, untouched since ``older_than`` (a Unix time)."""
        blobs_of: dict[str, set[str] | None] = {}  # run id -> its rows' blob keys; None: no such run
        for key, mtime, size in self.store.iter_blobs("runs"):
            if mtime >= older_than:
                continue
            run_id = key.split("/", 2)[1]
            if run_id not in blobs_of:
                blobs_of[run_id] = self._run_blobs(run_id)
            known = blobs_of[run_id]
            if known is None or key not in known:
                # Read again before it goes: a row may have arrived since the run's keys were read.
                if not self._blob_recorded(run_id, key):
                    yield key, size
        comparisons: dict[str, bool] = {}
        for key, mtime, size in self.store.iter_blobs("comparisons"):
            if mtime >= older_than:
                continue
            cid = key.split("/", 2)[1]
            if cid not in comparisons:
                with self.db.read() as session:
                    comparisons[cid] = session.get(Comparison, cid) is not None
            if not comparisons[cid]:
                yield key, size

    def _run_blobs(self, run_id: str) -> set[str] | None:
        """The keys a run's rows point to, with the parsed-columns sidecar each dump.json may have."""
        with self.db.read() as session:
            if session.get(Run, run_id) is None:
                return None
            blobs = set(session.scalars(select(RunFile.blob).where(RunFile.run_id == run_id)))
        return blobs | {sidecar_key(blob) for blob in blobs}

    def _blob_recorded(self, run_id: str, key: str) -> bool:
        candidates = [key]
        if key.endswith(sidecar_key("")):
            candidates.append(key.removesuffix(sidecar_key("")))  # a sidecar lives as long as its dump.json
        with self.db.read() as session:
            stmt = select(RunFile.path).where(RunFile.run_id == run_id, RunFile.blob.in_(candidates)).limit(1)
            return session.scalar(stmt) is not None

    def _busy_job_folders(self) -> list[str]:
        """Name prefixes of the staging folders of rank tasks running now (the runner's
        ``task-{id8}-r{rank}-``)."""
        with self.db.read() as session:
            running = JobRepository(session).running("rank")
            return [f"task-{job.subject[:8]}-r{job.rank}-" for job in running]

