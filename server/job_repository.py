"""The jobs table's one repository: queue, claim under a lease, renew, finish or fail, requeue.

Every job (a comparison's rank, a run's validation) goes through the same protocol, on both backends:

* **claim**: one conditional UPDATE (queued, or running under a lease that has passed) that bumps
  ``attempt`` and sets a lease, so exactly one of any number of claimants wins;
* **renew**: the claimant's heartbeat extends its lease (and records its progress), guarded by its attempt;
* **finish** / **fail**: in the transaction that records the result, guarded by the attempt (``held``), so a
  stale worker whose lease passed and whose job was claimed again writes nothing;
* **requeue**: a dead worker's jobs go back to the queue (the local pool at once; on Celery the lease
  watcher resends them once their lease has passed).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from parity.server.jobs.base import JobId, task_id, validation_id
from parity.server.models import Comparison, Job
from sqlalchemy import ColumnElement, and_, case, delete, or_, select, update
from sqlalchemy.orm import Session

__all__ = ["CLAIM_NEXT_LOOKS", "KINDS", "JobRepository"]

#: Statements ``claim_next`` tries before it gives up on a busy queue (PostgreSQL only needs more than one).
CLAIM_NEXT_LOOKS = 4
#: The kinds of job, in the order a worker takes them: a validation first (a comparison may be waiting
#: for the run it validates), then the rank jobs, oldest first.
KINDS = ("validate", "rank")
TERMINAL = frozenset({"succeeded", "failed", "skipped"})


def _lease_passed(now: datetime) -> ColumnElement[bool]:
    return or_(Job.lease_expires_at.is_(None), Job.lease_expires_at < now)


def _claimable(now: datetime) -> ColumnElement[bool]:
    return or_(Job.status == "queued", and_(Job.status == "running", _lease_passed(now)))


def _queue_order() -> tuple[Any, ...]:
    return (case((Job.kind == "validate", 0), else_=1), Job.queued_at, Job.subject, Job.rank, Job.slice)


class JobRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    # -- queueing -----------------------------------------------------------------------------------------
    def add_rank_jobs(self, comparison_id: str, slices: Mapping[int, int], now: datetime) -> list[Job]:
        """One queued job per rank of ``slices`` (``slices[rank]`` jobs for a rank split into slices)."""
        jobs = [
            Job(id=task_id(comparison_id, rank, k), kind="rank", subject=comparison_id, rank=rank, slice=k,
                slices=count, status="queued", attempt=0, progress=0.0, queued_at=now)
            for rank, count in sorted(slices.items()) for k in range(count)
        ]  # fmt: skip
        self.session.add_all(jobs)
        return jobs

    def queue_validation(self, run_id: str, now: datetime) -> JobId:
        """Queue the validation of ``run_id`` (again, after an invalid one: its attempts keep counting, so a
        worker still holding an old attempt cannot record over the new one)."""
        job_id = validation_id(run_id)
        job = self.session.get(Job, job_id, with_for_update=True)
        if job is None:
            self.session.add(Job(id=job_id, kind="validate", subject=run_id, status="queued", attempt=0,
                                 progress=0.0, queued_at=now))  # fmt: skip
        else:
            self._reset(job, now)
        return job_id

    def requeue(self, jobs: Sequence[Job], now: datetime) -> None:
        """Queue finished ``jobs`` again (a failed rank retried)."""
        for job in jobs:
            self._reset(job, now)

    @staticmethod
    def _reset(job: Job, now: datetime) -> None:
        job.status, job.error, job.progress, job.queued_at, job.finished_at = "queued", None, 0.0, now, None
        job.lease_expires_at, job.worker = None, None

    # -- reading ------------------------------------------------------------------------------------------
    def get(self, job_id: JobId) -> Job | None:
        return self.session.get(Job, job_id)

    def for_comparison(self, comparison_id: str) -> list[Job]:
        stmt = select(Job).where(Job.kind == "rank", Job.subject == comparison_id)
        return list(self.session.scalars(stmt.order_by(Job.rank, Job.slice)))

    def for_comparisons(self, comparison_ids: Sequence[str]) -> dict[str, list[Job]]:
        out: dict[str, list[Job]] = defaultdict(list)
        if comparison_ids:
            stmt = select(Job).where(Job.kind == "rank", Job.subject.in_(list(comparison_ids)))
            for job in self.session.scalars(stmt.order_by(Job.rank, Job.slice)):
                out[job.subject].append(job)
        return out

    def running(self, kind: str) -> list[Job]:
        return list(self.session.scalars(select(Job).where(Job.kind == kind, Job.status == "running")))

    def held_by(self, worker: str) -> list[tuple[JobId, int]]:
        """(job id, attempt) of the running jobs ``worker`` holds."""
        stmt = select(Job.id, Job.attempt).where(Job.status == "running", Job.worker == worker)
        return [(job_id, attempt) for job_id, attempt in self.session.execute(stmt)]

    def queued(self, limit: int, exclude: Sequence[JobId] = (), kinds: Sequence[str] = KINDS) -> list[JobId]:
        """Queued jobs in the order the workers take them."""
        stmt = select(Job.id).where(Job.status == "queued", Job.kind.in_(list(kinds)))
        skip = set(exclude)
        found = self.session.scalars(stmt.order_by(*_queue_order()).limit(limit + len(skip)))
        return [job_id for job_id in found if job_id not in skip][:limit]

    def lapsed(self, now: datetime, limit: int) -> list[tuple[JobId, datetime | None]]:
        """(job id, lease) of the running jobs whose lease has passed: their worker is gone."""
        stmt = (
            select(Job.id, Job.lease_expires_at)
            .where(Job.status == "running", _lease_passed(now))
            .order_by(*_queue_order())
            .limit(limit)
        )
        return [(job_id, lease) for job_id, lease in self.session.execute(stmt)]

    # -- claiming -----------------------------------------------------------------------------------------
    def claimable(self, job_id: JobId, now: datetime) -> bool:
        """Whether ``claim`` could take the job now: a read, so a worker handed a job that another has taken
        already does not queue for SQLite's write lock to find out."""
        return self.session.scalar(select(Job.id).where(Job.id == job_id, _claimable(now))) is not None

    def claim(self, job_id: JobId, now: datetime, lease_seconds: float, worker: str) -> int | None:
        """Make the job running under a lease and return its new attempt number, if it is queued or running
        under a lease that has passed (its worker died); else None."""
        result = self.session.execute(
            update(Job).where(Job.id == job_id, _claimable(now))
            .values(**_claimed(now, lease_seconds, worker)).execution_options(synchronize_session=False)
        )  # fmt: skip
        if getattr(result, "rowcount", 0) != 1:
            return None
        kind, subject, attempt = self.session.execute(
            select(Job.kind, Job.subject, Job.attempt).where(Job.id == job_id)
        ).one()
        self._started(kind, subject, now)
        return int(attempt)

    def claim_next(self, now: datetime, lease_seconds: float, worker: str,
                   kinds: Sequence[str] = KINDS) -> tuple[JobId, int] | None:  # fmt: skip
        """Claim the first queued job of ``kinds`` (validations first, then the oldest), in one statement:
        (its id, its new attempt), or None when none is queued. A look then a claim let two idle workers pick
        the same job, and the loser waited for the write lock twice before its next look."""
        look = select(Job.id).where(Job.status == "queued", Job.kind.in_(list(kinds))).limit(1)
        first = look.order_by(*_queue_order())
        if self.session.get_bind().dialect.name == "postgresql":
            first = first.with_for_update(skip_locked=True)  # two claimants take two different jobs
        # A CTE, evaluated once: as ``IN (subquery)`` PostgreSQL may run the subquery again per row, and with
        # SKIP LOCKED each run finds another job (one claim took two, measured).
        picked = first.cte("picked")
        claim = (
            update(Job)
            .where(Job.id == picked.c.id, Job.status == "queued")
            .values(**_claimed(now, lease_seconds, worker))
            .returning(Job.id, Job.kind, Job.subject, Job.attempt)
            .execution_options(synchronize_session=False)
        )
        claimed = self.session.execute(claim).first()
        for _ in range(CLAIM_NEXT_LOOKS - 1 if claimed is None else 0):
            # On PostgreSQL a row another claimant took between this statement's snapshot and its lock is
            # dropped, not replaced by the next (LIMIT before the lock's recheck): look again while one is
            # queued. (SQLite's write lock makes the first look final.) Bounded: a worker that still finds
            # none looks again at its next wake-up.
            if self.session.scalar(look) is None:
                break
            claimed = self.session.execute(claim).first()
            if claimed is not None:
                break
        if claimed is None:
            return None
        job_id, kind, subject, attempt = claimed
        self._started(kind, subject, now)
        return job_id, int(attempt)

    def _started(self, kind: str, subject: str, now: datetime) -> None:
        if kind == "rank":  # a comparison runs from its first claimed job on (lock order: job, comparison)
            self.session.execute(
                update(Comparison)
                .where(Comparison.id == subject, Comparison.status == "queued")
                .values(status="running", started_at=now)
                .execution_options(synchronize_session=False)
            )

    # -- holding and finishing ----------------------------------------------------------------------------
    def renew(self, job_id: JobId, attempt: int, until: datetime, *, progress: float | None = None) -> bool:
        """Extend ``attempt``'s lease (and record its ``progress``, given one); False when that attempt no
        longer holds the job (it was deleted, failed at its deadline, or claimed again)."""
        values: dict[str, Any] = {"lease_expires_at": until}
        if progress is not None:
            values["progress"] = progress
        result = self.session.execute(
            update(Job).where(Job.id == job_id, Job.attempt == attempt, Job.status == "running")
            .values(**values).execution_options(synchronize_session=False)
        )  # fmt: skip
        return bool(getattr(result, "rowcount", 0))

    def held(self, job_id: JobId, attempt: int) -> Job | None:
        """The job, locked, while ``attempt`` still holds it; None: that attempt is stale or the job gone."""
        job = self.session.get(Job, job_id, with_for_update=True)
        if job is None or job.attempt != attempt or job.status != "running":
            return None
        return job

    @staticmethod
    def finish(job: Job, status: str, *, error: str | None = None, now: datetime,
               rows: int | None = None, summary: dict[str, Any] | None = None,
               header: list[str] | None = None) -> None:  # fmt: skip
        """Record a held job's end: ``succeeded`` (with a rank's result), ``failed`` or ``skipped``."""
        assert status in TERMINAL, status
        job.status, job.finished_at, job.lease_expires_at = status, now, None
        job.error = error[:4000] if error is not None else None
        if status == "succeeded":
            job.progress, job.rows, job.summary, job.header = 1.0, rows, summary, header

    def fail(self, job_id: JobId, attempt: int, message: str, now: datetime) -> Job | None:
        """Fail the job if ``attempt`` still holds it; the job (None: stale or gone)."""
        job = self.held(job_id, attempt)
        if job is not None:
            self.finish(job, "failed", error=message, now=now)
        return job

    def cancel(self, kind: str, subject: str, message: str, now: datetime) -> int:
        """Fail the unfinished jobs of ``kind`` about ``subject`` with ``message``; how many. A running one
        sees it at its heartbeat's next look (its attempt no longer holds a running job) and stops."""
        result = self.session.execute(
            update(Job)
            .where(Job.kind == kind, Job.subject == subject, Job.status.in_(("queued", "running")))
            .values(status="failed", error=message, finished_at=now, lease_expires_at=None)
            .execution_options(synchronize_session=False)
        )
        return int(getattr(result, "rowcount", 0))

    def requeue_running(self, worker: str | None = None) -> int:
        """Put running jobs (of one dead ``worker``, or all of them) back in the queue; returns how many."""
        stmt = update(Job).where(Job.status == "running")
        if worker is not None:
            stmt = stmt.where(Job.worker == worker)
        result = self.session.execute(
            stmt.values(status="queued", progress=0.0, lease_expires_at=None, worker=None)
            .execution_options(synchronize_session=False)
        )
        return int(getattr(result, "rowcount", 0))

    def delete_for(self, kind: str, subjects: Any) -> None:
        """Delete the jobs of ``kind`` about ``subjects`` (ids, or a select of ids): a running one finds its
        lease gone at its next heartbeat and stops."""
        self.session.execute(delete(Job).where(Job.kind == kind, Job.subject.in_(subjects)))


def _claimed(now: datetime, lease_seconds: float, worker: str) -> dict[str, Any]:
    lease = now + timedelta(seconds=lease_seconds)
    return {"status": "running", "attempt": Job.attempt + 1, "started_at": now, "progress": 0.0,
            "error": None, "worker": worker, "lease_expires_at": lease}  # fmt: skip
