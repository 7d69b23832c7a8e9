"""Statement builders and small queries over the tables; services compose them inside one session."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from parity.server.job_repository import JobRepository
from parity.server.models import (
    Comparison,
    ComparisonCall,
    ComparisonCounts,
    ComparisonRow,
    Run,
    RunFile,
    RunTag,
)
from parity.shared.incomplete import INCOMPLETE_FILE
from parity.shared.naming import skeleton
from sqlalchemy import ColumnElement, Select, and_, delete, func, or_, select, text
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
    incomplete: set[tuple[int, int]] = field(default_factory=set)  # (step, rank) marked cut short


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

    def alike(self, name: str, project: str) -> list[Run]:
        """The runs of ``project`` whose name looks like ``name`` (the same :func:`skeleton`: ``nightly`` and
        ``nіghtly`` with a Cyrillic ``і``), oldest first; the exact name first of all when it is taken."""
        exact = self.named(name, project)
        if exact:
            return exact
        target = skeleton(name)
        names = self.session.execute(select(Run.id, Run.name).where(Run.project == project))
        ids = [rid for rid, other in names if skeleton(other) == target]
        if not ids:
            return []
        return list(self.session.scalars(select(Run).where(Run.id.in_(ids)).order_by(Run.created_at, Run.id)))

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
        marked = self.session.execute(
            select(RunFile.run_id, RunFile.step, RunFile.rank)
            .where(RunFile.run_id.in_(run_ids), RunFile.path.like(f"step%/rank%/{INCOMPLETE_FILE}"))
        )  # fmt: skip
        for run_id, step, rank in marked:
            if step is not None and rank is not None:
                stats[run_id].incomplete.add((int(step), int(rank)))
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
        JobRepository(self.session).delete_for("rank", cids)
        JobRepository(self.session).delete_for("validate", [run_id])
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
        JobRepository(self.session).delete_for("rank", [comparison_id])
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


def contains_text(column: ColumnElement[str], needle: str) -> ColumnElement[bool]:
    """``needle`` anywhere in ``column``, ignoring case, with ``%``, ``_`` and ``\\`` taken literally.

    ``ILIKE`` on PostgreSQL and ``lower() LIKE lower()`` on SQLite, so both backends answer alike (a plain
    ``LIKE`` ignores ASCII case on SQLite only).
    """
    escaped = needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return column.ilike(f"%{escaped}%", escape="\\")
