"""The work of one claimed rank job: stage the rank's files, run the shared pipeline, store the result.

The runner (``runner.TaskRunner``) claims the job and holds its lease; this lays out that rank's files in a
staging folder of its own (``staging``), runs ``compare_rank`` (or, for one slice of a large rank,
``compare_slice``, and the slice that finds the others done joins them), stores the rank's xlsx and advisor,
then its rows and summary in one transaction guarded by the attempt (``rank_store``). The staging folder is
removed on success and on failure.
"""

from __future__ import annotations

import functools
import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from parity.server.blob_cache import Checkout
from parity.server.db import Database
from parity.server.jobs import staging as files_on_disk
from parity.server.jobs.base import JobId, task_id
from parity.server.jobs.lease import Lease, LeaseLost
from parity.server.jobs.rank_store import finish_skipped, finish_slice, finish_succeeded
from parity.server.jobs.staging import JobError, SliceFiles, part_key, split_tensor_files
from parity.server.jobs.timeline import Timeline
from parity.server.models import Comparison, Job
from parity.server.repositories import RunRepository
from parity.server.store import BlobStore, comparison_key
from parity.shared.compare.call_records import call_records
from parity.shared.compare.slices import CallSlice
from parity.shared.dump.layout import DUMP_JSON, rank_dir_name, step_dir_name
from parity.shared.replay.sandbox import ReplayBudget
from parity.shared.tensor_io import TensorLimits
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from parity.shared.compare.job import RankPair, RankReport
    from parity.shared.compare.options import CompareOptions

__all__ = ["RankTask", "is_parity_error"]

logger = logging.getLogger(__name__)

#: A claimed job: its id and the attempt that holds it.
Claimed = tuple[JobId, int]


def is_parity_error(exc: BaseException) -> bool:
    """Bad input the engine named (a ``ParityError``), as opposed to a bug."""
    from parity.shared.errors import ParityError

    return isinstance(exc, ParityError)


class RankTask:
    """Runs claimed rank jobs in this worker (one per worker: its database pool, store and staging root).

    ``claim_following`` (with the backends' workers) runs in the transaction that stores a rank and claims
    the worker's next job; what it claimed is left in ``following`` for the runner.
    """

    def __init__(self, db: Database, store: BlobStore, tmp_root: Path,
                 claim_following: Callable[[Session], Claimed | None] | None = None,
                 tensor_limits: TensorLimits | None = None,
                 replay_budget: ReplayBudget | None = None) -> None:  # fmt: skip
        self.db, self.store, self._tmp_root = db, store, tmp_root
        self.tensor_limits = tensor_limits  # the server's settings, read at its edge
        self.replay_budget = replay_budget  # the replays run in a child process under it
        self.claim_following = claim_following
        self.following: Claimed | None = None

    def run(self, comparison_id: str, rank: int, slice_: int, attempt: int, lease: Lease, blobs: Checkout,
            timeline: Timeline) -> None:  # fmt: skip
        """Compare the claimed rank (slice) and store its result; raises what the caller records."""
        lease.check()
        with self.db.read() as session:
            c = session.get(Comparison, comparison_id)
            task = session.get(Job, task_id(comparison_id, rank, slice_))
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
            tensor_limits=self.tensor_limits,
            replay_budget=self.replay_budget,
            mixed_tasks=True,  # a tensor run against a statistics baseline: compared in statistics mode
            # no executor: the backend runs one task per worker slot, so each computes its metrics itself
        )
        # A slice's own folder name (s0 too), so a takeover below never removes a sibling slice's folder.
        prefix = f"task-{comparison_id[:8]}-r{rank}-" + (f"s{slice_}-" if part is not None else "")
        if attempt > 1:
            # A worker killed mid-rank could not remove its staging folder: the attempt that takes the rank
            # over does (the stale attempt's result is dropped anyway), keeping the disk bounded.
            for stale in self._tmp_root.glob(f"{prefix}*"):
                shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=prefix, dir=self._tmp_root))
        try:
            npu_dir, bench_dir, out_dir = staging / "npu", staging / "bench", staging / "out"
            if part is not None:  # a slice fetches the rank's tensor files its calls read, after its dumps
                target_tensors, target_files = split_tensor_files(target_files)
                bench_tensors, bench_files = split_tensor_files(bench_files)
            files_on_disk.stage(blobs, target_id, target_files, npu_dir, "target")
            files_on_disk.stage(blobs, bench_id, bench_files, bench_dir, "bench")
            timeline.mark("staged")
            lease.check()
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
                    slice_files = SliceFiles(blobs, (target_id, target_tensors, npu_dir),
                                              (bench_id, bench_tensors, bench_dir))  # fmt: skip
                    joined = self._run_slice(comparison_id, pair, part, attempt, lease, engine_options,
                                             slice_files, out_dir)  # fmt: skip
                    if joined is None:
                        return  # another slice of the rank is still running: the last one joins them
                    report = joined
            except Exception as exc:
                if not is_parity_error(exc):
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
        following: list[Claimed | None] = []
        claim = self.claim_following
        then = (lambda session: following.append(claim(session))) if claim is not None else None
        stored = finish_succeeded(self.db, self.store, comparison_id, rank, attempt, report.result.rows,
                                  report.summary, list(report.result.header), call_records(report.result),
                                  scores=report.result.row_scores,
                                  slice_=slice_, timeline=timeline, before_write=lease.stop,
                                  then=then)  # fmt: skip
        if stored and following:  # committed: the task claimed with it is this worker's
            self.following = following[0]
        timeline.mark("stored")
        if stored and part is not None:  # the rank's rows are in: its slices' parts are spent
            for k in range(part.count):
                self.store.delete(part_key(comparison_id, rank, k))

    def _run_slice(self, comparison_id: str, pair: RankPair, part: CallSlice, attempt: int, lease: Lease,
                   options: CompareOptions, files: SliceFiles, out_dir: Path
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
        self.store.put_file(local, part_key(comparison_id, rank, k))
        if not finish_slice(self.db, comparison_id, rank, k, attempt, len(table.rows)):
            return None
        logger.info("comparison %s rank %d: slice %d of %d joins the rank's %d slices", comparison_id, rank,
                    k, part.count, part.count)  # fmt: skip
        parts = []
        for j in range(part.count):
            key = part_key(comparison_id, rank, j)
            parts.append(table if j == k else decode_part(b"".join(self.store.iter_bytes(key)), source=key))
        lease.check()
        xlsx, advisor = out_dir / "report.xlsx", out_dir / "advisor.txt"
        # the replay of the rank's top suspects reads their tensor files: fetch those this slice lacks
        return finish_rank(pair, parts, xlsx_path=xlsx, advisor_path=advisor, replay_top=options.replay_top,
                           stage_files=files.stage, progress=lease.progress,
                           tensor_limits=options.tensor_limits,
                           replay_budget=options.replay_budget)  # fmt: skip
