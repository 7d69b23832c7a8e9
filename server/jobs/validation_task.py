"""The work of one claimed validation job: parse a run's dump.json files, then make it complete or invalid.

``POST /runs/{id}/complete`` only moves the run to ``validating`` and queues its ``validate`` job; the API
process never reads a dump.json. A worker (a local pool process or a Celery worker, the same code) claims the
job under a lease like any other (``runner.TaskRunner``), so a worker killed mid-validation is taken over once
its lease passes (the local pool requeues it at once). The parse runs in a child interpreter
(``validation``); the sidecars it writes are stored only when every file parsed, so nothing of an invalid
run is published. Then one transaction, guarded by the attempt, finishes the job and makes the run
``complete`` (and queues its comparison against the project's baseline) or ``invalid`` with the error naming
the file and entry.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path

from parity.server.blob_cache import BlobCache
from parity.server.db import Database
from parity.server.job_repository import JobRepository
from parity.server.jobs.base import JobQueue, validation_id
from parity.server.jobs.lease import Lease
from parity.server.jobs.validation import validate_dumps
from parity.server.models import Run, RunFile, utcnow
from parity.server.settings import Settings
from parity.server.store import BlobStore, sidecar_key
from parity.shared.dump.layout import DUMP_JSON
from parity.shared.dump.sidecar import sidecar_task
from sqlalchemy import select

__all__ = ["ValidationTask", "record_outcome"]

logger = logging.getLogger(__name__)


class ValidationTask:
    """Runs claimed validations in this worker (built once per worker, beside its ``RankTask``)."""

    def __init__(self, settings: Settings, db: Database, store: BlobStore, cache: BlobCache,
                 queue: JobQueue, worker: str) -> None:  # fmt: skip
        self.settings, self.db, self.store, self.cache = settings, db, store, cache
        self.queue = queue  # for the comparison against the baseline, queued once a run is complete
        self.worker = worker

    def run(self, run_id: str, attempt: int, lease: Lease) -> None:
        """Validate the claimed run and record the outcome; raises what the caller records."""
        problem, sidecars, task = self._validate(run_id, lease)
        lease.check()
        lease.stop()  # the finishing write is guarded by its attempt; the baseline compare after may be slow
        self.finish(run_id, attempt, problem, sidecars, dump_task=task)

    def _validate(self, run_id: str, lease: Lease) -> tuple[str | None, list[str], str | None]:
        """(the first problem, the sidecars stored, what the dump holds: ``sidecar.dump_task`` of its files,
        ``mixed`` when they disagree)."""
        with self.db.read() as session:
            files = session.scalars(
                select(RunFile).where(RunFile.run_id == run_id).order_by(RunFile.path)
            ).all()
            dumps = [(f.path, f.blob, f.size) for f in files if f.path.rsplit("/", 1)[-1] == DUMP_JSON]
        if not dumps:
            return f"run {run_id}: no dump.json uploaded", [], None
        tmp_root = self.settings.resolved_data_dir / "tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        with (
            self.cache.checkout() as blobs,
            tempfile.TemporaryDirectory(prefix="validate-", dir=tmp_root) as tmp,
        ):
            local = [(rel, blobs.path(blob, size)) for rel, blob, size in dumps]
            problem = validate_dumps(local, Path(tmp))
            lease.check()
            if problem is not None:
                return problem, [], None
            # Published before the run is complete (a compare job may only start then), and only now that
            # every file parsed.
            stored, tasks = [], set()
            for i, (_, blob, _) in enumerate(dumps):
                tasks.add(sidecar_task(Path(tmp) / f"{i}.columns"))
                self.store.put_file(Path(tmp) / f"{i}.columns", sidecar_key(blob))
                stored.append(sidecar_key(blob))
        return None, stored, tasks.pop() if len(tasks) == 1 else "mixed"

    def finish(self, run_id: str, attempt: int, problem: str | None, sidecars: Sequence[str] = (), *,
               dump_task: str | None = None) -> None:  # fmt: skip
        """Finish the job and the run: ``complete`` without a ``problem`` (holding ``dump_task``), else
        ``invalid`` saying it."""
        if not record_outcome(self.db, run_id, attempt, problem, dump_task=dump_task):
            logger.warning("validation of run %s: attempt %d is stale or the run is gone; dropped", run_id,
                           attempt)  # fmt: skip
            if self._run_gone(run_id):  # deleted while validated: its sidecars stored since are removed
                for key in sidecars:
                    self.store.delete(key)
            return
        if problem is not None:
            logger.warning("run %s is invalid: %s", run_id, problem)
            return
        logger.info("run %s complete (validated by %s)", run_id, self.worker)
        self._compare_with_baseline(run_id)

    def _run_gone(self, run_id: str) -> bool:
        with self.db.read() as session:
            return session.get(Run, run_id) is None

    def _compare_with_baseline(self, run_id: str) -> None:
        """The comparison against the project's baseline (issue 13) is queued when a run becomes complete."""
        from parity.server.services.baselines import BaselineService
        from parity.server.services.comparisons import ComparisonService
        from parity.server.services.runs import RunService

        runs = RunService(self.db, self.store, self.settings.max_upload_bytes)
        comparisons = ComparisonService(self.db, self.store, self.queue,
                                        task_max_bytes=self.settings.task_max_bytes)  # fmt: skip
        BaselineService(self.db, runs, comparisons).compare_with_baseline(run_id)


def record_outcome(db: Database, run_id: str, attempt: int, problem: str | None, *,
                   dump_task: str | None = None) -> bool:  # fmt: skip
    """In one transaction guarded by ``attempt``: the validation job finished and the run ``complete``
    (no ``problem``; its ``dump_task`` recorded) or ``invalid`` (saying it). False: the attempt is stale or
    the run gone; nothing done."""
    with db.write() as session:
        job = JobRepository(session).held(validation_id(run_id), attempt)
        run = session.get(Run, run_id, with_for_update=True) if job is not None else None
        if job is None or run is None or run.status != "validating":
            return False
        now, status = utcnow(), "succeeded" if problem is None else "failed"
        JobRepository.finish(job, status, error=problem, now=now)
        if problem is None:
            run.status, run.error, run.completed_at = "complete", None, now
            run.dump_task = dump_task
        else:
            run.status, run.error = "invalid", problem[:4000]
    return True
