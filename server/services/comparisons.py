"""Comparisons: queue a job, read its state and summary, page its rows, hand out its reports."""

from __future__ import annotations

import functools
import json
import logging
import math
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from pathlib import PurePosixPath
from typing import Any

import anyio.to_thread
from cachetools import LRUCache
from parity.server.db import Database
from parity.server.errors import BadRequest, Conflict, NotFound, Unprocessable
from parity.server.job_repository import JobRepository
from parity.server.jobs.base import JobQueue
from parity.server.models import Comparison, ComparisonRow, Job, RunFile, utcnow
from parity.server.repositories import (
    ComparisonRepository,
    RunRepository,
    contains_text,
    serialize_on,
)
from parity.server.schemas import (
    ComparisonCreate,
    ComparisonOptions,
    ComparisonPublic,
    ComparisonsPublic,
    ComparisonSummary,
    RankTaskPublic,
    ReplayVerdictsPublic,
)
from parity.server.services.runs import resolve_run
from parity.server.store import BlobStore, comparison_key
from parity.shared.compare.job import ComparePlan, RankPlan, merge_summary, plan_rank_sets
from parity.shared.compare.result import RowStatus
from parity.shared.dump.layout import DUMP_JSON, rank_dir_name, step_dir_name
from sqlalchemy import case, false, func, select, tuple_
from sqlalchemy.orm import Session

logger = logging.getLogger(__name__)

#: Rows a read may step over and still run on the event loop (a few milliseconds of SQLite at most).
INLINE_SCAN_ROWS = 10_000

REPORT_FILES = {"report.xlsx": "report.xlsx", "advisor.txt": "advisor.txt"}


def comparison_public(c: Comparison, tasks: list[Job] | None = None) -> ComparisonPublic:
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
        summary=summary_public(c.summary) if c.summary else None,
        tasks=[RankTaskPublic(
            rank=t.rank, slice=t.slice, slices=t.slices, status=t.status,  # type: ignore[arg-type]
            progress=t.progress, attempt=t.attempt,
            error=t.error, rows=t.rows, started_at=t.started_at, finished_at=t.finished_at,
        ) for t in tasks],
        against_baseline=bool(c.against_baseline),
    )  # fmt: skip


def summary_public(doc: dict[str, Any]) -> ComparisonSummary:
    """The REST body's summary: the headline fields of the stored summary document (``merge_summary``'s,
    served whole as ``summary.json``), its ``compared_ranks`` as ``ranks``."""
    if "kind" not in doc:  # stored before the comparison kept the pipeline's document: the body itself
        return ComparisonSummary(**doc)
    return ComparisonSummary(**{**doc, "ranks": doc["compared_ranks"], "mode": doc["mode"] or "none"})


def rank_dumps(session: Session, run_id: str, step: int) -> dict[int | None, bool]:
    """The ranks of a run's step, each with whether its dump.json was uploaded: the rank planner's input."""
    step_dir = step_dir_name(step)
    ranks: dict[int | None, bool] = {}
    for rank, path in session.execute(
        select(RunFile.rank, RunFile.path).where(RunFile.run_id == run_id, RunFile.step == step,
                                                 RunFile.rank.is_not(None))
    ):  # fmt: skip
        with_dump = path == f"{step_dir}/{rank_dir_name(rank)}/{DUMP_JSON}"
        ranks[int(rank)] = ranks.get(int(rank), False) or with_dump
    return ranks


def plan_comparison(session: Session, target_id: str, bench_id: str, step: int,
                    asked: Sequence[int] | None) -> RankPlan:  # fmt: skip
    """The CLI's rank planner over the two runs' step (narrowed to the ``asked`` ranks when given): the same
    answer when a comparison is queued and when its summary is merged, the runs being complete."""
    target, bench = rank_dumps(session, target_id, step), rank_dumps(session, bench_id, step)
    if asked is not None:
        target = {r: has for r, has in target.items() if r in asked}
        bench = {r: has for r, has in bench.items() if r in asked}
    return plan_rank_sets(target, bench, npu_side=f"target run {target_id}",
                          bench_side=f"bench run {bench_id}")  # fmt: skip


def comparison_summary(session: Session, c: Comparison, rank_docs: Sequence[dict[str, Any]], *,
                       skipped: Sequence[int] = ()) -> dict[str, Any]:  # fmt: skip
    """What the comparison stores and serves once its ranks are done: ``merge_summary`` over the ranks' own
    documents and the rank plan, each side named ``target run {id}: step{N}`` and each rank's dumps under it
    (``target run {id}: step{N}/rank{R}/dump.json``), never the worker's staging folder, and each rank's
    ``files`` by the names the server serves them under. ``skipped``: ranks a task found without a dump.json
    after all."""
    from parity.shared.report.summary import json_safe

    step = c.step if c.step is not None else 0
    plan = plan_comparison(session, c.target_run_id, c.bench_run_id, step, c.ranks)
    npu_path = f"target run {c.target_run_id}: {step_dir_name(step)}"
    bench_path = f"bench run {c.bench_run_id}: {step_dir_name(step)}"
    if skipped:
        late = set(skipped)
        plan = RankPlan([r for r in plan.compared if r not in late], plan.npu_only, plan.bench_only,
                        sorted({*plan.skipped, *late}, key=lambda r: -1 if r is None else r))  # fmt: skip
    docs = [_served_files(_relabel(doc, npu_path, bench_path), c.id) for doc in rank_docs]
    doc: dict[str, Any] = json_safe(merge_summary(ComparePlan.of_ranks(plan, npu_path, bench_path), docs))
    return doc


def _relabel(doc: dict[str, Any], npu_path: str, bench_path: str) -> dict[str, Any]:
    """A rank's document with the worker's folders of its dumps replaced by the runs' names for them."""
    rank = rank_dir_name(int(doc["rank"]))
    renames = [(str(PurePosixPath(doc[key]).parent), f"{side}/{rank}")
               for key, side in (("npu_path", npu_path), ("bench_path", bench_path)) if doc.get(key)]

    def relabel(value: Any) -> Any:
        if isinstance(value, str):
            for old, new in renames:
                value = value.replace(old, new)
            return value
        if isinstance(value, dict):
            return {k: relabel(v) for k, v in value.items()}
        if isinstance(value, list):
            return [relabel(v) for v in value]
        return value

    relabelled: dict[str, Any] = relabel(doc)
    return relabelled


#: Every row status, as the ``status`` column and the ``Parity Status`` cell write it.
ROW_STATUSES = frozenset(s.value for s in RowStatus)
#: What ``failing=true`` asks for: the rows an xlsx reader sees red or yellow, and NPU rows with no bench row.
FAILING_ROW_STATUSES = frozenset({RowStatus.FAIL.value, RowStatus.WARNING.value, RowStatus.UNMATCHED.value})


@dataclass(frozen=True)
class RowFilter:
    """Which rows a page holds (beside its rank): ``statuses`` None for any, ``name`` a substring of the
    NPU (else bench) name, ignoring case. Hashable: it keys the cached counts."""

    statuses: frozenset[str] | None = None
    name: str | None = None

    @classmethod
    def parse(cls, *, failing: bool | None, status: Sequence[str], name: str | None) -> RowFilter:
        """From the query: ``status`` values may be repeated or comma-separated (``status=fail,warning``);
        ``failing`` true keeps the failing statuses, false the others; given both, a row must pass both."""
        statuses: frozenset[str] | None = None
        asked = {part.strip() for value in status for part in value.split(",") if part.strip()}
        if asked:
            unknown = sorted(asked - ROW_STATUSES)
            if unknown:
                raise BadRequest(f"query status={','.join(unknown)}: not a row status "
                                 f"(one of {', '.join(sorted(ROW_STATUSES))})")  # fmt: skip
            statuses = frozenset(asked)
        if failing is not None:
            wanted = FAILING_ROW_STATUSES if failing else ROW_STATUSES - FAILING_ROW_STATUSES
            statuses = wanted if statuses is None else statuses & wanted
        return cls(statuses, name or None)


class _Finished:
    """What never changes once a comparison succeeded: kept in memory for the hot rows endpoint."""

    def __init__(self, headers: dict[str, list[str]]) -> None:
        self.headers = headers
        self.header_json = {rank: json.dumps(h) for rank, h in headers.items()}
        self.rank_counts: list[tuple[int, int]] | None = None  # (rank, rows) in rank order
        # Rows per (rank, status), counted at the first status filter: then every status count is a sum.
        self.status_counts: dict[tuple[int, str], int] | None = None
        self.name_counts: LRUCache[tuple[RowFilter, int | None], int] = LRUCache(maxsize=512)

    def count(self, rows: RowFilter, rank: int | None) -> int | None:
        """The rows matching ``rows`` and ``rank``, when known without asking the database."""
        if rows.name:
            return self.name_counts.get((rows, rank))
        if rows.statuses is None:
            if self.rank_counts is None:
                return None
            return sum(n for r, n in self.rank_counts if rank is None or r == rank)
        if self.status_counts is None:
            return None
        wanted = rows.statuses
        return sum(n for (r, status), n in self.status_counts.items()
                   if (rank is None or r == rank) and status in wanted)  # fmt: skip


def _seek(rank_counts: list[tuple[int, int]], offset: int) -> tuple[int, int] | None:
    """The (rank, index) of the ``offset``-th row in (rank, index) order; indexes run 0..n-1 per rank."""
    for rank, count in rank_counts:
        if offset < count:
            return rank, offset
        offset -= count
    return None


class ComparisonService:
    def __init__(self, db: Database, store: BlobStore, queue: JobQueue, *, task_max_bytes: int = 2 * 1024**3
                 ) -> None:  # fmt: skip
        self.db = db
        self.store = store
        self.queue = queue
        self.task_max_bytes = task_max_bytes  # PARITY_TASK_MAX_BYTES: past it, a rank is split in slices
        self._finished: LRUCache[str, _Finished] = LRUCache(maxsize=256)
        self._lock = threading.Lock()  # the caches (cachetools' are not thread-safe) and their states' counts
        self._count_lock = threading.Lock()

    def create(self, body: ComparisonCreate) -> ComparisonPublic:
        """Queue the comparison ``body`` asks for, unless it exists already.

        Runs are named by id or name (``body.project`` narrows the names). The same request again (same
        runs, step, ranks and options) does not queue a copy: a comparison that is queued, running or
        succeeded is returned as it is, and one that failed is queued again, under the same id, as a retry.
        """
        with self.db.read() as session:
            runs = RunRepository(session)
            step_ranks = {}
            run_ids = {}
            found = {}
            for field, ref in (("target_run", body.target_run), ("bench_run", body.bench_run)):
                run = resolve_run(runs, ref, project=body.project, field=field)
                if run.status != "complete":
                    raise Conflict(f"{field}: run {run.id} ({run.name}) is {run.status}, not complete")
                step_ranks[field] = runs.step_ranks(run.id)
                run_ids[field] = run.id
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
        target_id, bench_id = run_ids["target_run"], run_ids["bench_run"]
        with self.db.read() as session:
            plan = plan_comparison(session, target_id, bench_id, step, body.ranks)
        ranks = [r for r in plan.compared if r is not None]  # a run stores an unnumbered rank as rank 0
        if not ranks:
            wanted = sorted(set(body.ranks) if body.ranks is not None else target[step])
            why = (f"no rank has a dump.json in both runs (skipped: {plan.skipped})" if plan.skipped
                   else "no rank is present in both runs")  # fmt: skip
            raise Unprocessable(f"step {step}: {why} (target has {wanted}, bench has {sorted(bench[step])})")
        asked_ranks = sorted(set(body.ranks)) if body.ranks is not None else None
        options = body.options.model_dump()
        slices = self._slices(target_id, bench_id, step, ranks)
        now = utcnow()
        with self.db.write() as session:
            # The same request twice at once makes one comparison: the second waits here, then finds it.
            serialize_on(session, f"comparison\0{target_id}\0{bench_id}\0{step}")
            repo = ComparisonRepository(session)
            existing = repo.same_request(target_id, bench_id, step, asked_ranks, options)
            if existing is None:
                comparison = Comparison(
                    id=uuid.uuid4().hex, target_run_id=target_id, bench_run_id=bench_id, step=step,
                    ranks=asked_ranks, options=options, status="queued", progress=0.0, created_at=now,
                    against_baseline=against_baseline,
                )  # fmt: skip
                session.add(comparison)
                session.flush()
                # One job per rank pair (per slice of a rank past task_max_bytes): the workers compare
                # ranks side by side, and each is stored, retried and taken over on its own.
                tasks = JobRepository(session).add_rank_jobs(comparison.id, slices, now)
        if existing is not None:
            if existing.status == "failed":
                logger.info("comparison %s asked for again after it failed: its failed ranks are retried",
                            existing.id)  # fmt: skip
                try:
                    return self.retry(existing.id)
                except Conflict:  # retried meanwhile by a concurrent ask
                    return self.get(existing.id)
            logger.info("comparison %s asked for again: it is %s", existing.id, existing.status)
            return self.get(existing.id)
        # Enqueued only after the commit, so a worker always finds the row it is given.
        for t in tasks:
            self.queue.submit(t.id)
        logger.info("comparison %s queued (%s vs %s, step %s, %d rank(s), %d task(s))", comparison.id,
                    target_id, bench_id, step, len(ranks), len(tasks))  # fmt: skip
        return comparison_public(comparison, tasks)

    def _slices(self, target_id: str, bench_id: str, step: int, ranks: Sequence[int]) -> dict[int, int]:
        """How many tasks each rank pair gets: ceil(its files' bytes / task_max_bytes), at least one.

        Counted at plan time from the stored sizes: both runs' files of the rank (dump.json, stack.json and
        the tensor files; in statistics and md5 modes the dump.json's bytes stand for its entries)."""
        with self.db.read() as session:
            sizes = RunRepository(session).rank_bytes((target_id, bench_id), step, ranks)
        return {rank: max(1, math.ceil(sizes.get(rank, 0) / self.task_max_bytes)) for rank in ranks}

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
            jobs = JobRepository(session)
            tasks = jobs.for_comparison(comparison_id)
            again = [t for t in tasks if t.status == "failed"]
            if not again:
                raise Conflict(f"comparison {comparison_id} has no failed rank to retry")
            jobs.requeue(again, utcnow())
            c.status, c.error, c.finished_at, c.summary, c.headers = "running", None, None, None, None
            keys = [(t.id, f"rank {t.rank}{f' slice {t.slice}' if t.slice else ''}") for t in again]
            public = comparison_public(c, tasks)
        with self._lock:
            self._finished.pop(comparison_id, None)
        for job_id, _ in keys:
            self.queue.submit(job_id)
        logger.info("comparison %s: task(s) %s queued again", comparison_id, ", ".join(k for _, k in keys))
        return public

    def cancel(self, comparison_id: str) -> ComparisonPublic:
        """Stop a queued or running comparison: its unfinished ranks fail as cancelled (a running one stops
        within a second or two, ``jobs.lease``), the finished ones keep their rows; ``retry`` runs the
        cancelled ranks again."""
        with self.db.write() as session:
            c = session.get(Comparison, comparison_id, with_for_update=True)
            if c is None:
                raise NotFound(f"comparison {comparison_id!r} not found")
            if c.status not in ("queued", "running"):
                raise Conflict(f"comparison {comparison_id} is {c.status}; only a queued or running one is "
                               "cancelled")  # fmt: skip
            now = utcnow()
            JobRepository(session).cancel("rank", comparison_id, "cancelled", now)
            c.status, c.error, c.finished_at, c.summary, c.headers = "failed", "cancelled", now, None, None
            public = comparison_public(c, JobRepository(session).for_comparison(comparison_id))
        logger.info("comparison %s cancelled", comparison_id)
        return public

    def _require(self, session: Any, comparison_id: str) -> Comparison:
        c = ComparisonRepository(session).get(comparison_id)
        if c is None:
            raise NotFound(f"comparison {comparison_id!r} not found")
        return c

    def get(self, comparison_id: str) -> ComparisonPublic:
        with self.db.read() as session:
            c = self._require(session, comparison_id)
            return comparison_public(c, JobRepository(session).for_comparison(comparison_id))

    def search(
        self, *, run: str | None, project: str | None, status: str | None, limit: int, offset: int
    ) -> ComparisonsPublic:
        """A page of comparisons; ``run`` is a run id or name (within ``project`` when given)."""
        with self.db.read() as session:
            if run is not None:
                run = resolve_run(RunRepository(session), run, project=project, field="run").id
            repo = ComparisonRepository(session)
            items, total = repo.page(repo.filtered(run=run, project=project, status=status), limit, offset)
            tasks = JobRepository(session).for_comparisons([c.id for c in items])
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
                return state
        with self.db.read() as session:
            c = self._require(session, comparison_id)
            if c.status != "succeeded":
                raise Conflict(f"comparison {comparison_id} is {c.status}; rows exist once it succeeded")
            state = _Finished(dict(c.headers or {}))
        with self._lock:
            self._finished[comparison_id] = state
        return state

    async def rows_json_async(
        self, comparison_id: str, rows: RowFilter, *, rank: int | None, limit: int, offset: int,
        sort: str = "index",
    ) -> bytes:
        """``rows_json`` from the event loop: inline when it is a short read of a comparison whose state and
        count are cached (under a millisecond: cheaper than the hop to a worker thread, and the hop is what
        makes the latency tail under many clients), in a worker thread otherwise (a first count, a long scan,
        a network round trip to PostgreSQL)."""
        read = functools.partial(self.rows_json, comparison_id, rows, rank=rank, limit=limit, offset=offset,
                                 sort=sort)  # fmt: skip
        if self.db.dialect == "sqlite" and sort == "index" and self._is_short_read(
            comparison_id, rows, rank, limit, offset
        ):
            return read()
        return await anyio.to_thread.run_sync(read)

    def _is_short_read(self, comparison_id: str, rows: RowFilter, rank: int | None, limit: int,
                       offset: int) -> bool:  # fmt: skip
        with self._lock:
            state = self._finished.get(comparison_id)
            count = state.count(rows, rank) if state is not None else None
            total = sum(n for _, n in state.rank_counts) if state is not None and state.rank_counts else None
        if count is None:
            return False
        if rows.name or rows.statuses is not None:
            # A filter scans rows until it has offset + limit matches: about (offset + limit) * rows /
            # matches of them, which must stay small to run on the event loop.
            return total is not None and (offset + limit) * total <= INLINE_SCAN_ROWS * max(count, 1)
        return True

    def rows_json(
        self, comparison_id: str, rows: RowFilter, *, rank: int | None, limit: int, offset: int,
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
        if rows.statuses is not None:
            where.append(t.status.in_(sorted(rows.statuses)))
        if rank is not None:
            where.append(t.rank == rank)
        if rows.name:
            where.append(contains_text(t.name, rows.name))
        columns = (t.index, t.rank, t.api, t.status, t.highlight, t.score, t.cells)
        with self.db.read_engine.connect() as conn:
            # Each count is made once per comparison (rows per rank; per rank and status at the first status
            # filter; per substring filter), one at a time: 32 clients arriving together would otherwise all
            # scan the same 100,000 rows at once.
            if state.rank_counts is None:
                with self._count_lock:
                    if state.rank_counts is None:
                        per_rank = conn.execute(
                            select(t.rank, func.count()).where(t.comparison_id == comparison_id)
                            .group_by(t.rank).order_by(t.rank)
                        ).all()  # fmt: skip
                        state.rank_counts = [(int(r), int(n)) for r, n in per_rank]
            if rows.statuses is not None and state.status_counts is None:
                with self._count_lock:
                    if state.status_counts is None:
                        state.status_counts = self._count_statuses(conn, comparison_id)
            with self._lock:
                total = state.count(rows, rank)
            if total is None:  # a substring filter
                key = (rows, rank)
                with self._count_lock:
                    with self._lock:
                        total = state.name_counts.get(key)
                    if total is None:
                        total = int(conn.execute(select(func.count()).where(*where)).scalar_one())
                        with self._lock:
                            state.name_counts[key] = total
            order = (t.rank, t.index) if sort != "score" else (t.score.desc().nulls_last(), t.rank, t.index)
            stmt = select(*columns).where(*where).order_by(*order).limit(limit)
            if rows.statuses is None and not rows.name and sort != "score":
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
        data = ",".join(
            f'{{"index":{i},"rank":{r},"api":{quote(api)},"status":{quote(status)},'
            f'"highlight":{quote(hl) if hl is not None else "null"},'
            f'"score":{repr(score) if score is not None else "null"},"cells":{cells}}}'
            for i, r, api, status, hl, score, cells in result
        )
        header_rank = str(rank) if rank is not None else min(state.headers, key=int, default=None)
        header = state.header_json.get(header_rank, "[]") if header_rank is not None else "[]"
        return f'{{"header":{header},"data":[{data}],"count":{total}}}'.encode()

    @staticmethod
    def _count_statuses(conn: Any, comparison_id: str) -> dict[tuple[int, str], int]:
        """Rows per (rank, status) in one pass in primary-key order: a sum per status beside a GROUP BY rank
        (a GROUP BY rank, status sorts every row, about twice as slow on 100,000 rows of SQLite)."""
        t = ComparisonRow.__table__.c
        statuses = sorted(ROW_STATUSES)
        per_rank = conn.execute(
            select(t.rank, *(func.sum(case((t.status == s, 1), else_=0)) for s in statuses))
            .where(t.comparison_id == comparison_id).group_by(t.rank)
        ).all()  # fmt: skip
        return {(int(rank), status): int(n or 0)
                for rank, *sums in per_rank for status, n in zip(statuses, sums, strict=True)}  # fmt: skip

    def replay(self, comparison_id: str, *, rank: int | None = None, entry: str | None = None
               ) -> ReplayVerdictsPublic:  # fmt: skip
        """The float64 replay verdicts stored with a succeeded comparison (its top suspects and first
        divergence, each side against its own inputs), narrowed to one rank or entry."""
        c = self.get(comparison_id)
        if c.status != "succeeded" or c.summary is None:
            why = "replay verdicts exist once it succeeded"
            raise Conflict(f"comparison {comparison_id} is {c.status}; {why}")
        data = [v for v in c.summary.replay
                if rank in (None, v.compare_rank) and entry in (None, v.entry)]  # fmt: skip
        return ReplayVerdictsPublic(data=data, count=len(data), notes=c.summary.replay_notes)

    # -- reports ----------------------------------------------------------------------------------------
    def summary_document(self, comparison_id: str) -> dict[str, Any]:
        """The comparison's summary document: the one it stored when its last rank finished,
        ``merge_summary``'s, as ``parity compare`` writes it for two step directories."""
        with self.db.read() as session:
            c = self._require(session, comparison_id)
            if c.status != "succeeded":
                raise Conflict(f"comparison {comparison_id} is {c.status}; a summary exists once it succeeds")
            doc = dict(c.summary or {})
            if "kind" not in doc:  # stored before the comparison kept the pipeline's document
                tasks = JobRepository(session).for_comparison(comparison_id)
                # a sliced rank's result is on the slice that joined the others; the others hold no summary
                docs = [t.summary for t in tasks if t.status == "succeeded" and t.summary is not None]
                skipped = sorted({t.rank for t in tasks if t.status == "skipped"})
                doc = comparison_summary(session, c, docs, skipped=skipped)
        return doc

    def summary_file(self, comparison_id: str) -> tuple[str, Iterator[bytes]]:
        """(download name, bytes) of the comparison's summary JSON (:meth:`summary_document`)."""
        doc = self.summary_document(comparison_id)
        text = json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n"
        return f"compare_summary_{comparison_id[:8]}.json", iter([text.encode()])

    def delete(self, comparison_id: str) -> None:
        """Delete a comparison, its rows and its reports (its runs stay). A job still running finds it gone
        and drops its result."""
        with self.db.write() as session:
            c = ComparisonRepository(session).get(comparison_id, for_update=True)
            if c is None:
                raise NotFound(f"comparison {comparison_id!r} not found")
            ComparisonRepository(session).delete(comparison_id)
        self.forget([comparison_id])
        logger.info("comparison %s deleted", comparison_id)

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
        return report_name(comparison_id, file_name, rank), self.store.iter_bytes(key)


def report_name(comparison_id: str, file_name: str, rank: int) -> str:
    """The name a rank's report is downloaded under (``report_1a2b3c4d_rank0.xlsx``)."""
    stem, ext = file_name.rsplit(".", 1)
    return f"{stem}_{comparison_id[:8]}_rank{rank}.{ext}"


def _served_files(doc: dict[str, Any], comparison_id: str) -> dict[str, Any]:
    """A rank's document with its ``files`` named as the server serves them (``report_{id}_rank{R}.xlsx``),
    not as the worker wrote them."""
    rank = int(doc.get("rank") or 0)
    stored = doc.get("files") or {}
    files = {kind: report_name(comparison_id, served, rank) if stored.get(kind) else None
             for kind, served in (("xlsx", "report.xlsx"), ("advisor", "advisor.txt"))}  # fmt: skip
    return {**doc, "files": files}
