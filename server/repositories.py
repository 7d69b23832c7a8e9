"""Statement builders and small queries over the tables; services compose them inside one session."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from parity.server.models import (
    Comparison,
    ComparisonCall,
    ComparisonCounts,
    ComparisonRow,
    ComparisonTask,
    Run,
    RunFile,
    RunTag,
)
from sqlalchemy import ColumnElement, Select, and_, delete, func, or_, select, text, update
from sqlalchemy.orm import Session, aliased


def serialize_on(session: Session, key: str) -> None:
    """Make concurrent write transactions about the same ``key`` (a run name, a comparison's inputs) run one
    after the other, so that a check-then-insert cannot let two of them insert.

    PostgreSQL: a transaction-scoped advisory lock on a 64-bit hash of ``key``, released at commit; it costs
    one round trip and blocks nothing else. SQLite: nothing to do, every write transaction already holds the
    database's write lock from its ``BEGIN IMMEDIATE``.
    """
    if session.get_bind().dialect.name == "postgresql":
        lock = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)
        session.execute(text("SELECT pg_advisory_xact_lock(:lock)"), {"lock": lock})


@dataclass
class RunStats:
    """What the Run body reports beside the table's own columns."""

    file_count: int = 0
    total_bytes: int = 0
    steps: set[int] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)


class RunRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, run_id: str, *, for_update: bool = False, shared: bool = False) -> Run | None:
        """``for_update``: lock the run row (PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already serialises
        writers). ``shared`` makes it ``FOR SHARE``: uploads of one run proceed side by side, while deleting
        or completing the run (``FOR UPDATE``) waits for them."""
        stmt = select(Run).where(Run.id == run_id)
        if for_update:
            stmt = stmt.with_for_update(read=shared)
        return self.session.scalars(stmt).first()

    def named(self, name: str, project: str | None = None) -> list[Run]:
        """The runs called ``name`` (in ``project`` when given), oldest first."""
        stmt = select(Run).where(Run.name == name)
        if project is not None:
            stmt = stmt.where(Run.project == project)
        return list(self.session.scalars(stmt.order_by(Run.created_at, Run.id)))

    def filtered(
        self,
        *,
        project: str | None = None,
        name: str | None = None,
        name_contains: str | None = None,
        device: str | None = None,
        status: str | None = None,
        tags: Sequence[tuple[str, str]] = (),
    ) -> Select[tuple[Run]]:
        stmt = select(Run)
        if project is not None:
            stmt = stmt.where(Run.project == project)
        if name is not None:
            stmt = stmt.where(Run.name == name)
        if name_contains:
            stmt = stmt.where(contains_text(Run.name, name_contains))
        if device is not None:
            stmt = stmt.where(Run.device == device)
        if status is not None:
            stmt = stmt.where(Run.status == status)
        for key, value in tags:
            tag = aliased(RunTag)
            stmt = stmt.join(tag, and_(tag.run_id == Run.id, tag.key == key, tag.value == value))
        return stmt

    def page(self, stmt: Select[tuple[Run]], limit: int, offset: int) -> tuple[list[Run], int]:
        total = self.session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
        runs = self.session.scalars(
            stmt.order_by(Run.created_at.desc(), Run.id).limit(limit).offset(offset)
        ).all()
        return list(runs), int(total)

    def stats(self, run_ids: Sequence[str]) -> dict[str, RunStats]:
        stats: dict[str, RunStats] = defaultdict(RunStats)
        if not run_ids:
            return stats
        counts = self.session.execute(
            select(RunFile.run_id, func.count(), func.coalesce(func.sum(RunFile.size), 0))
            .where(RunFile.run_id.in_(run_ids))
            .group_by(RunFile.run_id)
        )
        for run_id, count, total in counts:
            stats[run_id].file_count = int(count)
            stats[run_id].total_bytes = int(total)
        pairs = self.session.execute(
            select(RunFile.run_id, RunFile.step, RunFile.rank)
            .where(RunFile.run_id.in_(run_ids), RunFile.step.is_not(None))
            .distinct()
        )
        for run_id, step, rank in pairs:
            stats[run_id].steps.add(int(step))
            if rank is not None:
                stats[run_id].ranks.add(int(rank))
        return stats

    def files(self, run_id: str) -> list[RunFile]:
        return list(
            self.session.scalars(select(RunFile).where(RunFile.run_id == run_id).order_by(RunFile.path))
        )

    def file(self, run_id: str, path: str) -> RunFile | None:
        return self.session.get(RunFile, (run_id, path))

    def step_files(self, run_id: str, step: int, ranks: Sequence[int] | None) -> list[RunFile]:
        stmt = select(RunFile).where(RunFile.run_id == run_id, RunFile.step == step)
        if ranks is not None:
            stmt = stmt.where(RunFile.rank.in_(list(ranks)))
        return list(self.session.scalars(stmt.order_by(RunFile.path)))

    def rank_bytes(self, run_ids: Sequence[str], step: int, ranks: Sequence[int]) -> dict[int, int]:
        """The bytes of the files of each of ``ranks`` in step ``step`` of ``run_ids``, together."""
        f = RunFile
        stmt = (
            select(f.rank, func.sum(f.size))
            .where(f.run_id.in_(list(run_ids)), f.step == step, f.rank.in_(list(ranks)))
            .group_by(f.rank)
        )
        return {int(rank): int(size or 0) for rank, size in self.session.execute(stmt)}

    def step_ranks(self, run_id: str) -> dict[int, set[int]]:
        out: dict[int, set[int]] = defaultdict(set)
        rows = self.session.execute(
            select(RunFile.step, RunFile.rank)
            .where(RunFile.run_id == run_id, RunFile.step.is_not(None), RunFile.rank.is_not(None))
            .distinct()
        )
        for step, rank in rows:
            out[int(step)].add(int(rank))
        return out

    def delete(self, run_id: str) -> None:
        cids = select(Comparison.id).where(
            or_(Comparison.target_run_id == run_id, Comparison.bench_run_id == run_id)
        )
        self.session.execute(delete(ComparisonRow).where(ComparisonRow.comparison_id.in_(cids)))
        self.session.execute(delete(ComparisonCall).where(ComparisonCall.comparison_id.in_(cids)))
        self.session.execute(delete(ComparisonCounts).where(ComparisonCounts.comparison_id.in_(cids)))
        self.session.execute(delete(ComparisonTask).where(ComparisonTask.comparison_id.in_(cids)))
        self.session.execute(
            delete(Comparison).where(
                or_(Comparison.target_run_id == run_id, Comparison.bench_run_id == run_id)
            )
        )
        self.session.execute(delete(RunFile).where(RunFile.run_id == run_id))
        self.session.execute(delete(RunTag).where(RunTag.run_id == run_id))
        self.session.execute(delete(Run).where(Run.id == run_id))

    def comparison_ids(self, run_id: str) -> list[str]:
        return list(
            self.session.scalars(
                select(Comparison.id).where(
                    or_(Comparison.target_run_id == run_id, Comparison.bench_run_id == run_id)
                )
            )
        )


class ComparisonRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, comparison_id: str, *, for_update: bool = False) -> Comparison | None:
        return self.session.get(Comparison, comparison_id, with_for_update=for_update)

    def delete(self, comparison_id: str) -> None:
        self.session.execute(delete(ComparisonRow).where(ComparisonRow.comparison_id == comparison_id))
        self.session.execute(delete(Comparison).where(Comparison.id == comparison_id))

    def filtered(
        self, *, run: str | None = None, project: str | None = None, status: str | None = None
    ) -> Select[tuple[Comparison]]:
        stmt = select(Comparison)
        if run is not None:
            stmt = stmt.where(or_(Comparison.target_run_id == run, Comparison.bench_run_id == run))
        if project is not None:
            stmt = stmt.join(Run, Run.id == Comparison.target_run_id).where(Run.project == project)
        if status is not None:
            stmt = stmt.where(Comparison.status == status)
        return stmt

    def page(self, stmt: Select[tuple[Comparison]], limit: int, offset: int) -> tuple[list[Comparison], int]:
        total = self.session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
        items = self.session.scalars(
            stmt.order_by(Comparison.created_at.desc(), Comparison.id).limit(limit).offset(offset)
        ).all()
        return list(items), int(total)

    def same_request(
        self, target_id: str, bench_id: str, step: int, ranks: list[int] | None, options: dict[str, Any]
    ) -> Comparison | None:
        """The newest comparison of these runs, step, ranks and options (compared here: JSON columns
        compare differently on each backend)."""
        candidates = self.session.scalars(
            select(Comparison)
            .where(Comparison.target_run_id == target_id, Comparison.bench_run_id == bench_id,
                   Comparison.step == step)
            .order_by(Comparison.created_at.desc(), Comparison.id)
        )  # fmt: skip
        return next((c for c in candidates if c.ranks == ranks and (c.options or {}) == options), None)


#: Statements ``claim_next`` tries before it gives up on a busy queue (PostgreSQL only needs more than one).
CLAIM_NEXT_LOOKS = 4

#: A task's id on the job backends: ``{comparison id}:{rank}``, or ``{comparison id}:{rank}.{slice}`` for a
#: slice past the first of a rank split into slices (ids, never objects, travel to workers).
TaskId = str


def task_id(comparison_id: str, rank: int, slice_: int = 0) -> TaskId:
    return f"{comparison_id}:{rank}" if slice_ == 0 else f"{comparison_id}:{rank}.{slice_}"


def parse_task_id(value: TaskId) -> tuple[str, int, int]:
    """``(comparison id, rank, slice)`` of a task id."""
    comparison_id, sep, key = value.rpartition(":")
    rank, dot, slice_ = key.partition(".")
    if not sep or not rank.lstrip("-").isdigit() or (dot and not slice_.isdigit()):
        raise ValueError(f"not a task id: {value!r} (expected COMPARISON:RANK or COMPARISON:RANK.SLICE)")
    return comparison_id, int(rank), int(slice_ or 0)


class TaskRepository:
    """The per-rank tasks of comparisons: claim under a lease, renew, find the lapsed and the queued."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def for_comparison(self, comparison_id: str) -> list[ComparisonTask]:
        stmt = select(ComparisonTask).where(ComparisonTask.comparison_id == comparison_id)
        return list(self.session.scalars(stmt.order_by(ComparisonTask.rank, ComparisonTask.slice)))

    def for_comparisons(self, comparison_ids: Sequence[str]) -> dict[str, list[ComparisonTask]]:
        out: dict[str, list[ComparisonTask]] = defaultdict(list)
        if comparison_ids:
            stmt = select(ComparisonTask).where(ComparisonTask.comparison_id.in_(list(comparison_ids)))
            for task in self.session.scalars(stmt.order_by(ComparisonTask.rank, ComparisonTask.slice)):
                out[task.comparison_id].append(task)
        return out

    def claim(
        self, comparison_id: str, rank: int, now: datetime, lease_seconds: float, worker: str, slice_: int = 0
    ) -> int | None:
        """Make the task running under a lease and return its new attempt number, if it is queued or running
        under a lease that has passed (its worker died); else None. One conditional UPDATE, so exactly one
        of any number of claimants wins (as ``ComparisonRepository.claim`` for whole jobs before)."""
        t = ComparisonTask
        result = self.session.execute(
            update(t)
            .where(t.comparison_id == comparison_id, t.rank == rank, t.slice == slice_, _task_claimable(now))
            .values(status="running", attempt=t.attempt + 1, started_at=now, progress=0.0, error=None,
                    worker=worker, lease_expires_at=now + timedelta(seconds=lease_seconds))
            .execution_options(synchronize_session=False)
        )  # fmt: skip
        if getattr(result, "rowcount", 0) != 1:
            return None
        # The comparison is running from its first claimed task on (lock order: task row, then comparison).
        self.session.execute(
            update(Comparison)
            .where(Comparison.id == comparison_id, Comparison.status == "queued")
            .values(status="running", started_at=now)
            .execution_options(synchronize_session=False)
        )
        return self.session.scalar(
            select(t.attempt).where(t.comparison_id == comparison_id, t.rank == rank, t.slice == slice_)
        )

    def claimable(self, comparison_id: str, rank: int, now: datetime, slice_: int = 0) -> bool:
        """Whether ``claim`` could take the task now: a read, so a worker handed a task that another has
        taken already does not queue for SQLite's write lock to find out."""
        t = ComparisonTask
        found = self.session.scalar(
            select(t.rank).where(t.comparison_id == comparison_id, t.rank == rank, t.slice == slice_,
                                 _task_claimable(now))  # fmt: skip
        )
        return found is not None

    def claim_next(self, now: datetime, lease_seconds: float, worker: str) -> tuple[TaskId, int] | None:
        """Claim the oldest queued task, in one statement: (its id, its new attempt), or None when none is
        queued. The local pool's workers pull their work with it: a look then a claim let two idle workers
        pick the same task, and the loser waited for the write lock twice before its next look."""
        t = ComparisonTask
        oldest = (
            select(t.comparison_id, t.rank, t.slice)
            .where(t.status == "queued")
            .order_by(t.queued_at, t.comparison_id, t.rank, t.slice)
            .limit(1)
        )
        if self.session.get_bind().dialect.name == "postgresql":
            oldest = oldest.with_for_update(skip_locked=True)  # two claimants take two different tasks
        # A CTE, evaluated once: as ``IN (subquery)`` PostgreSQL may run the subquery again per row, and with
        # SKIP LOCKED each run finds another task (one claim took two, measured).
        picked = oldest.cte("picked")
        claim = (
            update(t)
            .where(t.comparison_id == picked.c.comparison_id, t.rank == picked.c.rank)
            .where(t.slice == picked.c.slice)
            .where(t.status == "queued")
            .values(status="running", attempt=t.attempt + 1, started_at=now, progress=0.0, error=None,
                    worker=worker, lease_expires_at=now + timedelta(seconds=lease_seconds))
            .returning(t.comparison_id, t.rank, t.slice, t.attempt)
            .execution_options(synchronize_session=False)
        )  # fmt: skip
        claimed = self.session.execute(claim).first()
        for _ in range(CLAIM_NEXT_LOOKS - 1 if claimed is None else 0):
            # On PostgreSQL a row another claimant took between this statement's snapshot and its lock is
            # dropped, not replaced by the next (LIMIT before the lock's recheck): look again while one is
            # queued. (SQLite's write lock makes the first look final.) Bounded: a worker that still finds
            # none looks again at its next wake-up.
            if self.session.scalar(select(t.rank).where(t.status == "queued").limit(1)) is None:
                break
            claimed = self.session.execute(claim).first()
            if claimed is not None:
                break
        if claimed is None:
            return None
        comparison_id, rank, slice_, attempt = claimed
        self.session.execute(
            update(Comparison)
            .where(Comparison.id == comparison_id, Comparison.status == "queued")
            .values(status="running", started_at=now)
            .execution_options(synchronize_session=False)
        )
        return task_id(comparison_id, rank, slice_), attempt

    def renew_lease(
        self, comparison_id: str, rank: int, attempt: int, until: datetime, *, progress: float | None = None,
        slice_: int = 0,
    ) -> bool:
        """Extend ``attempt``'s lease (and record its ``progress``, given one); False when that attempt no
        longer holds the task."""
        t = ComparisonTask
        values: dict[str, Any] = {"lease_expires_at": until}
        if progress is not None:
            values["progress"] = progress
        result = self.session.execute(
            update(t)
            .where(t.comparison_id == comparison_id, t.rank == rank, t.slice == slice_)
            .where(t.attempt == attempt, t.status == "running")
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0))

    def expired_leases(self, now: datetime, limit: int) -> list[tuple[TaskId, datetime | None]]:
        """(task id, lease expiry) of the running tasks whose lease has passed: their worker is gone."""
        t = ComparisonTask
        stmt = (
            select(t.comparison_id, t.rank, t.slice, t.lease_expires_at)
            .where(t.status == "running", _task_lease_passed(now))
            .order_by(t.queued_at, t.comparison_id, t.rank, t.slice)
            .limit(limit)
        )
        return [(task_id(cid, rank, k), lease) for cid, rank, k, lease in self.session.execute(stmt)]

    def queued(self, limit: int, exclude: Sequence[TaskId] = ()) -> list[TaskId]:
        """Queued tasks, oldest comparison first, ranks in order."""
        t = ComparisonTask
        stmt = (
            select(t.comparison_id, t.rank, t.slice)
            .where(t.status == "queued")
            .order_by(t.queued_at, t.comparison_id, t.rank, t.slice)
        )
        skip = set(exclude)
        out: list[TaskId] = []
        for cid, rank, k in self.session.execute(stmt.limit(limit + len(skip))):
            tid = task_id(cid, rank, k)
            if tid not in skip:
                out.append(tid)
        return out[:limit]

    def requeue_running(self, worker: str | None = None) -> int:
        """Put running tasks (of one dead ``worker``, or all of them) back in the queue; returns how many."""
        t = ComparisonTask
        stmt = update(t).where(t.status == "running")
        if worker is not None:
            stmt = stmt.where(t.worker == worker)
        result = self.session.execute(
            stmt.values(status="queued", progress=0.0, lease_expires_at=None, worker=None)
            .execution_options(synchronize_session=False)
        )
        return int(getattr(result, "rowcount", 0))


def contains_text(column: ColumnElement[str], needle: str) -> ColumnElement[bool]:
    """``needle`` anywhere in ``column``, ignoring case, with ``%``, ``_`` and ``\\`` taken literally.

    ``ILIKE`` on PostgreSQL and ``lower() LIKE lower()`` on SQLite, so both backends answer alike (a plain
    ``LIKE`` ignores ASCII case on SQLite only).
    """
    escaped = needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return column.ilike(f"%{escaped}%", escape="\\")


def _task_lease_passed(now: datetime) -> ColumnElement[bool]:
    return or_(ComparisonTask.lease_expires_at.is_(None), ComparisonTask.lease_expires_at < now)


def _task_claimable(now: datetime) -> ColumnElement[bool]:
    running = and_(ComparisonTask.status == "running", _task_lease_passed(now))
    return or_(ComparisonTask.status == "queued", running)
