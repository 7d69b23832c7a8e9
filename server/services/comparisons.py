"""Comparisons: queue a job, read its state and summary, page its rows, hand out its reports."""

from __future__ import annotations

import functools
import json
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

import anyio.to_thread
from parity.server.db import Database
from parity.server.errors import BadRequest, Conflict, NotFound, Unprocessable
from parity.server.jobs.base import JobQueue
from parity.server.models import Comparison, ComparisonRow, ComparisonTask, utcnow
from parity.server.repositories import ComparisonRepository, RunRepository, TaskRepository, task_id
from parity.server.schemas import (
    ComparisonCreate,
    ComparisonOptions,
    ComparisonPublic,
    ComparisonsPublic,
    ComparisonSummary,
    RankTaskPublic,
)
from parity.server.store import BlobStore, comparison_key
from sqlalchemy import false, func, select, tuple_

logger = logging.getLogger(__name__)

#: Rows a read may step over and still run on the event loop (a few milliseconds of SQLite at most).
INLINE_SCAN_ROWS = 10_000

REPORT_FILES = {"report.xlsx": "report.xlsx", "advisor.txt": "advisor.txt"}


def comparison_public(c: Comparison, tasks: list[ComparisonTask] | None = None) -> ComparisonPublic:
    tasks = tasks or []
    progress = c.progress
    if tasks and c.status in ("queued", "running"):
        progress = sum(1.0 if t.status in ("succeeded", "failed", "skipped") else t.progress for t in tasks)
        progress /= len(tasks)
    return ComparisonPublic(
        id=c.id, status=c.status, error=c.error, progress=progress,  # type: ignore[arg-type]
        target_run=c.target_run_id, bench_run=c.bench_run_id, step=c.step, ranks=c.ranks,
        options=ComparisonOptions(**(c.options or {})), created_at=c.created_at, started_at=c.started_at,
        finished_at=c.finished_at,
        summary=ComparisonSummary(**c.summary) if c.summary else None,
        tasks=[RankTaskPublic(
            rank=t.rank, status=t.status, progress=t.progress, attempt=t.attempt,  # type: ignore[arg-type]
            error=t.error, rows=t.rows, started_at=t.started_at, finished_at=t.finished_at,
        ) for t in tasks],
        against_baseline=bool(c.against_baseline),
    )  # fmt: skip


class _Finished:
    """What never changes once a comparison succeeded: kept in memory for the hot rows endpoint."""

    def __init__(self, headers: dict[str, list[str]]) -> None:
        self.headers = headers
        self.header_json = {rank: json.dumps(h) for rank, h in headers.items()}
        self.counts: OrderedDict[tuple[Any, ...], int] = OrderedDict()
        self.rank_counts: list[tuple[int, int]] | None = None  # (rank, rows) in rank order


def _seek(rank_counts: list[tuple[int, int]], offset: int) -> tuple[int, int] | None:
    """The (rank, index) of the ``offset``-th row in (rank, index) order; indexes run 0..n-1 per rank."""
    for rank, count in rank_counts:
        if offset < count:
            return rank, offset
        offset -= count
    return None


class ComparisonService:
    def __init__(self, db: Database, store: BlobStore, queue: JobQueue) -> None:
        self.db = db
        self.store = store
        self.queue = queue
        self._finished: OrderedDict[str, _Finished] = OrderedDict()
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()

    def create(self, body: ComparisonCreate) -> ComparisonPublic:
        with self.db.read() as session:
            runs = RunRepository(session)
            step_ranks = {}
            found = {}
            for field, run_id in (("target_run", body.target_run), ("bench_run", body.bench_run)):
                run = runs.get(run_id)
                if run is None:
                    raise NotFound(f"{field}: run {run_id!r} not found")
                if run.status != "complete":
                    raise Conflict(f"{field}: run {run_id} is {run.status}, not complete")
                step_ranks[field] = runs.step_ranks(run_id)
                found[field] = run
            # Judged once, when queued: the project may name another baseline later.
            against_baseline = bool(found["bench_run"].baseline) and \
                found["bench_run"].project == found["target_run"].project  # fmt: skip
        target, bench = step_ranks["target_run"], step_ranks["bench_run"]
        common = sorted(set(target) & set(bench))
        if body.step is None:
            if not common:
                raise Unprocessable(
                    f"no step in both runs (target has {sorted(target)}, bench has {sorted(bench)})"
                )
            step = common[0]
        else:
            step = body.step
            if step not in common:
                raise Unprocessable(f"step: {step} is not in both runs (common steps: {common})")
        if body.ranks is not None:
            missing = sorted(set(body.ranks) - target[step])
            if not body.ranks or missing:
                raise Unprocessable(
                    f"ranks: {missing or body.ranks} not in step {step} of the target run "
                    f"(it has {sorted(target[step])})"
                )
        wanted = set(body.ranks) if body.ranks is not None else target[step]
        ranks = sorted(wanted & bench[step])
        if not ranks:
            raise Unprocessable(
                f"step {step}: no rank is present in both runs (target has {sorted(wanted)}, "
                f"bench has {sorted(bench[step])})"
            )
        now = utcnow()
        comparison = Comparison(
            id=uuid.uuid4().hex, target_run_id=body.target_run, bench_run_id=body.bench_run, step=step,
            ranks=sorted(set(body.ranks)) if body.ranks is not None else None,
            options=body.options.model_dump(), status="queued", progress=0.0, created_at=now, attempt=0,
            against_baseline=against_baseline,
        )  # fmt: skip
        # One task per rank pair: the workers compare ranks side by side, and each rank is stored, retried
        # and taken over on its own.
        tasks = [
            ComparisonTask(comparison_id=comparison.id, rank=rank, status="queued", attempt=0, progress=0.0,
                           queued_at=now)
            for rank in ranks
        ]  # fmt: skip
        with self.db.write() as session:
            session.add(comparison)
            session.flush()
            session.add_all(tasks)
        # Enqueued only after the commit, so a worker always finds the row it is given.
        for rank in ranks:
            self.queue.submit(task_id(comparison.id, rank))
        logger.info("comparison %s queued (%s vs %s, step %s, %d rank(s))", comparison.id, body.target_run,
                    body.bench_run, step, len(ranks))  # fmt: skip
        return comparison_public(comparison, tasks)

    def retry(self, comparison_id: str) -> ComparisonPublic:
        """Queue the failed ranks of a failed comparison again, and only those: the others keep their rows."""
        with self.db.write() as session:
            c = session.get(Comparison, comparison_id, with_for_update=True)
            if c is None:
                raise NotFound(f"comparison {comparison_id!r} not found")
            if c.status != "failed":
                raise Conflict(
                    f"comparison {comparison_id} is {c.status}; only a failed comparison is retried"
                )
            tasks = TaskRepository(session).for_comparison(comparison_id)
            again = [t for t in tasks if t.status == "failed"]
            if not again:
                raise Conflict(f"comparison {comparison_id} has no failed rank to retry")
            now = utcnow()
            for t in again:
                t.status, t.error, t.progress, t.queued_at, t.finished_at = "queued", None, 0.0, now, None
                t.lease_expires_at, t.worker = None, None
            c.status, c.error, c.finished_at, c.summary, c.headers = "running", None, None, None, None
            ranks = [t.rank for t in again]
            public = comparison_public(c, tasks)
        with self._lock:
            self._finished.pop(comparison_id, None)
        for rank in ranks:
            self.queue.submit(task_id(comparison_id, rank))
        logger.info("comparison %s: rank(s) %s queued again", comparison_id, ranks)
        return public

    def _require(self, session: Any, comparison_id: str) -> Comparison:
        c = ComparisonRepository(session).get(comparison_id)
        if c is None:
            raise NotFound(f"comparison {comparison_id!r} not found")
        return c

    def get(self, comparison_id: str) -> ComparisonPublic:
        with self.db.read() as session:
            c = self._require(session, comparison_id)
            return comparison_public(c, TaskRepository(session).for_comparison(comparison_id))

    def search(
        self, *, run: str | None, project: str | None, status: str | None, limit: int, offset: int
    ) -> ComparisonsPublic:
        with self.db.read() as session:
            repo = ComparisonRepository(session)
            items, total = repo.page(repo.filtered(run=run, project=project, status=status), limit, offset)
            tasks = TaskRepository(session).for_comparisons([c.id for c in items])
            return ComparisonsPublic(data=[comparison_public(c, tasks.get(c.id)) for c in items], count=total)

    def forget(self, comparison_ids: list[str]) -> None:
        """Drop cached state and report blobs of deleted comparisons."""
        with self._lock:
            for cid in comparison_ids:
                self._finished.pop(cid, None)
        for cid in comparison_ids:
            self.store.delete_prefix(comparison_key(cid))

    # -- rows -------------------------------------------------------------------------------------------
    def _finished_state(self, comparison_id: str) -> _Finished:
        with self._lock:
            state = self._finished.get(comparison_id)
            if state is not None:
                self._finished.move_to_end(comparison_id)
                return state
        with self.db.read() as session:
            c = self._require(session, comparison_id)
            if c.status != "succeeded":
                raise Conflict(f"comparison {comparison_id} is {c.status}; rows exist once it succeeded")
            state = _Finished(dict(c.headers or {}))
        with self._lock:
            self._finished[comparison_id] = state
            while len(self._finished) > 256:
                self._finished.popitem(last=False)
        return state

    async def rows_json_async(
        self,
        comparison_id: str,
        *,
        failing: bool | None,
        name: str | None,
        rank: int | None,
        limit: int,
        offset: int,
        status: str | None = None,
        sort: str = "index",
    ) -> bytes:
        """``rows_json`` from the event loop: inline when it is a short read of a comparison whose state and
        count are cached (under a millisecond: cheaper than the hop to a worker thread, and the hop is what
        makes the latency tail under many clients), in a worker thread otherwise (a first count, a long scan,
        a network round trip to PostgreSQL)."""
        read = functools.partial(
            self.rows_json, comparison_id, failing=failing, name=name, rank=rank, limit=limit, offset=offset,
            status=status, sort=sort,
        )  # fmt: skip
        if self.db.dialect == "sqlite" and sort == "index" and self._is_short_read(
            comparison_id, failing, name, rank, limit, offset, status
        ):
            return read()
        return await anyio.to_thread.run_sync(read)

    def _is_short_read(
        self,
        comparison_id: str,
        failing: bool | None,
        name: str | None,
        rank: int | None,
        limit: int,
        offset: int,
        status: str | None = None,
    ) -> bool:
        with self._lock:
            state = self._finished.get(comparison_id)
            count = state.counts.get((failing, name, rank, status)) if state is not None else None
            rows = sum(n for _, n in state.rank_counts) if state is not None and state.rank_counts else None
        if count is None:
            return False
        if name:
            # A substring filter scans rows until it has offset + limit matches: about
            # (offset + limit) * rows / matches of them, which must stay small to run on the event loop.
            return rows is not None and (offset + limit) * rows <= INLINE_SCAN_ROWS * max(count, 1)
        return (failing is None and status is None) or offset <= INLINE_SCAN_ROWS

    def rows_json(
        self,
        comparison_id: str,
        *,
        failing: bool | None,
        name: str | None,
        rank: int | None,
        limit: int,
        offset: int,
        status: str | None = None,
        sort: str = "index",
    ) -> bytes:
        """The rows page as JSON bytes, assembled from the stored cell text without decoding it.

        ``sort="score"``: the rows of the calls the localization scored highest first (NULL scores last),
        table order within a score."""
        state = self._finished_state(comparison_id)
        if rank is not None and str(rank) not in state.headers:
            raise BadRequest(f"rank: {rank} is not in comparison {comparison_id} (ranks: "
                             f"{sorted(int(r) for r in state.headers)})")  # fmt: skip
        t = ComparisonRow.__table__.c
        where = [t.comparison_id == comparison_id]
        if failing is not None:
            where.append(t.failing == failing)
        if rank is not None:
            where.append(t.rank == rank)
        if status is not None:
            where.append(t.status == status)
        if name:
            escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            where.append(t.name.like(f"%{escaped}%", escape="\\"))
        key = (failing, name, rank, status)
        columns = (t.index, t.rank, t.api, t.status, t.highlight, t.score, t.cells)
        with self.db.read_engine.connect() as conn:
            with self._lock:
                total = state.counts.get(key)
            if total is None:
                # One cold count at a time: 32 clients arriving together would otherwise all scan the
                # same 100,000 rows at once (a substring count is a full scan of the comparison).
                with self._count_lock:
                    with self._lock:
                        total = state.counts.get(key)
                    if total is None:
                        total = int(conn.execute(select(func.count()).where(*where)).scalar_one())
                        with self._lock:
                            state.counts[key] = total
                            while len(state.counts) > 512:
                                state.counts.popitem(last=False)
            order = (t.rank, t.index) if sort != "score" else (t.score.desc().nulls_last(), t.rank, t.index)
            stmt = select(*columns).where(*where).order_by(*order).limit(limit)
            if state.rank_counts is None:
                with self._count_lock:
                    if state.rank_counts is None:
                        per_rank = conn.execute(
                            select(t.rank, func.count()).where(t.comparison_id == comparison_id)
                            .group_by(t.rank).order_by(t.rank)
                        ).all()  # fmt: skip
                        state.rank_counts = [(int(r), int(n)) for r, n in per_rank]
            if failing is None and status is None and not name and sort != "score":
                # Unfiltered pages seek through the primary key instead of stepping over ``offset`` rows:
                # row indexes are dense per rank, so an offset is a (rank, index) position.
                if rank is not None:
                    stmt = stmt.where(t.index >= offset)
                else:
                    start = _seek(state.rank_counts, offset)
                    stmt = stmt.where(tuple_(t.rank, t.index) >= start) if start else stmt.where(false())
            else:
                stmt = stmt.offset(offset)
            result = conn.execute(stmt).all()
        # json.encoder's C string quoting: a third of the cost of json.dumps for the per-row text fields.
        quote = encode_basestring_ascii
        rows = ",".join(
            f'{{"index":{i},"rank":{r},"api":{quote(api)},"status":{quote(status)},'
            f'"highlight":{quote(hl) if hl is not None else "null"},'
            f'"score":{repr(score) if score is not None else "null"},"cells":{cells}}}'
            for i, r, api, status, hl, score, cells in result
        )
        header_rank = str(rank) if rank is not None else min(state.headers, key=int, default=None)
        header = state.header_json.get(header_rank, "[]") if header_rank is not None else "[]"
        return f'{{"header":{header},"data":[{rows}],"count":{total}}}'.encode()

    # -- reports ----------------------------------------------------------------------------------------
    def report(self, comparison_id: str, file_name: str, rank: int | None) -> tuple[str, Iterator[bytes]]:
        """(download name, bytes) of one rank's report or advisor."""
        with self.db.read() as session:
            c = self._require(session, comparison_id)
            if c.status != "succeeded":
                raise Conflict(f"comparison {comparison_id} is {c.status}; reports exist once it succeeded")
            ranks = sorted(int(r) for r in (c.headers or {}))
        if rank is None:
            if len(ranks) != 1:
                raise BadRequest(
                    f"rank: comparison {comparison_id} has ranks {ranks}; choose one with ?rank=N"
                )
            rank = ranks[0]
        elif rank not in ranks:
            raise BadRequest(f"rank: {rank} is not in comparison {comparison_id} (ranks: {ranks})")
        key = comparison_key(comparison_id, f"rank{rank}/{file_name}")
        if not self.store.exists(key):
            raise NotFound(f"comparison {comparison_id}: rank {rank} has no {file_name}")
        stem, ext = file_name.rsplit(".", 1)
        return f"{stem}_{comparison_id[:8]}_rank{rank}.{ext}", self.store.iter_bytes(key)
