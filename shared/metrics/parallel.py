"""Tensor-mode metrics over many file pairs: balanced by bytes, results streamed back as they finish.

msprobe cuts its table into ``cores/4`` contiguous chunks (one slow chunk holds the whole compare up) under a
one-hour timeout per chunk (compare.md §10). Here every pair is its own task, submitted largest first to
all cores, and an idle worker takes the next task (longest-processing-time-first, within 4/3 of the best
schedule); results are yielded as each pair finishes, with no global timeout. A worker holds one pair at a
time, memory-mapped, so memory stays bounded whatever the dump size.

Where the work runs depends on its size, because starting workers is not free (~0.7 s for a pool of two
here: fork, imports, loading the compiled kernel from numba's cache) while the fused kernel runs at about
1 GB/s per core and releases the GIL:

* under :data:`SERIAL_BYTES` (or one worker): in the calling thread;
* under :data:`IN_PROCESS_BYTES`: a thread per core in this process (the kernel is ``nogil``, so threads
  run it truly in parallel, with no start-up, no pickling and no second copy of numba in memory);
* above it: a process pool (forkserver, else spawn), where start-up is a small share of the run and a
  crash or leak stays inside a worker.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import (
    FIRST_COMPLETED,
    Executor,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    wait,
)
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from parity.shared.errors import DumpError, TensorTooLargeError, UnsafeFileError
from parity.shared.metrics.tensor import (
    MSG_NO_BENCH_FILE,
    MSG_NO_NPU_FILE,
    UNSUPPORTED,
    TensorMetrics,
    compare_raw,
    missing_file_message,
)
from parity.shared.tensor_io import RawTensor, open_tensor

logger = logging.getLogger(__name__)

#: Below this many bytes (both sides together) the pairs are compared one by one in the calling thread.
SERIAL_BYTES = 16 * 2**20
#: Below this many bytes the pairs are compared by threads of the calling process, above it by a process pool.
IN_PROCESS_BYTES = 4 * 2**30


@dataclass(frozen=True, slots=True)
class TensorPairJob:
    """One row to compare: ``index`` is the caller's (e.g. the row number); a file of ``None`` means that
    side has no data file (a non-tensor leaf)."""

    index: int
    npu_file: Path | None
    bench_file: Path | None


def _open_side(path: Path, max_bytes: int | None) -> RawTensor | TensorMetrics:
    try:
        return open_tensor(path, max_bytes=max_bytes)
    except UnsafeFileError:
        raise
    except TensorTooLargeError as exc:
        logger.warning("%s", exc)
        return TensorMetrics.all_cells(UNSUPPORTED, f"Dump file: {path.name}: {exc.problem}.")
    except DumpError as exc:
        logger.debug("%s", exc)  # the row says so; the compare names the count and the first file at the end
        cells = TensorMetrics.all_cells(UNSUPPORTED, missing_file_message(path.name))
        return dataclasses.replace(cells, unread_file=str(path))


def compare_pair_files(
    npu_file: Path | None, bench_file: Path | None, *, max_bytes: int | None = None
) -> TensorMetrics:
    """Metrics of one pair of tensor files, with §4.2's file cases (no data file, missing or unreadable file).

    A file that could only be read by running pickle raises :class:`UnsafeFileError`: refusing it must not
    look like an ordinary "not found".
    """
    if npu_file is None:
        return TensorMetrics.all_cells(UNSUPPORTED, MSG_NO_NPU_FILE)
    if bench_file is None:
        return TensorMetrics.all_cells(UNSUPPORTED, MSG_NO_BENCH_FILE)
    npu = _open_side(Path(npu_file), max_bytes)
    if isinstance(npu, TensorMetrics):
        return npu
    bench = _open_side(Path(bench_file), max_bytes)
    if isinstance(bench, TensorMetrics):
        return bench
    return compare_raw(npu, bench)


def _job_bytes(job: TensorPairJob) -> int:
    total = 0
    for path in (job.npu_file, job.bench_file):
        if path is not None:
            try:
                total += os.stat(path).st_size
            except OSError:
                pass  # reported as "not found" when the job runs
    return total


# What a worker sends back. Exceptions with custom constructors (our DumpError tree) do not survive pickling,
# so an unsafe-file refusal travels as plain fields and is rebuilt in the parent.
_Outcome = tuple[int, TensorMetrics | None, tuple[str | None, str, str | None] | None]


def _run_job(job: TensorPairJob, max_bytes: int | None) -> _Outcome:
    try:
        return job.index, compare_pair_files(job.npu_file, job.bench_file, max_bytes=max_bytes), None
    except UnsafeFileError as exc:
        return job.index, None, (exc.file, exc.problem, exc.where)


def _warm_up() -> None:
    """Load the compiled kernel (from numba's on-disk cache) once per worker, before the first real pair."""
    tiny = np.zeros(2, np.float32)
    tiny.setflags(write=False)  # the signature memory-mapped dumps have
    compare_raw(RawTensor(tiny), RawTensor(tiny))


def _pool_context() -> multiprocessing.context.BaseContext:
    # forkserver: workers fork from a clean server (the entry point may have it preload the kernel: see
    # parity.process_policy); never plain fork (the caller may hold threads or locks); spawn where
    # forkserver does not exist.
    if "forkserver" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context("spawn")


def compare_tensor_files(
    jobs: Sequence[TensorPairJob],
    *,
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
    max_bytes: int | None = None,
    in_process_bytes: int = IN_PROCESS_BYTES,
) -> Iterator[tuple[int, TensorMetrics]]:
    """Compare every pair and yield ``(job.index, metrics)`` as each finishes (in no particular order).

    ``workers`` defaults to all cores; ``progress`` is called with the number of pairs just finished (1) after
    each, so ``tqdm.update`` fits. Every index comes back exactly once. Raises :class:`UnsafeFileError` for a
    tensor file that needs pickle; other unreadable files become ``unsupported`` rows. ``in_process_bytes``
    is the total size (both sides) from which a process pool is used instead of threads.
    """
    jobs = list(jobs)
    if not jobs:
        return
    n_workers = max(1, min(workers if workers is not None else (os.cpu_count() or 1), len(jobs)))
    sizes = [_job_bytes(job) for job in jobs]
    total = sum(sizes)
    if n_workers == 1 or total < SERIAL_BYTES:
        for job in jobs:
            yield _deliver(_run_job(job, max_bytes), progress)
        return
    order = sorted(range(len(jobs)), key=lambda i: sizes[i], reverse=True)
    pool: Executor
    if total < in_process_bytes:
        logger.debug("comparing %d tensor pairs (%d bytes) on %d threads", len(jobs), total, n_workers)
        pool = ThreadPoolExecutor(n_workers, thread_name_prefix="parity-compare")
    else:
        logger.debug("comparing %d tensor pairs (%d bytes) on %d processes", len(jobs), total, n_workers)
        pool = ProcessPoolExecutor(n_workers, mp_context=_pool_context(), initializer=_warm_up)
    try:
        # Only a few tasks are queued beyond the running ones: the queue holds paths, not tensors, but a short
        # queue keeps the largest-first order and makes stopping early (the caller closing us) quick.
        pending: set[Future[_Outcome]] = set()
        next_job = 0
        while next_job < len(order) or pending:
            while next_job < len(order) and len(pending) < 2 * n_workers:
                pending.add(pool.submit(_run_job, jobs[order[next_job]], max_bytes))
                next_job += 1
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield _deliver(future.result(), progress)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _deliver(outcome: _Outcome, progress: Callable[[int], None] | None) -> tuple[int, TensorMetrics]:
    index, metrics, unsafe = outcome
    if unsafe is not None:
        file, problem, where = unsafe
        raise UnsafeFileError(file, problem, where=where)
    assert metrics is not None
    if progress is not None:
        progress(1)
    return index, metrics
