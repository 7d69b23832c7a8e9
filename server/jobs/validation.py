"""Validating a run's dump.json files on the job backend: ``Validator.run(run_id)``, what ``complete`` queues.

``POST /runs/{id}/complete`` only moves the run to ``validating`` and sends ``validate:{run id}`` to the job
backend; the API process never reads a dump.json. A worker (a local pool process or a Celery worker, the
same code) claims the validation under a lease on the run row (the rank tasks' protocol: one conditional
UPDATE per claim, ``validation_attempt`` + 1, renewed every third of ``PARITY_JOB_LEASE_SECONDS``), so a
worker killed mid-validation is taken over once its lease passes (the local pool requeues it at once).

The worker parses the files in a short-lived child interpreter (``python -m parity.server.jobs.parse_child``,
a subprocess and not a multiprocessing child: a Celery prefork worker's processes are daemonic, and
multiprocessing refuses them children), one file after another, so its own memory stays that of a worker and
the parse's goes back to the system when the child exits; the child dies with the worker
(``PR_SET_PDEATHSIG``). It parses each file incrementally (``shared.dump.stream``), so it holds the dump's
columns, not its text and whole parse (~7x the file: a 150 MB file took +1 GB; incrementally, under +300 MB
for the server's whole process tree). Files of ``IN_PROCESS_BYTES`` or less in all are parsed in the worker.
The child writes each dump's parsed columns (``shared.dump.sidecar``), which the worker stores beside the
blob for the compare tasks, and returns only the first problem's text. Then one transaction, guarded by
the attempt, makes the run ``complete`` (and queues its comparison against the project's baseline) or
``invalid`` with the error naming the file and entry; the sidecars are stored only when every file parsed,
so nothing of an invalid run is published.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from parity.server.blob_cache import BlobCache
from parity.server.db import Database
from parity.server.jobs.base import JobQueue
from parity.server.jobs.lease import Lease, LeaseLost
from parity.server.jobs.limits import redact_paths
from parity.server.models import Run, RunFile, utcnow
from parity.server.settings import Settings
from parity.server.store import BlobStore, sidecar_key
from parity.shared.dump.layout import DUMP_JSON
from sqlalchemy import ColumnElement, and_, or_, select, update
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from parity.server.jobs.runner import TaskRunner

logger = logging.getLogger(__name__)

#: Job ids of validations on the backends: ``validate:{run id}`` (rank tasks are ``{comparison}:{rank}``).
PREFIX = "validate:"


def validation_id(run_id: str) -> str:
    return f"{PREFIX}{run_id}"


def validated_run(job_id: str) -> str | None:
    """The run id of a validation's job id; None for any other job (a rank task)."""
    return job_id[len(PREFIX) :] if job_id.startswith(PREFIX) else None


# -- the claim, on the run row ----------------------------------------------------------------------------
def _lease_passed(now: datetime) -> ColumnElement[bool]:
    return or_(Run.validation_lease_expires_at.is_(None), Run.validation_lease_expires_at < now)


class ValidationRepository:
    """The validations of runs: claim under a lease, renew, find the waiting and the lapsed."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def claim(self, run_id: str, now: datetime, lease_seconds: float, worker: str) -> int | None:
        """The new attempt number if the run is validating and nobody holds it under a live lease."""
        result = self.session.execute(
            update(Run)
            .where(Run.id == run_id, Run.status == "validating", _lease_passed(now))
            .values(validation_attempt=Run.validation_attempt + 1, validation_worker=worker,
                    validation_lease_expires_at=now + timedelta(seconds=lease_seconds))
            .execution_options(synchronize_session=False)
        )  # fmt: skip
        if getattr(result, "rowcount", 0) != 1:
            return None
        return self.session.scalar(select(Run.validation_attempt).where(Run.id == run_id))

    def renew(self, run_id: str, attempt: int, until: datetime) -> bool:
        result = self.session.execute(
            update(Run)
            .where(Run.id == run_id, Run.status == "validating", Run.validation_attempt == attempt)
            .values(validation_lease_expires_at=until)
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0))

    def held(self, run_id: str, attempt: int) -> Run | None:
        """The run, locked, while ``attempt`` still holds its validation."""
        run = self.session.get(Run, run_id, with_for_update=True)
        if run is None or run.status != "validating" or run.validation_attempt != attempt:
            return None
        return run

    def waiting(self, limit: int) -> list[str]:
        """Runs validating that no worker holds (never claimed, or requeued), oldest first."""
        stmt = (
            select(Run.id)
            .where(Run.status == "validating", Run.validation_lease_expires_at.is_(None))
            .order_by(Run.created_at, Run.id)
            .limit(limit)
        )
        return list(self.session.scalars(stmt))

    def lapsed(self, now: datetime, limit: int) -> list[tuple[str, datetime | None]]:
        """(run id, lease) of the validations whose worker's lease has passed: their worker is gone."""
        stmt = (
            select(Run.id, Run.validation_lease_expires_at)
            .where(Run.status == "validating", Run.validation_lease_expires_at < now)
            .order_by(Run.created_at, Run.id)
            .limit(limit)
        )
        return [(run_id, lease) for run_id, lease in self.session.execute(stmt)]

    def requeue(self, worker: str | None = None) -> int:
        """Give up the claims (of one dead ``worker``, or all): the next worker to look takes them."""
        stmt = update(Run).where(Run.status == "validating", Run.validation_lease_expires_at.is_not(None))
        if worker is not None:
            stmt = stmt.where(Run.validation_worker == worker)
        result = self.session.execute(
            stmt.values(validation_lease_expires_at=None, validation_worker=None).execution_options(
                synchronize_session=False
            )
        )
        return int(getattr(result, "rowcount", 0))


def held_by(session: Session, worker: str) -> list[tuple[str, int]]:
    """(run id, attempt) of the validations ``worker`` holds."""
    stmt = select(Run.id, Run.validation_attempt).where(
        and_(Run.status == "validating", Run.validation_worker == worker)
    )
    return [(run_id, attempt) for run_id, attempt in session.execute(stmt)]


def recover(db: Database, worker: str, why: str, max_attempts: int) -> None:
    """The validations a dead local worker held: waiting again, or ``invalid`` after ``max_attempts`` claims
    (a dump that kills its worker every time, out of memory say, must not loop forever)."""
    with db.write() as session:
        repo = ValidationRepository(session)
        for run_id, attempt in held_by(session, worker):
            if attempt >= max_attempts:
                run = repo.held(run_id, attempt)
                if run is not None:
                    run.status, run.error = "invalid", f"validation failed: {why} (attempt {attempt})"
                    run.validation_lease_expires_at, run.validation_worker = None, None
                logger.warning("run %s invalid: its validation's worker died %d times", run_id, attempt)
            else:
                logger.warning("validation of run %s: %s; queued again", run_id, why)
        repo.requeue(worker)


# -- the work ---------------------------------------------------------------------------------------------
class Validator:
    """Runs validations in this worker process (built once per process, beside its ``TaskRunner``)."""

    def __init__(self, settings: Settings, db: Database, store: BlobStore, cache: BlobCache,
                 queue: JobQueue, worker: str) -> None:  # fmt: skip
        self.settings, self.db, self.store, self.cache = settings, db, store, cache
        self.queue = queue  # for the comparison against the baseline, queued once a run is complete
        self.worker = worker

    @classmethod
    def beside(cls, runner: TaskRunner, queue: JobQueue) -> Validator:
        """A validator sharing the worker's database pool, store and cache with its ``TaskRunner``."""
        return cls(runner.settings, runner.db, runner.store, runner.cache, queue, runner.worker)

    def next_waiting(self) -> str | None:
        with self.db.read() as session:
            waiting = ValidationRepository(session).waiting(1)
        return waiting[0] if waiting else None

    def run(self, run_id: str) -> bool:
        """Validate run ``run_id`` and record the outcome; never raises. False: not claimable."""
        lease_s = self.settings.job_lease_seconds
        with self.db.write() as session:
            attempt = ValidationRepository(session).claim(run_id, utcnow(), lease_s, self.worker)
        if attempt is None:
            logger.info("validation of run %s is not claimable (done, deleted, or held)", run_id)
            return False
        logger.info("validation of run %s claimed: attempt %d", run_id, attempt)
        try:
            with _validation_lease(self.db, run_id, attempt, lease_s) as lease:
                problem, sidecars = self._validate(run_id, lease)
                lease.check()
                self._finish(run_id, attempt, problem, sidecars)
        except LeaseLost as exc:
            logger.warning("validation of run %s: %s; this attempt stops", run_id, exc)
        except Exception as exc:  # a bug or the store, not the dump: the run says so; completing it retries
            logger.exception("validation of run %s failed", run_id)
            why = f"validation could not run ({type(exc).__name__}: {exc}); complete the run again to retry"
            why = redact_paths(why, self.settings)  # the error is read by every user of the API
            try:
                self._finish(run_id, attempt, why, [])
            except Exception:  # the database is away: the lease lapses and another worker takes it over
                logger.exception("validation of run %s: its failure could not be recorded", run_id)
        return True

    def _validate(self, run_id: str, lease: Lease) -> tuple[str | None, list[str]]:
        with self.db.read() as session:
            files = session.scalars(
                select(RunFile).where(RunFile.run_id == run_id).order_by(RunFile.path)
            ).all()
            dumps = [(f.path, f.blob, f.size) for f in files if f.path.rsplit("/", 1)[-1] == DUMP_JSON]
        if not dumps:
            return f"run {run_id}: no dump.json uploaded", []
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
                return problem, []
            # Published before the run is complete (a compare task may only start then), and only now that
            # every file parsed.
            stored = []
            for i, (_, blob, _) in enumerate(dumps):
                self.store.put_file(Path(tmp) / f"{i}.columns", sidecar_key(blob))
                stored.append(sidecar_key(blob))
        return None, stored

    def _finish(self, run_id: str, attempt: int, problem: str | None, sidecars: Sequence[str]) -> None:
        with self.db.write() as session:
            run = ValidationRepository(session).held(run_id, attempt)
            if run is not None:
                run.validation_lease_expires_at, run.validation_worker = None, None
                if problem is None:
                    run.status, run.error, run.completed_at = "complete", None, utcnow()
                else:
                    run.status, run.error = "invalid", problem[:4000]
        if run is None:
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


def _validation_lease(db: Database, run_id: str, attempt: int, seconds: float) -> Lease:
    """The heartbeat of a claimed validation: renews the lease on the run row (no progress, no deadline)."""

    def renew(until: datetime, progress: float) -> bool:
        with db.write() as session:
            return ValidationRepository(session).renew(run_id, attempt, until)

    return Lease(renew, seconds, what=f"validation of run {run_id}",
                 why_lost=f"attempt {attempt} no longer holds the validation")  # fmt: skip


# -- the parse, in a child process ------------------------------------------------------------------------
#: Dumps of at most this many bytes in all are parsed in the worker itself: the incremental parse holds about
#: their size, and a child interpreter's own ~30 MB would be more than that again.
IN_PROCESS_BYTES = 64 * 2**20


def validate_dumps(dumps: Sequence[tuple[str, Path]], sidecar_dir: Path | None = None, *,
                   in_process_bytes: int = IN_PROCESS_BYTES) -> str | None:  # fmt: skip
    """The first problem among ``(rel, local path)`` dump.json files, parsed in a child interpreter (in this
    process when they hold ``in_process_bytes`` or less); with ``sidecar_dir``, the sidecar of the i-th file
    is written there as ``{i}.columns``. Raises :class:`ValidationChildError` when the child itself fails
    (killed, out of memory, a bug)."""
    work = [(rel, str(path), str(sidecar_dir / f"{i}.columns") if sidecar_dir else None)
            for i, (rel, path) in enumerate(dumps)]  # fmt: skip
    if sum(path.stat().st_size for _, path in dumps) <= in_process_bytes:
        from parity.server.jobs.parse_child import first_problem

        return first_problem(work)
    request = json.dumps({"parent": os.getpid(), "dumps": work})
    # The child imports the parse only (parse_child), not the server: 24 MiB less in every parsing child.
    done = subprocess.run([sys.executable, "-m", "parity.server.jobs.parse_child"], input=request,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise ValidationChildError(f"the parsing child failed: {tail[0]}")
    problem: str | None = json.loads(done.stdout)["problem"]
    return problem


class ValidationChildError(RuntimeError):
    """The child that parses the dump.json files ended without an answer."""
