"""The heartbeat of a claimed attempt: one lease helper for the rank tasks and the runs' validations.

Both are claimed under the same protocol (one conditional UPDATE, ``attempt`` + 1, a lease that passes
unless renewed). While the attempt works, a daemon thread renews its lease, so a live worker keeps its work
however long it takes, and a dead worker's work is taken over once the lease passes. What a renewal writes
(a task's lease and progress, a run's validation lease) is the caller's ``renew`` function; the rhythm,
the lost flag, the deadline and the progress throttle live here once.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from parity.server.jobs.limits import Deadline
from parity.server.models import utcnow

__all__ = ["PROGRESS_INTERVAL_S", "STOP_GRACE_S", "Lease", "LeaseLost", "end_this_process"]

logger = logging.getLogger(__name__)

#: How often the heartbeat looks at the progress noted by the working thread (it writes only if it moved).
PROGRESS_INTERVAL_S = 0.5
#: How long the working thread has, once its work was deleted, cancelled or ran past its deadline, to notice
#: (at its next ``check``) before the heartbeat ends the process (when it may: ``hard_stop``).
STOP_GRACE_S = 1.0


def end_this_process() -> None:
    """What a stuck attempt's heartbeat does: SIGKILL this worker process. Its supervisor (the local pool,
    Celery's prefork pool) starts another; the job it held is already recorded (failed at its deadline) or
    gone (deleted), so nothing is lost, and the queue moves on."""
    os.kill(os.getpid(), signal.SIGKILL)


class LeaseLost(Exception):
    """This attempt no longer holds its work (its lease passed and another worker claimed it, or the work
    was deleted): the work stops, and nothing is recorded."""


class Lease:
    """A daemon thread that renews a claimed attempt's lease for as long as the ``with`` block runs.

    ``renew(until, progress)`` writes the renewal in one transaction guarded by the attempt and returns
    whether the attempt still holds its work; a False sets ``lost``, and ``check`` (called by the working
    thread between units of work) then raises :class:`LeaseLost`. A renewal that raises (the database is
    briefly unreachable) is only logged: the next one may succeed, and the attempt guard on every write
    keeps a newer attempt safe.

    The working thread only notes its progress in memory (``progress``): a database write on that thread
    waits for SQLite's write lock whenever another worker stores its rows, which kept two workers from
    computing side by side (1.01x from 1 to 2 workers). The heartbeat writes at most every
    ``PROGRESS_INTERVAL_S`` while the progress moves, and every third of the lease in any case.

    With a ``timeout``, the heartbeat also wakes at the deadline and calls ``expire(message)`` to record the
    failure, even when the working thread is inside one long unit of work and will not call ``check`` for a
    while; the attempt guard drops whatever that thread records later.

    Between renewals the heartbeat asks ``alive()`` (a read, every ``PROGRESS_INTERVAL_S``) whether the
    attempt still holds its work, so a deletion or cancel is seen within half a second, not a third of the
    lease. Once the work is lost or past its deadline, the working thread has ``STOP_GRACE_S`` to reach its
    next ``check``; with ``hard_stop`` (a worker process of a pool, never a thread of the server or a test)
    the heartbeat then ends the process (``stop_process``), so one long unit of work (a tensor pair, an xlsx
    of a million rows) cannot keep a worker from the queue.
    """

    def __init__(
        self,
        renew: Callable[[datetime, float], bool],
        seconds: float,
        *,
        what: str,
        why_lost: str,
        timeout: float | None = None,
        timeout_kind: str = "comparison",
        expire: Callable[[str], None] | None = None,
        alive: Callable[[], bool] | None = None,
        hard_stop: bool = False,
        stop_process: Callable[[], None] = end_this_process,
    ) -> None:
        self.seconds = seconds
        self.what = what  # for the log: "comparison C rank R", "validation of run R"
        self.why_lost = why_lost
        self.deadline = Deadline(timeout, timeout_kind)
        self.lost = threading.Event()
        self._renew, self._expire, self._alive = renew, expire, alive
        self.hard_stop, self._stop_process = hard_stop, stop_process
        self._done = threading.Event()
        self._fraction = 0.0  # set by the working thread; a float store is atomic under the GIL
        self._thread = threading.Thread(target=self._beat, name=f"parity-lease {what}", daemon=True)

    def __enter__(self) -> Lease:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """No more renewals (idempotent; waits for one in flight). A rank task calls it before its finishing
        transaction, whose attempt guard is all it needs: a renewal started during that transaction waited
        for its write lock, then for the busy handler's next retry (up to 100 ms apart), and the task's end
        waited for it (``bench_scale.py --trace``: 20–40 ms a rank with two workers)."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def check(self) -> None:
        """Raise if the work should stop: it was deleted or reclaimed (``LeaseLost``), or it ran past its
        ``timeout`` (``JobTimeout``, recorded as the work's error)."""
        if self.lost.is_set():
            raise LeaseLost(self.why_lost)
        self.deadline.check()

    def progress(self, done: int, total: int) -> None:
        """An engine's ``progress(done, total)``: stop early if the attempt is lost, else note it."""
        self.check()  # rather than finish work whose result would be dropped
        if total:
            self._fraction = min(max(done / total, 0.0), 1.0) * 0.9  # the last tenth: reports and rows

    def _beat(self) -> None:
        if self._watch():
            self._stop_working_thread()

    def _watch(self) -> bool:
        """Renew until the work ends (False) or is lost or past its deadline (True)."""
        written, renewed = 0.0, time.monotonic()
        while not self._done.wait(self.deadline.cap(min(PROGRESS_INTERVAL_S, self.seconds / 3))):
            if self.deadline.passed():
                try:
                    if self._expire is not None:
                        self._expire(self.deadline.message())
                except Exception:
                    logger.warning("%s: could not record its timeout; retrying", self.what, exc_info=True)
                    continue
                self.why_lost = "it ran past its time limit"
                self.lost.set()
                return True
            fraction = self._fraction
            try:
                if fraction == written and time.monotonic() - renewed < self.seconds / 3:
                    if self._alive is None or self._alive():
                        continue
                    held = False
                else:
                    held = self._renew(utcnow() + timedelta(seconds=self.seconds), fraction)
                    written, renewed = fraction, time.monotonic()
            except Exception:
                logger.warning("%s: lease renewal failed; retrying", self.what, exc_info=True)
                continue
            if not held:
                logger.warning("%s: %s (its lease was lost)", self.what, self.why_lost)
                self.lost.set()
                return True
        return False

    def _stop_working_thread(self) -> None:
        if not self.hard_stop or self._done.wait(STOP_GRACE_S):
            return  # the working thread saw ``lost`` at its next check and left the ``with`` block
        logger.warning("%s: %s, and its work did not stop within %.1f s; ending worker process %d", self.what,
                       self.why_lost, STOP_GRACE_S, os.getpid())  # fmt: skip
        self._stop_process()
