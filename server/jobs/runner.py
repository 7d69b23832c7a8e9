"""``TaskRunner.run(task_id)``: one rank of a comparison, the unit every job backend delivers.

A comparison fans out into one task per rank pair (``comparison_tasks``). A task is claimed (queued →
running, ``attempt`` + 1) under a lease that a background thread renews while it works; it lays out that
rank's files only (hard links into a file store, so nothing is copied; on S3 hard links into the worker's
bounded cache, ``blob_cache``, which streams in only the blobs the task names) in a staging folder of its
own, runs the shared pipeline's ``compare_rank`` on it, stores the
rank's xlsx and advisor, then, in one transaction guarded by its attempt, its rows and its summary document.
The staging folder is removed on success and on failure. The task that finds every other rank finished
merges the ranks' summaries into the comparison's (``merge_comparison``), under a lock on the comparison
row, so exactly one of several finishing at once does it. The workers of the job backends claim their next
task in that same transaction (``pull_next``).

A worker killed mid-rank leaves that task ``running``; once its lease has passed, the next delivery of the
task id (the broker's, the server's lease watcher's, or the local pool's, which requeues a dead child's task
at once) claims it again as attempt + 1. The other ranks are untouched, and a failed rank is run again
alone (``POST /comparisons/{id}/retry``). Any error is recorded on the task; nothing is raised.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from parity.server.blob_cache import Checkout, MissingBlob, worker_cache
from parity.server.db import Database
from parity.server.errors import ServiceError
from parity.server.jobs.lease import Lease, LeaseLost
from parity.server.jobs.limits import redact_paths
from parity.server.jobs.timeline import Timeline
from parity.server.models import (
    Comparison,
    ComparisonCall,
    ComparisonCounts,
    ComparisonRow,
    ComparisonTask,
    RunFile,
    utcnow,
)
from parity.server.repositories import RunRepository, TaskId, TaskRepository, parse_task_id, task_id
from parity.server.settings import Settings
from parity.server.store import BlobStore, FileStore, comparison_key, open_store, sidecar_key
from parity.shared.compare.result import FAILING_STATUSES, json_cells
from parity.shared.compare.slices import CallSlice
from parity.shared.dump.layout import DUMP_JSON, rank_dir_name, step_dir_name
from sqlalchemy import Table, delete, func, insert, select
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from parity.shared.compare.job import RankPair, RankReport
    from parity.shared.compare.options import CompareOptions

logger = logging.getLogger(__name__)

TENSOR_DIR = "dump_tensor_data"
#: How a finishing task locks its comparison row: ``FOR NO KEY UPDATE`` on PostgreSQL, which serialises the
#: finishers as ``FOR UPDATE`` did but not against the ``KEY SHARE`` lock that inserting a rank's rows
#: (foreign keys to the comparison) takes: with ``FOR UPDATE`` two ranks finishing at once each held that
#: share and waited for the other's (deadlock detected, seen with two workers on PostgreSQL). SQLite ignores
#: it.
COMPARISON_LOCK: dict[str, bool] = {"key_share": True}

ROW_BATCH = 5000
TOP_SUSPECTS = 10
TERMINAL = frozenset({"succeeded", "failed", "skipped"})
_FAILING = frozenset(status.value for status in FAILING_STATUSES)


class JobError(ServiceError):
    """A task cannot run (its files are missing from the store, the runs disagree)."""


def worker_name() -> str:
    """Who holds a task, as shown in the database: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def import_engine() -> None:
    """Import the compare engine ahead of the first task, while a worker waits for work (or, on Celery, in
    the parent its pool processes are forked from): otherwise each worker's first task pays for it (numba
    and the kernels, about a third of a second on a quiet core)."""
    import parity.shared.compare.engine  # noqa: F401
    import parity.shared.compare.job  # noqa: F401


class TaskRunner:
    """Runs rank tasks in this process; built once per worker process (a database pool, a store).

    With ``pull_next`` (the job backends' workers), the transaction that stores a rank also claims the
    oldest queued task, which the runner then runs at once: a worker's next task costs no write
    transaction of its own. On SQLite that claim had waited for the other worker's insert (its rows hold
    the one write lock ~0.1 s a rank): 0.7 s of each 16-rank comparison with two workers, a third of what
    two workers lost against twice one. On Celery the message of a task so taken finds it running and
    pulls the next queued task in its turn, or finds none and is done; a worker killed in a task it took
    so is recovered as any other, once its lease has passed.
    """

    def __init__(self, settings: Settings, worker: str | None = None, *, pull_next: bool = False) -> None:
        self.settings = settings
        self.worker = worker or worker_name()
        self.pull_next = pull_next
        self.db = Database.connect(settings.resolved_database_url)
        self.store = open_store(settings.resolved_store_url, settings.resolved_data_dir / "tmp")
        self.cache = worker_cache(settings, self.store)
        self._following: tuple[TaskId, int] | None = None  # claimed as the last task was stored

    def close(self) -> None:
        self.db.dispose()

    def run_next(self) -> bool:
        """Claim the oldest queued task and run it (the local pool's workers pull their work), and with
        ``pull_next`` each task it claims as it stores one; False when none is queued."""
        timeline = Timeline()
        lease_s = self.settings.job_lease_seconds
        with self.db.write() as session:
            claimed = TaskRepository(session).claim_next(utcnow(), lease_s, self.worker)
        if claimed is None:
            return False
        timeline.mark("claimed")
        self._run_claimed(claimed, timeline)
        return True

    def run(self, task: TaskId) -> bool:
        """Run task ``task`` to completion or record why it failed; never raises. False: not claimable (with
        ``pull_next``: nor any other task queued)."""
        timeline = Timeline()
        comparison_id, rank, slice_ = parse_task_id(task)
        attempt = None
        with self.db.read() as session:
            claimable = TaskRepository(session).claimable(comparison_id, rank, utcnow(), slice_)
        if claimable:  # the read may be stale; the claim decides
            with self.db.write() as session:
                attempt = TaskRepository(session).claim(
                    comparison_id, rank, utcnow(), self.settings.job_lease_seconds, self.worker, slice_
                )
        if attempt is None:
            logger.info("task %s is not claimable (finished, deleted, or running under a live lease)", task)
            # Often another worker took it as it stored its own last rank: pull what is left instead.
            return self.pull_next and self._queued() and self.run_next()
        timeline.mark("claimed")
        self._run_claimed((task, attempt), timeline)
        return True

    def _run_claimed(self, claimed: tuple[TaskId, int], timeline: Timeline) -> None:
        """Run a claimed task, then each one claimed as the one before was stored."""
        following: tuple[TaskId, int] | None = claimed
        while following is not None:
            comparison_id, rank, slice_ = parse_task_id(following[0])
            self._execute(comparison_id, rank, slice_, following[1], timeline)
            following, self._following = self._following, None
            timeline = Timeline()
            timeline.mark("claimed")  # in the transaction that stored the task before it

    def _queued(self) -> bool:
        """Whether any task is queued (a read: a message with nothing left to pull takes no write lock)."""
        with self.db.read() as session:
            return bool(TaskRepository(session).queued(limit=1))

    def _claim_following(self, session: Session) -> tuple[TaskId, int] | None:
        """In the transaction that stores a rank: claim the oldest queued task, unless a run's validation
        waits (a worker runs those first: a comparison may be waiting for it)."""
        from parity.server.jobs.validation import ValidationRepository

        if ValidationRepository(session).waiting(limit=1):
            return None
        return TaskRepository(session).claim_next(utcnow(), self.settings.job_lease_seconds, self.worker)

    def _execute(self, comparison_id: str, rank: int, slice_: int, attempt: int, timeline: Timeline) -> None:
        """Run a claimed attempt to its end: its result, or why it failed, recorded; never raises."""
        from parity.process_policy import collector_paused

        logger.info("comparison %s rank %d%s claimed: attempt %d", comparison_id, rank, _of(slice_), attempt)
        lease_s = self.settings.job_lease_seconds
        try:
            timeout = self.settings.job_timeout_seconds
            with (
                _task_lease(self.db, comparison_id, rank, attempt, lease_s, timeout, slice_) as lease,
                collector_paused(),
                self.cache.checkout() as blobs,  # what the task fetched: kept on success, dropped on failure
            ):
                self._run(comparison_id, rank, slice_, attempt, lease, blobs, timeline)
        except LeaseLost as exc:
            logger.warning("comparison %s rank %d: %s; this attempt stops", comparison_id, rank, exc)
        except Exception as exc:
            expected = isinstance(exc, ServiceError) or _is_parity_error(exc)
            message = str(exc) if expected else f"{type(exc).__name__}: {exc}"
            if not expected:  # a bug, not bad input: keep the traceback in the log
                logger.exception("comparison %s rank %d failed", comparison_id, rank)
            # The log keeps the full text; the task's error is read by every user of the API.
            message = redact_paths(message or type(exc).__name__, self.settings)
            finish_failed(self.db, comparison_id, rank, attempt, message, slice_=slice_)
        finally:
            timeline.log(task_id(comparison_id, rank, slice_), self.worker)

    def _run(self, comparison_id: str, rank: int, slice_: int, attempt: int, lease: Lease, blobs: Checkout,
             timeline: Timeline) -> None:  # fmt: skip
        with self.db.read() as session:
            c = session.get(Comparison, comparison_id)
            task = session.get(ComparisonTask, (comparison_id, rank, slice_))
            if c is None or task is None:
                raise LeaseLost("the comparison was deleted")
            part = CallSlice(slice_, task.slices) if task.slices > 1 else None
            runs = RunRepository(session)
            step = c.step if c.step is not None else 0
            target_files = runs.step_files(c.target_run_id, step, [rank])
            bench_files = runs.step_files(c.bench_run_id, step, [rank])
            target_id, bench_id, options = c.target_run_id, c.bench_run_id, dict(c.options or {})

        from parity.shared.compare.job import RankPair, compare_rank
        from parity.shared.compare.options import CompareOptions
        from parity.shared.dump.sidecar import read_dump

        engine_options = CompareOptions(
            fuzzy_match=bool(options.get("fuzzy_match", False)),
            stack_mode=bool(options.get("stack_mode", False)),
            mixed_tasks=True,  # a tensor run against a statistics baseline: compared in statistics mode
            # no executor: the backend runs one task per worker slot, so each computes its metrics itself
        )
        # A slice's own folder name (s0 too), so a takeover below never removes a sibling slice's folder.
        prefix = f"task-{comparison_id[:8]}-r{rank}-" + (f"s{slice_}-" if part is not None else "")
        if attempt > 1:
            # A worker killed mid-rank could not remove its staging folder: the attempt that takes the rank
            # over does (the stale attempt's result is dropped anyway), keeping the disk bounded.
            for stale in self._tmp_root().glob(f"{prefix}*"):
                shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=prefix, dir=self._tmp_root()))
        try:
            npu_dir, bench_dir, out_dir = staging / "npu", staging / "bench", staging / "out"
            if part is not None:  # a slice fetches the rank's tensor files its calls read, after its dumps
                target_tensors, target_files = _split_tensor_files(target_files)
                bench_tensors, bench_files = _split_tensor_files(bench_files)
            _stage(blobs, target_id, target_files, npu_dir, "target")
            _stage(blobs, bench_id, bench_files, bench_dir, "bench")
            timeline.mark("staged")
            npu_json, bench_json = (
                npu_dir / rank_dir_name(rank) / DUMP_JSON,
                bench_dir / rank_dir_name(rank) / DUMP_JSON,
            )
            missing = [
                side for side, path in (("target", npu_json), ("bench", bench_json)) if not path.is_file()
            ]
            if missing:
                finish_skipped(
                    self.db, comparison_id, rank, attempt, f"no dump.json in the {' and '.join(missing)} run",
                    slice_=slice_,
                )
                return
            out_dir.mkdir()
            pair = RankPair(rank, npu_json, bench_json)
            try:
                if part is None:
                    report = compare_rank(
                        pair,
                        engine_options,
                        xlsx_path=out_dir / "report.xlsx",
                        advisor_path=out_dir / "advisor.txt",
                        progress=lease.progress,
                        read_dump=read_dump,  # the columns parsed at complete, when there are some
                    )
                else:
                    slice_files = _SliceFiles(blobs, (target_id, target_tensors, npu_dir),
                                              (bench_id, bench_tensors, bench_dir))  # fmt: skip
                    joined = self._run_slice(comparison_id, pair, part, attempt, lease, engine_options,
                                             slice_files, out_dir)  # fmt: skip
                    if joined is None:
                        return  # another slice of the rank is still running: the last one joins them
                    report = joined
            except Exception as exc:
                if not _is_parity_error(exc):
                    raise
                # The engine names files by their staged paths; the client knows them by run and dump path.
                message = str(exc).replace(f"{npu_dir}/", f"target run {target_id}: {step_dir_name(step)}/")
                message = message.replace(f"{bench_dir}/", f"bench run {bench_id}: {step_dir_name(step)}/")
                raise JobError(message.replace(f"{staging}/", "")) from exc
            timeline.mark("compared")
            lease.check()
            self.store.put_file(report.xlsx, comparison_key(comparison_id, f"rank{rank}/report.xlsx"))
            assert report.advisor is not None
            self.store.put_file(report.advisor, comparison_key(comparison_id, f"rank{rank}/advisor.txt"))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        timeline.mark("reports")
        following: list[tuple[TaskId, int] | None] = []
        then = (lambda session: following.append(self._claim_following(session))) if self.pull_next else None
        stored = finish_succeeded(self.db, self.store, comparison_id, rank, attempt, report.result.rows,
                                  report.summary, list(report.result.header), scores=report.result.row_scores,
                                  slice_=slice_, timeline=timeline, before_write=lease.stop,
                                  then=then)  # fmt: skip
        if stored and following:  # committed: the task claimed with it is this worker's
            self._following = following[0]
        timeline.mark("stored")
        if stored and part is not None:  # the rank's rows are in: its slices' parts are spent
            for k in range(part.count):
                self.store.delete(_part_key(comparison_id, rank, k))

    def _run_slice(self, comparison_id: str, pair: RankPair, part: CallSlice, attempt: int, lease: Lease,
                   options: CompareOptions, files: _SliceFiles, out_dir: Path
                   ) -> RankReport | None:  # fmt: skip
        """One slice: fetch its calls' tensor files only, compare them, store the part in the store; the slice
        that finds every other slice of its rank done joins them all into the rank's reports."""
        from parity.shared.compare.job import compare_slice, finish_rank, slice_tensor_files
        from parity.shared.compare.slices import decode_part, encode_part
        from parity.shared.dump.sidecar import read_dump

        read = functools.lru_cache(maxsize=2)(read_dump)  # the file list and the compare read each dump once
        npu_names, bench_names = slice_tensor_files(pair, options, part, read_dump=read)
        files.stage(npu_names, bench_names)
        table = compare_slice(pair, options, part, progress=lease.progress, read_dump=read)
        lease.check()
        assert pair.rank is not None
        rank, k = pair.rank, part.index
        local = out_dir / f"slice{k}.part"
        local.write_bytes(encode_part(table))
        self.store.put_file(local, _part_key(comparison_id, rank, k))
        if not finish_slice(self.db, comparison_id, rank, k, attempt, len(table.rows)):
            return None
        logger.info("comparison %s rank %d: slice %d of %d joins the rank's %d slices", comparison_id, rank,
                    k, part.count, part.count)  # fmt: skip
        parts = []
        for j in range(part.count):
            key = _part_key(comparison_id, rank, j)
            parts.append(table if j == k else decode_part(b"".join(self.store.iter_bytes(key)), source=key))
        lease.check()
        xlsx, advisor = out_dir / "report.xlsx", out_dir / "advisor.txt"
        # the replay of the rank's top suspects reads their tensor files: fetch those this slice lacks
        return finish_rank(pair, parts, xlsx_path=xlsx, advisor_path=advisor, replay_top=options.replay_top,
                           stage_files=files.stage)  # fmt: skip

    def _tmp_root(self) -> Path:
        # Beside the blobs on a file store, so the hard links of the staging folder stay on one filesystem.
        store = self.store
        root = (
            store.root / ".tmp" if isinstance(store, FileStore) else self.settings.resolved_data_dir / "tmp"
        )
        root.mkdir(parents=True, exist_ok=True)
        return root


def _is_parity_error(exc: BaseException) -> bool:
    from parity.shared.errors import ParityError

    return isinstance(exc, ParityError)


def _task_lease(db: Database, comparison_id: str, rank: int, attempt: int, seconds: float,
                timeout: float | None = None, slice_: int = 0) -> Lease:  # fmt: skip
    """The heartbeat of a claimed task: renews its lease and writes its progress in one UPDATE; past
    ``PARITY_JOB_TIMEOUT_SECONDS`` it fails the task."""

    def renew(until: datetime, progress: float) -> bool:
        with db.write() as session:
            return TaskRepository(session).renew_lease(comparison_id, rank, attempt, until, progress=progress,
                                                       slice_=slice_)  # fmt: skip

    def expire(message: str) -> None:
        finish_failed(db, comparison_id, rank, attempt, message, slice_=slice_)

    what = f"comparison {comparison_id} rank {rank}{_of(slice_)}"
    return Lease(renew, seconds, timeout=timeout, expire=expire, what=what,
                 why_lost=f"attempt {attempt} no longer holds the task")  # fmt: skip


def _stage(blobs: Checkout, run_id: str, files: Iterable[RunFile], dest: Path, label: str) -> int:
    """Lay one rank's files out as ``dest/rank{R}/...``: hard links to the blobs of a file store (read in
    place, no bytes copied, and the engine never sees a symlink) or to the worker cache's downloads."""
    from parity.shared.dump.sidecar import SIDECAR_NAME

    count = 0
    for f in files:
        rel = f.path.split("/", 1)[1]  # drop "stepN/"
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            _link(blobs.path(f.blob, f.size), target)
        except MissingBlob:
            raise JobError(f"{label} run {run_id}: {f.path} is missing from the store") from None
        count += 1
        if target.name == DUMP_JSON:
            # The dump's parsed columns, when its run's validation stored them (runs before had none).
            sidecar = blobs.find(sidecar_key(f.blob))
            if sidecar is not None:
                _link(sidecar, target.with_name(SIDECAR_NAME))
    return count


def _split_tensor_files(files: Sequence[RunFile]) -> tuple[dict[str, RunFile], list[RunFile]]:
    """A rank's tensor files by their name in ``dump_tensor_data``, and its other files (dump.json, ...)."""
    tensors: dict[str, RunFile] = {}
    others: list[RunFile] = []
    for f in files:
        parts = f.path.split("/", 3)  # stepN/rankR/dump_tensor_data/name
        if len(parts) == 4 and parts[2] == TENSOR_DIR:
            tensors[parts[3]] = f
        else:
            others.append(f)
    return tensors, others


class _SliceFiles:
    """A slice's tensor files, staged once it knows which of its rank's it reads."""

    def __init__(self, blobs: Checkout, *sides: tuple[str, dict[str, RunFile], Path]) -> None:
        self.blobs, self.sides = blobs, sides

    def stage(self, *names: Sequence[str]) -> None:
        for (run_id, by_name, dest), wanted in zip(self.sides, names, strict=True):
            label = "target" if dest.name == "npu" else "bench"
            # a file the dump names but the run lacks is not staged: its row says so, as for a whole rank
            chosen = [by_name[n] for n in dict.fromkeys(wanted) if n in by_name]
            _stage(self.blobs, run_id, chosen, dest, label)


def _part_key(comparison_id: str, rank: int, slice_: int) -> str:
    return comparison_key(comparison_id, f"rank{rank}/slice{slice_}.part")


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


# -- finishing a task -------------------------------------------------------------------------------------


def _held_task(session: Session, comparison_id: str, rank: int, attempt: int, slice_: int = 0
               ) -> ComparisonTask | None:  # fmt: skip
    """The task row, locked, if ``attempt`` still holds it; None (logged) when it is stale or gone."""
    task = session.get(ComparisonTask, (comparison_id, rank, slice_), with_for_update=True)
    if task is None or task.attempt != attempt or task.status != "running":
        logger.warning("comparison %s rank %d%s: attempt %d is stale; its result is dropped", comparison_id,
                       rank, _of(slice_), attempt)  # fmt: skip
        return None
    return task


def _of(slice_: int) -> str:
    return f" slice {slice_}" if slice_ else ""


def finish_slice(db: Database, comparison_id: str, rank: int, slice_: int, attempt: int, rows: int) -> bool:
    """A slice's part is in the store: True when every other slice of its rank has succeeded, so this one
    joins them (it stays running, under its lease, until ``finish_succeeded``); else it is done.

    The comparison row is locked as the merge locks it, so of two slices finishing at once the second
    sees the first done, and exactly one joins the rank.
    """
    with db.write() as session:
        task = _held_task(session, comparison_id, rank, attempt, slice_)
        if task is None:
            raise LeaseLost(f"attempt {attempt} no longer holds the task")
        if session.get(Comparison, comparison_id, with_for_update=COMPARISON_LOCK) is None:
            raise LeaseLost("the comparison was deleted")
        t = ComparisonTask
        others = session.scalars(
            select(t.status).where(t.comparison_id == comparison_id, t.rank == rank, t.slice != slice_)
        ).all()
        if all(status == "succeeded" for status in others):
            return True
        task.status, task.progress, task.finished_at, task.lease_expires_at = "succeeded", 1.0, utcnow(), None
        task.rows, task.summary, task.header, task.error = rows, None, None, None
        merge_comparison(session, comparison_id)
    logger.info("comparison %s rank %d slice %d stored: %d rows", comparison_id, rank, slice_, rows)
    return False


def finish_succeeded(db: Database, store: BlobStore, comparison_id: str, rank: int, attempt: int,
                     rows: Sequence[Any], summary: dict[str, Any], header: list[str], *,
                     scores: Sequence[float | None] | None = None, slice_: int = 0,
                     timeline: Timeline | None = None, before_write: Callable[[], None] | None = None,
                     then: Callable[[Session], object] | None = None) -> bool:  # fmt: skip
    """Store one rank's rows, calls and summary, as that rank finishes; merge if it is the last one. False
    when this attempt no longer held the task (nothing stored). ``then`` runs in the same transaction once
    the rank is stored (the runner claims its next task there).

    Everything that takes CPU (the cells as JSON, the rank's calls) is built before the write transaction:
    on SQLite that transaction holds the one write lock every other worker waits for.
    """
    from parity.server.services.calls import rank_calls

    records = _row_records(comparison_id, rank, rows, scores)
    keyed = ((r["index"], r["api"], r["status"], r["name"], r["cells"]) for r in records)
    calls, _ = rank_calls(comparison_id, rank, header, keyed)
    tables = ((ComparisonRow.__table__, records), (ComparisonCall.__table__, calls))
    inserts = [bulk for table, batch in tables if (bulk := _BulkInsert.of(db, table, batch)) is not None]
    timeline = timeline or Timeline()
    timeline.mark("records")
    if before_write is not None:
        before_write()
    began = time.perf_counter()
    with db.write() as session:
        task = _held_task(session, comparison_id, rank, attempt, slice_)
        waited = time.perf_counter() - began  # for the write lock, on SQLite: what two workers share
        timeline.mark("locked")
        if task is not None:
            _replace_rank(session, comparison_id, rank, inserts)
            task.status, task.progress, task.finished_at, task.lease_expires_at = (
                "succeeded",
                1.0,
                utcnow(),
                None,
            )
            task.rows, task.summary, task.header, task.error = len(rows), _plain(summary), header, None
            merge_comparison(session, comparison_id)
            if then is not None:
                then(session)
        timeline.mark("inserted")
    if task is None and _comparison_gone(db, comparison_id):
        # Deleted while it ran: the deleter removed the reports there then, not the ones stored since.
        logger.info(
            "comparison %s was deleted while rank %d ran; its reports are removed", comparison_id, rank
        )
        store.delete_prefix(comparison_key(comparison_id))
        return False
    if task is not None:
        took = time.perf_counter() - began
        logger.info("comparison %s rank %d succeeded: %d rows stored in %.2f s (%.2f s of it waiting for the "
                    "database)", comparison_id, rank, len(rows), took, waited)  # fmt: skip
    return task is not None


def finish_failed(db: Database, comparison_id: str, rank: int, attempt: int, message: str, *, slice_: int = 0
                  ) -> None:  # fmt: skip
    _finish(db, comparison_id, rank, slice_, attempt, "failed", message)
    logger.warning("comparison %s rank %d%s failed: %s", comparison_id, rank, _of(slice_), message)


def finish_skipped(db: Database, comparison_id: str, rank: int, attempt: int, message: str, *,
                   slice_: int = 0) -> None:  # fmt: skip
    _finish(db, comparison_id, rank, slice_, attempt, "skipped", message)
    logger.warning("comparison %s rank %d%s skipped: %s", comparison_id, rank, _of(slice_), message)


def _finish(db: Database, comparison_id: str, rank: int, slice_: int, attempt: int, status: str, message: str
            ) -> None:  # fmt: skip
    with db.write() as session:
        task = _held_task(session, comparison_id, rank, attempt, slice_)
        if task is not None:
            task.status, task.error, task.finished_at, task.lease_expires_at = (
                status,
                message[:4000],
                utcnow(),
                None,
            )
            merge_comparison(session, comparison_id)


def _comparison_gone(db: Database, comparison_id: str) -> bool:
    with db.read() as session:
        return session.get(Comparison, comparison_id) is None


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
    t = ComparisonTask
    unfinished, progress = session.execute(
        select(func.count(), func.coalesce(func.sum(t.progress), 0.0)).where(
            t.comparison_id == comparison_id, t.status.not_in(TERMINAL)
        )
    ).one()
    if unfinished:
        total = session.scalar(select(func.count()).where(t.comparison_id == comparison_id)) or 1
        c.progress = (total - unfinished + float(progress)) / total
        return
    tasks = TaskRepository(session).for_comparison(comparison_id)
    if not tasks:
        return
    failed = [t for t in tasks if t.status == "failed"]
    # A rank's result: its one task, or the slice that joined its slices (the others hold no summary).
    done = [t for t in tasks if t.status == "succeeded" and t.summary is not None]
    c.progress, c.finished_at, c.lease_expires_at = 1.0, utcnow(), None
    if failed or not done:
        c.status, c.summary, c.headers = "failed", None, None
        why = failed or tasks
        c.error = "; ".join(f"rank {t.rank}{_of(t.slice)}: {t.error}" for t in why)[:4000]
        logger.warning("comparison %s failed: %s", comparison_id, c.error)
        return
    c.status, c.error = "succeeded", None
    c.headers = {str(t.rank): list(t.header or []) for t in done}
    c.summary = comparison_summary(
        [t.summary or {} for t in done], skipped=sorted({t.rank for t in tasks if t.status == "skipped"})
    )
    # The ranks stored their calls with their rows; their counts make the calls ready for the pages.
    session.execute(delete(ComparisonCounts).where(ComparisonCounts.comparison_id == comparison_id))
    counts = {status: n for status, n in c.summary["status_counts"].items() if n}
    session.add(ComparisonCounts(comparison_id=comparison_id, counts=counts))
    logger.info(
        "comparison %s succeeded: %d rows over %d rank(s)", comparison_id, c.summary["rows"], len(done)
    )


def comparison_summary(rank_docs: Sequence[dict[str, Any]], *, skipped: Sequence[int] = ()) -> dict[str, Any]:
    """The comparison body's ``summary``: the shared pipeline's merged summary, and the headline figures the
    REST body shows (rows, failing rows and APIs, top suspects), read from it."""
    from parity.shared.report.summary import multi_rank_summary

    doc = multi_rank_summary(rank_docs, skipped_ranks=list(skipped))
    counts = doc["status_counts"]
    failing_apis: dict[str, None] = {}
    suspects: list[dict[str, Any]] = []
    for rank in doc["ranks"]:
        for api in rank["failing_apis"]:
            failing_apis.setdefault(api)
        suspects += [{**s, "compare_rank": rank["rank"]} for s in rank["suspects"]]
    # Ranked by score across ranks; the first divergence is the one of the rank that diverged first.
    suspects.sort(key=lambda s: (-s.get("score", 0.0), s["compare_rank"], s.get("position", 0)))
    origin = doc.get("first_diverged")
    first = None
    if origin is not None:
        for rank in doc["ranks"]:
            if rank["rank"] == origin["rank"] and rank.get("first_divergence"):
                first = {**rank["first_divergence"], "compare_rank": rank["rank"]}
    replay, notes = _replay_of(doc["ranks"])
    return {
        "replay": replay, "replay_notes": notes,
        "rows": sum(counts.values()), "failing_rows": sum(counts[s] for s in _FAILING),
        "failing_apis": list(failing_apis), "top_suspects": suspects[:TOP_SUSPECTS],
        "first_divergence": first,
        "ranks": doc["compared_ranks"], "mode": doc["mode"] or "none", "status_counts": counts,
        "skipped_ranks": doc["skipped_ranks"],
    }  # fmt: skip


def _replay_of(ranks: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every rank's float64 replay verdicts (with their rank), and the distinct notes of ranks without."""
    verdicts: list[dict[str, Any]] = []
    notes: dict[str, None] = {}
    for rank in ranks:
        doc = rank.get("replay") or {}
        verdicts += [{**v, "compare_rank": rank["rank"]} for v in doc.get("verdicts") or []]
        if doc.get("note"):
            notes.setdefault(str(doc["note"]))
    return verdicts, list(notes)


def _row_name(cells: list[Any]) -> str:
    """The text the rows endpoint's ``name=`` filter searches: the NPU name, else the bench name."""
    for cell in cells[:2]:
        if isinstance(cell, str) and cell and cell != "N/A":
            return cell
    return ""


def _row_records(comparison_id: str, rank: int, rows: Sequence[Any],
                 scores: Sequence[float | None] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """One rank's ``comparison_rows`` records (cells as JSON text, non-finite numbers as text)."""
    dumps = orjson.dumps
    records = []
    for index, row in enumerate(rows):
        status = row.status.value
        records.append({
            "comparison_id": comparison_id, "rank": rank, "index": index, "api": row.api, "status": status,
            "highlight": row.highlight.value if row.highlight is not None else None,
            "name": _row_name(row.cells), "failing": status in _FAILING,
            "cells": dumps(json_cells(row.cells), default=_numpy_scalar).decode(),
            "score": scores[index] if scores is not None else None,  # the localization score of its call
        })  # fmt: skip
    return records


def _numpy_scalar(value: Any) -> Any:
    """orjson's fallback: a NumPy scalar cell as the Python number it holds."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"a cell of type {type(value).__name__} is not JSON")


def _replace_rank(session: Session, comparison_id: str, rank: int, inserts: Sequence[_BulkInsert]) -> None:
    """The rank's rows and calls, in place of whatever an earlier attempt left."""
    for model in (ComparisonRow, ComparisonCall):
        session.execute(delete(model).where(model.comparison_id == comparison_id, model.rank == rank))
    conn = session.connection()
    for bulk in inserts:
        for start in range(0, len(bulk.params), ROW_BATCH):
            conn.exec_driver_sql(bulk.sql, bulk.params[start : start + ROW_BATCH])  # type: ignore[arg-type]


@dataclass(frozen=True)
class _BulkInsert:
    """An INSERT and its parameters in the driver's own form, run straight through its executemany.

    SQLAlchemy's own executemany spends as long walking the parameters as the driver spends inserting;
    these records need no type processing. Built before the write transaction: compiling the INSERTs and
    turning a rank's 8,000 rows and 4,000 calls into the driver's tuples took 25 ms (load 4) inside it,
    holding SQLite's one write lock while the other worker waited for it to claim its next task or store
    its own rank (``bench_scale.py --trace``: 0.5–0.8 s of waiting at claims a 16-rank comparison).
    """

    sql: str
    params: list[Any]

    @classmethod
    def of(cls, db: Database, table: Table, records: Sequence[dict[str, Any]]) -> _BulkInsert | None:
        """None for no records."""
        if not records:
            return None
        compiled = insert(table).compile(dialect=db.write_engine.dialect, column_keys=list(records[0]))
        order = compiled.positiontup
        params = [tuple(r[k] for k in order) for r in records] if order is not None else list(records)
        return cls(str(compiled), params)


def _plain(doc: dict[str, Any]) -> dict[str, Any]:
    """A summary document as strict JSON values (the database's JSON type refuses NaN on PostgreSQL)."""
    from parity.shared.report.summary import json_safe

    result: dict[str, Any] = json_safe(doc)
    return result
