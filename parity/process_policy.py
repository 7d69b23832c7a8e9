"""Process policy for the programs that run compares: the ``parity compare`` command and the server's workers.

``parity.shared`` computes and never touches process-wide state; what a whole process should do while it
compares (pause the cyclic garbage collector, which workers compute the tensor metrics, how those start,
what the float64 replay's child process may spend) is decided here, once, by the entry point that owns the
process, and handed to the library (``CompareOptions.executor``, ``CompareOptions.replay_budget``).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from parity.shared.replay.sandbox import ReplayBudget
    from parity.shared.tensor_io import TensorLimits

logger = logging.getLogger(__name__)

#: What each forked tensor-metric worker needs at once: the compiled kernel (the C module, or numba's cache).
_METRIC_WORKER_MODULES = ["parity.shared.metrics.kernel", "parity.shared.metrics.parallel"]


def die_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel kill this process when its parent (the server, a worker) dies, even by
    SIGKILL; elsewhere, exit at once if the parent is already gone."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        os._exit(1)


def replay_budget(environ: Mapping[str, str] = os.environ) -> ReplayBudget:
    """What the float64 replay's child process may spend (``parity.shared.replay.sandbox``):
    ``PARITY_REPLAY_MEMORY_BYTES``, ``PARITY_REPLAY_CALL_SECONDS`` and ``PARITY_REPLAY_SECONDS`` (the
    server's settings of the same names), each the library's default when unset or not a positive number
    (with a warning)."""
    from parity.shared.replay.sandbox import ReplayBudget

    default = ReplayBudget()

    def read(name: str, fallback: float) -> float:
        raw = environ.get(name)
        if not raw:
            return fallback
        try:
            value = float(raw)
        except ValueError:
            value = 0.0
        if value > 0 and value == value and value != float("inf"):
            return value
        logger.warning("ignoring %s=%r: not a positive number", name, raw)
        return fallback

    return ReplayBudget(int(read("PARITY_REPLAY_MEMORY_BYTES", default.memory_bytes)),
                        read("PARITY_REPLAY_CALL_SECONDS", default.call_seconds),
                        read("PARITY_REPLAY_SECONDS", default.total_seconds))  # fmt: skip


def tensor_limits(environ: Mapping[str, str] = os.environ) -> TensorLimits:
    """The tensor caps this process was started with: ``PARITY_MAX_TENSOR_FILE_BYTES`` (an integer) and
    ``PARITY_MAX_TENSOR_ELEMENTS`` (a positive integer), each the library's default when unset; a value that
    is not one is ignored with a warning. The library never reads them itself (``CompareOptions``)."""
    from parity.shared.tensor_io import (
        DEFAULT_MAX_TENSOR_ELEMENTS,
        DEFAULT_MAX_TENSOR_FILE_BYTES,
        TensorLimits,
    )

    def read(name: str, default: int, minimum: int) -> int:
        raw = environ.get(name)
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            value = minimum - 1
        if value >= minimum:
            return value
        logger.warning("ignoring %s=%r: not an integer of at least %d", name, raw, minimum)
        return default

    return TensorLimits(read("PARITY_MAX_TENSOR_FILE_BYTES", DEFAULT_MAX_TENSOR_FILE_BYTES, 0),
                        read("PARITY_MAX_TENSOR_ELEMENTS", DEFAULT_MAX_TENSOR_ELEMENTS, 1))  # fmt: skip


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for one compare, resuming it (if it was on) afterwards.

    Reading a dump allocates millions of small acyclic objects (dicts, floats, row lists); each allocation
    burst triggers full collections that scan all of them: measured, 60% of a statistics compare's time.
    Reference counting still frees everything. On resume, what was built meanwhile is moved straight to the
    oldest generation (``freeze`` then ``unfreeze``), so the next young collection does not scan it again
    (25 ms a compare, measured).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.unfreeze()
            gc.enable()


@contextmanager
def metric_executor(workers: int | None = None, *, processes: bool = False) -> Iterator[Executor | None]:
    """The workers tensor-mode metrics run on for one compare, shut down (waiting for them) on exit.

    ``workers`` defaults to every core; one worker means none at all (the metrics run in the calling thread).
    Threads by default: the compiled kernel releases the GIL, so threads run it truly in parallel, start at
    once (lazily, at the first large pair) and share the memory-mapped tensors. ``processes`` gives each
    worker a process of its own (forkserver, else spawn; never plain fork, as the caller may hold threads or
    locks), for a caller that wants a crash or a leak kept away from itself.
    """
    n = workers if workers is not None else (os.cpu_count() or 1)
    if n <= 1:
        yield None
        return
    # Imported here, as multiprocessing below: a compare's start-up never pays for what it does not use.
    from concurrent.futures import ThreadPoolExecutor

    executor: Executor
    if processes:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        if method == "forkserver":
            preload_metric_workers()
        context = multiprocessing.get_context(method)
        executor = ProcessPoolExecutor(n, mp_context=context, initializer=_warm_up_metric_worker)
    else:
        executor = ThreadPoolExecutor(n, thread_name_prefix="parity-metrics")
    try:
        yield executor
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def _warm_up_metric_worker() -> None:
    """Load the compiled kernel (the C module, or numba's from its on-disk cache) once per worker process,
    before any pair."""
    import numpy as np

    from parity.shared.metrics.kernel import fused_pass

    tiny = np.zeros(2, np.float32)
    tiny.setflags(write=False)  # the signature memory-mapped dumps have
    fused_pass(tiny, tiny, 0, 0, True, 0, 2)


def preload_metric_workers() -> None:
    """Have the fork server import the tensor kernel once, so each metric worker forks with it loaded
    (about 0.5 s saved per worker); the fork server is process-wide, hence set here and not in the library."""
    import multiprocessing

    if "forkserver" in multiprocessing.get_all_start_methods():
        multiprocessing.set_forkserver_preload(_METRIC_WORKER_MODULES)


def exit_without_teardown(code: int) -> NoReturn:
    """End a finished ``parity compare`` process at once: flush what it printed and logged, then ``_exit``.

    The interpreter's own teardown after a tensor compare (unloading numba and LLVM, freeing the heap the
    compare built) took 0.3 s of a 2.1 s CLI run on the 1.7 GB pair (measured A/B, 1.70-1.87 s without it);
    nothing a compare leaves needs it: its reports are written and closed, its pool shut down, and it
    registers no atexit hook of its own. Only for commands that are done; never from library code.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken pipe: what could be said was said
    logging.shutdown()
    os._exit(code)
