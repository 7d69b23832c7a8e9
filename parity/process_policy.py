"""Process policy for the programs that run compares: the ``parity compare`` command and the server's workers.

``parity.shared`` computes and never touches process-wide state; what a whole process should do while it
compares (pause the cyclic garbage collector, preload the metric workers' fork server) is decided here, once,
by the entry point that owns the process.
"""

from __future__ import annotations

import gc
import multiprocessing
from collections.abc import Iterator
from contextlib import contextmanager

#: What each forked tensor-metric worker needs at once: numba and the compiled kernel (from numba's cache).
_METRIC_WORKER_MODULES = ["parity.shared.metrics.parallel"]


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


def preload_metric_workers() -> None:
    """Have the fork server import the tensor kernel once, so each metric worker forks with it loaded
    (about 0.5 s saved per worker); the fork server is process-wide, hence set here and not in the library."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        multiprocessing.set_forkserver_preload(_METRIC_WORKER_MODULES)
