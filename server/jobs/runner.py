"""``TaskRunner.run(job_id)``: one job, the unit every job backend delivers; a task claims, works, finishes.

A job is a row of ``jobs`` (``JobRepository``): a comparison's rank (or slice of one) or a run's validation.
The runner claims it (queued → running, ``attempt`` + 1) under a lease that a heartbeat thread renews while
it works (``lease``), hands it to its work (``rank_task.RankTask``, ``validation_task.ValidationTask``), and
records how it ended; any error is recorded on the job, nothing is raised. With ``pull_next`` (the backends'
workers) the transaction that stores a rank also claims the worker's next job, validations first.

A worker killed mid-job leaves that job ``running``; once its lease has passed, the next delivery of the job
id (the broker's, the server's lease watcher's, or the local pool's, which requeues a dead child's job at
once) claims it again as attempt + 1. A deleted comparison or run, a cancel, or a job past
``PARITY_JOB_TIMEOUT_SECONDS`` stops the work at its next check, and with ``hard_stop`` (a pool's worker
process) the heartbeat ends the process if that check does not come within ``lease.STOP_GRACE_S``.
"""

from __future__ import annotations

import logging
from datetime import datetime

from parity.server.blob_cache import worker_cache
from parity.server.db import Database
from parity.server.errors import ServiceError
from parity.server.job_repository import KINDS, JobRepository
from parity.server.jobs.base import JobId, JobQueue, NullQueue, parse_task_id, validated_run, worker_name
from parity.server.jobs.lease import Lease, LeaseLost
from parity.server.jobs.limits import redact_paths
from parity.server.jobs.merge import slice_label
from parity.server.jobs.rank_store import finish_failed
from parity.server.jobs.rank_task import Claimed, RankTask, is_parity_error
from parity.server.jobs.staging import tmp_root
from parity.server.jobs.timeline import Timeline
from parity.server.jobs.validation_task import ValidationTask, record_outcome
from parity.server.models import Job, utcnow
from parity.server.settings import Settings
from parity.server.store import open_store
from parity.shared.tensor_io import TensorLimits
from sqlalchemy import select
from sqlalchemy.orm import Session

__all__ = ["TaskRunner", "job_lease"]

logger = logging.getLogger(__name__)


class TaskRunner:
    """Runs jobs in this process; built once per worker process (a database pool, a store, a cache).

    With ``pull_next`` (the job backends' workers), the transaction that stores a rank also claims the next
    queued job, which the runner then runs at once: a worker's next job costs no write transaction of its
    own. On SQLite that claim had waited for the other worker's insert (its rows hold the one write lock
    ~0.1 s a rank): 0.7 s of each 16-rank comparison with two workers. On Celery the message of a job so
    taken finds it running and pulls the next queued job in its turn, or finds none and is done.

    ``queue`` receives what a validation queues (the comparison against the project's baseline);
    ``hard_stop`` lets a lost or late job's heartbeat end this process (never in a server or a test).
    """

    def __init__(self, settings: Settings, worker: str | None = None, *, pull_next: bool = False,
                 queue: JobQueue | None = None, hard_stop: bool = False) -> None:  # fmt: skip
        self.settings = settings
        self.worker = worker or worker_name()
        self.pull_next = pull_next
        self.hard_stop = hard_stop
        self.db = Database.connect(settings.resolved_database_url)
        self.store = open_store(settings.resolved_store_url, settings.resolved_data_dir / "tmp")
        self.cache = worker_cache(settings, self.store)
        limits = TensorLimits(settings.max_tensor_file_bytes, settings.max_tensor_elements)
        self.ranks = RankTask(self.db, self.store, tmp_root(self.store, settings),
                              self._claim_following if pull_next else None, tensor_limits=limits,
                              replay_budget=settings.replay_budget())  # fmt: skip
        self.validations = ValidationTask(settings, self.db, self.store, self.cache, queue or NullQueue(),
                                          self.worker)  # fmt: skip

    def close(self) -> None:
        self.db.dispose()

    # -- claiming -----------------------------------------------------------------------------------------
    def run_next(self, kinds: tuple[str, ...] = KINDS) -> bool:
        """Claim the next queued job of ``kinds`` (validations first, then the oldest) and run it, and with
        ``pull_next`` each job it claims as it stores one; False when none is queued."""
        timeline = Timeline()
        with self.db.write() as session:
            lease_s = self.settings.job_lease_seconds
            claimed = JobRepository(session).claim_next(utcnow(), lease_s, self.worker, kinds)
        if claimed is None:
            return False
        timeline.mark("claimed")
        self._run_claimed(claimed, timeline)
        return True

    def run(self, job_id: JobId) -> bool:
        """Run job ``job_id`` to completion or record why it failed; never raises. False: not claimable (with
        ``pull_next``: nor any other job queued)."""
        timeline = Timeline()
        attempt = None
        with self.db.read() as session:
            claimable = JobRepository(session).claimable(job_id, utcnow())
        if claimable:  # the read may be stale; the claim decides
            with self.db.write() as session:
                attempt = JobRepository(session).claim(job_id, utcnow(), self.settings.job_lease_seconds,
                                                       self.worker)  # fmt: skip
        if attempt is None:
            logger.info("job %s is not claimable (finished, deleted, or running under a live lease)", job_id)
            # Often another worker took it as it stored its own last rank: pull what is left instead.
            return self.pull_next and self._queued() and self.run_next()
        timeline.mark("claimed")
        self._run_claimed((job_id, attempt), timeline)
        return True

    def _run_claimed(self, claimed: Claimed, timeline: Timeline) -> None:
        """Run a claimed job, then each one claimed as the one before was stored."""
        following: Claimed | None = claimed
        while following is not None:
            self._execute(following[0], following[1], timeline)
            following, self.ranks.following = self.ranks.following, None
            timeline = Timeline()
            timeline.mark("claimed")  # in the transaction that stored the job before it

    def _queued(self) -> bool:
        """Whether any job is queued (a read: a message with nothing left to pull takes no write lock)."""
        with self.db.read() as session:
            return bool(JobRepository(session).queued(limit=1))

    def _claim_following(self, session: Session) -> Claimed | None:
        """In the transaction that stores a rank: claim the next queued job (a validation first)."""
        return JobRepository(session).claim_next(utcnow(), self.settings.job_lease_seconds, self.worker)

    # -- running ------------------------------------------------------------------------------------------
    def _execute(self, job_id: JobId, attempt: int, timeline: Timeline) -> None:
        """Run a claimed attempt to its end: its result, or why it failed, recorded; never raises."""
        from parity.process_policy import collector_paused

        run_id = validated_run(job_id)
        what = f"validation of run {run_id}" if run_id is not None else _rank_label(job_id)
        logger.info("%s claimed: attempt %d", what, attempt)
        try:
            with self._lease(job_id, attempt, what, rank=run_id is None) as lease, collector_paused():
                if run_id is not None:
                    self.validations.run(run_id, attempt, lease)
                else:
                    comparison_id, rank, slice_ = parse_task_id(job_id)
                    # what the job fetched: kept on success, dropped on failure
                    with self.cache.checkout() as blobs:
                        self.ranks.run(comparison_id, rank, slice_, attempt, lease, blobs, timeline)
        except LeaseLost as exc:
            logger.warning("%s: %s; this attempt stops", what, exc)
        except Exception as exc:
            self._failed(job_id, attempt, what, exc)
        finally:
            if run_id is None:
                timeline.log(job_id, self.worker)

    def _failed(self, job_id: JobId, attempt: int, what: str, exc: Exception) -> None:
        expected = isinstance(exc, ServiceError) or is_parity_error(exc)
        message = str(exc) if expected else f"{type(exc).__name__}: {exc}"
        if not expected:  # a bug, not bad input: keep the traceback in the log
            logger.exception("%s failed", what)
        # The log keeps the full text; the job's error is read by every user of the API.
        message = redact_paths(message or type(exc).__name__, self.settings)
        run_id = validated_run(job_id)
        try:
            if run_id is None:
                comparison_id, rank, slice_ = parse_task_id(job_id)
                finish_failed(self.db, comparison_id, rank, attempt, message, slice_=slice_)
            else:  # a bug or the store, not the dump: the run says so; completing it again retries
                why = f"validation could not run ({message}); complete the run again to retry"
                self.validations.finish(run_id, attempt, why)
        except Exception:  # the database is away: the lease lapses and another worker takes the job over
            logger.exception("%s: its failure could not be recorded", what)

    def _lease(self, job_id: JobId, attempt: int, what: str, *, rank: bool) -> Lease:
        settings = self.settings
        timeout = settings.job_timeout_seconds if rank else settings.validation_timeout_seconds
        lease_s, hard = self.settings.job_lease_seconds, self.hard_stop
        return job_lease(self.db, job_id, attempt, lease_s, what=what, timeout=timeout, hard_stop=hard)


def job_lease(db: Database, job_id: JobId, attempt: int, seconds: float, *, what: str | None = None,
              timeout: float | None = None, hard_stop: bool = False) -> Lease:  # fmt: skip
    """The heartbeat of a claimed job: renews its lease (and a rank's progress) in one UPDATE, and reads
    every half second whether the attempt still holds the job; a job past ``timeout`` is failed (a rank
    with its error, a validation's run ``invalid`` saying so), and the queue moves on."""
    rank = validated_run(job_id) is None

    def renew(until: datetime, progress: float) -> bool:
        with db.write() as session:
            noted = progress if rank else None
            return JobRepository(session).renew(job_id, attempt, until, progress=noted)

    def alive() -> bool:
        # Held while running, and once this attempt itself recorded its end (a slice that does not join,
        # a skipped rank) until its block ends; lost when deleted, cancelled or failed, or claimed again.
        with db.read() as session:
            found = session.execute(select(Job.attempt, Job.status).where(Job.id == job_id)).first()
        return found is not None and found[0] == attempt and found[1] in ("running", "succeeded", "skipped")

    def expire(message: str) -> None:
        run_id = validated_run(job_id)
        if run_id is not None:
            record_outcome(db, run_id, attempt, message)
            return
        comparison_id, rank_, slice_ = parse_task_id(job_id)
        finish_failed(db, comparison_id, rank_, attempt, message, slice_=slice_)

    return Lease(renew, seconds, what=what or f"job {job_id}", alive=alive, hard_stop=hard_stop,
                 why_lost=f"attempt {attempt} no longer holds the job", timeout=timeout,
                 timeout_kind="comparison" if rank else "validation", expire=expire)  # fmt: skip


def _rank_label(job_id: JobId) -> str:
    comparison_id, rank, slice_ = parse_task_id(job_id)
    return f"comparison {comparison_id} rank {rank}{slice_label(slice_)}"
