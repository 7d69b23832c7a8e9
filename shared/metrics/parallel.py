"""Tensor-mode metrics over many file pairs: balanced by bytes, results streamed back as they finish.

msprobe cuts its table into ``cores/4`` contiguous chunks (one slow chunk holds the whole compare up) under a
one-hour timeout per chunk (compare.md §10). Here every pair is its own task, submitted largest first, and an
idle worker takes the next task (longest-processing-time-first, within 4/3 of the best schedule); results are
yielded as each pair finishes, with no global timeout. A worker holds one pair at a time, memory-mapped, so
memory stays bounded whatever the dump size.

The workers belong to the caller: the entry point that owns the process (``parity compare``, a server worker)
builds the executor (``parity.process_policy.metric_executor``) and hands it in, or hands in none. This
module only decides whether a compare is worth spreading: under :data:`SERIAL_BYTES` (both sides together)
the pairs are compared one by one in the calling thread, whatever executor was given, because handing a
few kilobytes to a worker costs more than comparing them; and, where the kernel is numba's (the C module not
built), under :data:`COMPILED_FROM_BYTES` every pair takes the numpy pass, since importing numba would cost
more than the compiled kernel saves.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from parity.shared.errors import DumpError, TensorTooLargeError, UnsafeFileError
from parity.shared.metrics.tensor import (
    MSG_NO_BENCH_FILE,
    MSG_NO_NPU_FILE,
    UNSUPPORTED,
    TensorMetrics,
    compare_raw,
    missing_file_message,
    native_kernel,
)
from parity.shared.tensor_io import DEFAULT_LIMITS, RawTensor, TensorLimits, open_tensor

if TYPE_CHECKING:
    from concurrent.futures import Executor, Future

logger = logging.getLogger(__name__)

#: Below this many bytes (both sides together) the pairs are compared one by one in the calling thread.
SERIAL_BYTES = 16 * 2**20
#: From this many bytes (both sides together) every pair runs on the compiled kernel, below it on the numpy
#: pass (the same cells): numba's 0.5–1.5 s start-up against the numpy pass's ~50 ns an element more, at
#: about 8M elements of float32 a side. One choice a compare, so many small pairs of a big dump still share
#: one kernel load and no pair pays the numpy pass's speed in a compare that has loaded numba anyway.
COMPILED_FROM_BYTES = 64 * 2**20


@dataclass(frozen=True, slots=True)
class TensorPairJob:
    """One row to compare: ``index`` is the caller's (e.g. the row number); a file of ``None`` means that
    side has no data file (a non-tensor leaf). ``fill``: the pair is masked (its statistics say so), and
    its elements equal on both sides of at least this magnitude are left out (``tensor.unmask``)."""

    index: int
    npu_file: Path | None
    bench_file: Path | None
    fill: float = math.inf


def _open_side(path: Path, limits: TensorLimits) -> RawTensor | TensorMetrics:
    try:
        return open_tensor(path, limits=limits)
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
    npu_file: Path | None,
    bench_file: Path | None,
    *,
    limits: TensorLimits = DEFAULT_LIMITS,
    compiled: bool | None = None,
    fill: float = math.inf,
) -> TensorMetrics:
    """Metrics of one pair of tensor files, with §4.2's file cases (no data file, missing or unreadable file).

    A file that could only be read by running pickle raises :class:`UnsafeFileError`: refusing it must not
    look like an ordinary "not found". ``compiled``: the kernel or the numpy pass (``tensor.run_segment``).
    """
    if npu_file is None:
        return TensorMetrics.all_cells(UNSUPPORTED, MSG_NO_NPU_FILE)
    if bench_file is None:
        return TensorMetrics.all_cells(UNSUPPORTED, MSG_NO_BENCH_FILE)
    npu = _open_side(Path(npu_file), limits)
    if isinstance(npu, TensorMetrics):
        return npu
    bench = _open_side(Path(bench_file), limits)
    if isinstance(bench, TensorMetrics):
        return bench
    return compare_raw(npu, bench, compiled=compiled, fill=fill)


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


def _run_job(job: TensorPairJob, limits: TensorLimits, compiled: bool | None = None) -> _Outcome:
    try:
        metrics = compare_pair_files(job.npu_file, job.bench_file, limits=limits, compiled=compiled,
                                     fill=job.fill)  # fmt: skip
        return job.index, metrics, None
    except UnsafeFileError as exc:
        return job.index, None, (exc.file, exc.problem, exc.where)


def compare_tensor_files(
    jobs: Sequence[TensorPairJob],
    *,
    executor: Executor | None = None,
    progress: Callable[[int], None] | None = None,
    limits: TensorLimits = DEFAULT_LIMITS,
) -> Iterator[tuple[int, TensorMetrics]]:
    """Compare every pair and yield ``(job.index, metrics)`` as each finishes (in no particular order).

    ``executor`` runs the pairs (threads: the kernel releases the GIL; or processes); without one, or for a
    total under :data:`SERIAL_BYTES`, they run in the calling thread. The numbers never depend on which.
    ``progress`` is called with the number of pairs just finished (1) after each, so ``tqdm.update`` fits.
    Every index comes back exactly once. Raises :class:`UnsafeFileError` for a tensor file that needs
    pickle; other unreadable files become ``unsupported`` rows.
    """
    jobs = list(jobs)
    if not jobs:
        return
    sizes = [_job_bytes(job) for job in jobs]
    total = sum(sizes)
    compiled = native_kernel() or total >= COMPILED_FROM_BYTES
    if executor is None or len(jobs) == 1 or total < SERIAL_BYTES:
        for job in jobs:
            yield _deliver(_run_job(job, limits, compiled), progress)
        return
    from concurrent.futures import FIRST_COMPLETED, wait  # the serial path above never needs them

    logger.debug("comparing %d tensor pairs (%d bytes) on %s", len(jobs), total, type(executor).__name__)
    order = sorted(range(len(jobs)), key=lambda i: sizes[i], reverse=True)
    # Only a few tasks are queued beyond the running ones: the queue holds paths, not tensors, but a short
    # queue keeps the largest-first order and makes stopping early (the caller closing us) quick.
    queued = 2 * (os.cpu_count() or 1)
    pending: set[Future[_Outcome]] = set()
    try:
        next_job = 0
        while next_job < len(order) or pending:
            while next_job < len(order) and len(pending) < queued:
                pending.add(executor.submit(_run_job, jobs[order[next_job]], limits, compiled))
                next_job += 1
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield _deliver(future.result(), progress)
    finally:
        for future in pending:  # stopped early or failed: what has not started never will
            future.cancel()


def _deliver(outcome: _Outcome, progress: Callable[[int], None] | None) -> tuple[int, TensorMetrics]:
    index, metrics, unsafe = outcome
    if unsafe is not None:
        file, problem, where = unsafe
        raise UnsafeFileError(file, problem, where=where)
    assert metrics is not None
    if progress is not None:
        progress(1)
    return index, metrics
