"""The default job backend: a pool of worker processes in the server, pulling rank tasks from the database.

``workers`` processes (``spawn``: the server never imports the compare engine itself) each loop: claim the
oldest queued task (one statement, so two workers never pick the same one), run it, and claim the next in
the transaction that stores it (``TaskRunner(pull_next=True)``), until none is queued; an idle worker
sleeps until ``submit`` wakes it (or a second passes). A process is kept across tasks, so a task
costs a claim and its own work, not an interpreter start and the engine's imports. Each child dies with the
server (``PR_SET_PDEATHSIG``), and the task's ``attempt`` counter stops a stale child from writing over a
newer attempt in any case.

Idle workers sleep on a :class:`Bell`, bytes in a non-blocking pipe, not on a ``multiprocessing.Event``: that
Event's ``set`` waits for every sleeper to acknowledge its wake-up, so one worker killed while it slept (the
OOM killer, a Ctrl-C or ``systemctl stop`` signalling the whole process group) made every later ``set`` block
for ever: each ``POST /comparisons`` (``submit``) and the server's own shutdown hung.

A child that dies (a crash, a kill, out of memory) loses only the task it held: the dispatcher puts that
rank back in the queue at once, without waiting for its lease, up to :data:`MAX_ATTEMPTS` claims, and starts
a new child. At start every task still ``running`` is queued again (the children of the previous server
died with it).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import multiprocessing
import os
import sys
import termios
import uuid
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any

from parity.server.db import Database
from parity.server.jobs.background import BackgroundLoop
from parity.server.models import ComparisonTask
from parity.server.repositories import TaskRepository
from parity.server.settings import Settings
from sqlalchemy import select

from parity.process_policy import die_with_parent

logger = logging.getLogger(__name__)

POLL_SECONDS = 1.0
#: Claims of one task before a dying worker fails it instead of queueing it again (a rank that kills its
#: worker every time, out of memory say, must not loop forever).
MAX_ATTEMPTS = 3


class Bell:
    """Wakes idle workers across processes, and no process can jam it: each pending wake-up is a byte in a
    non-blocking pipe that every worker reads from and the server and every worker write to.

    ``ring`` tops the pipe up to ``wakes`` bytes (one per worker, so all idle ones wake, as an Event's
    ``set`` did; never more, so wake-ups rung while every worker was busy cost at most one extra look at the
    queue each). ``wait`` sleeps until a byte is there (or ``timeout``) and takes one. A writer or reader
    killed at any point leaves at most a byte behind; nothing waits on it.
    """

    def __init__(self, ctx: SpawnContext, wakes: int) -> None:
        self.wakes = wakes
        self._read, self._write = ctx.Pipe(duplex=False)  # Connections: handed to spawned children
        for conn in (self._read, self._write):  # a flag of the pipe itself, so of every process's copy
            os.set_blocking(conn.fileno(), False)

    def ring(self) -> None:
        with contextlib.suppress(OSError):  # a full or closed pipe: wake-ups are pending, or nobody listens
            missing = self.wakes - self._pending()
            if missing > 0:
                os.write(self._write.fileno(), b"\0" * missing)

    def wait(self, timeout: float) -> None:
        if self._read.poll(timeout):
            with contextlib.suppress(BlockingIOError):  # another worker took that byte first
                os.read(self._read.fileno(), 1)

    def _pending(self) -> int:
        buf = bytearray(4)
        fcntl.ioctl(self._read.fileno(), termios.FIONREAD, buf)
        return int.from_bytes(buf, sys.byteorder)


def _worker_main(name: str, settings_data: dict[str, Any], parent_pid: int, wake: Bell) -> None:
    die_with_parent(parent_pid)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from parity.server.jobs.runner import TaskRunner, import_engine
    from parity.server.jobs.validation import Validator

    runner = TaskRunner(Settings(**settings_data), worker=name, pull_next=True)
    validator = Validator.beside(runner, _Wake(wake))
    import_engine()
    while True:
        run_id = validator.next_waiting()  # first: a comparison of the run may be waiting for it
        if run_id is not None:
            validator.run(run_id)
            continue
        if not runner.run_next():
            wake.wait(POLL_SECONDS)


class _Wake:
    """A worker's ``JobQueue`` for what it queues itself (a comparison against the baseline once a run it
    validated is complete): the task is in the table already, the other workers only need waking."""

    def __init__(self, wake: Bell) -> None:
        self._wake = wake

    def submit(self, task_id: str) -> None:
        self._wake.ring()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class LocalProcessQueue:
    """``JobQueue`` over local worker processes; the database is the queue, ``submit`` wakes the workers."""

    def __init__(self, settings: Settings, db: Database) -> None:
        self.settings = settings
        self.db = db
        self.workers = max(1, settings.workers)
        self._ctx = multiprocessing.get_context("spawn")
        self._wake = Bell(self._ctx, self.workers)
        self._children: dict[str, BaseProcess] = {}
        self._loop = BackgroundLoop(self._supervise, "parity-jobs")
        self._stopping = self._loop.stopping

    def submit(self, task_id: str) -> None:
        self._wake.ring()

    def start(self) -> None:
        # Only one server runs a given database's local pool, so whatever is still "running" was
        # interrupted by the death of the previous server: it runs again, without waiting for its lease.
        from parity.server.jobs.validation import ValidationRepository

        with self.db.write() as session:
            requeued = TaskRepository(session).requeue_running()
            requeued += ValidationRepository(session).requeue()
        if requeued:
            logger.warning("%d task(s) interrupted by the last shutdown are queued again", requeued)
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    # -- the supervisor thread --------------------------------------------------------------------------
    def _supervise(self) -> None:
        while not self._stopping.is_set():
            try:
                self._reap()
                self._spawn()
            except Exception:  # the supervisor must outlive a database hiccup
                logger.exception("job supervisor error; retrying")
            self._stopping.wait(0.2)
        self._shutdown_children()

    def _spawn(self) -> None:
        settings_data = self.settings.model_dump()
        while len(self._children) < self.workers:
            name = f"local:{os.getpid()}:{uuid.uuid4().hex[:8]}"
            proc = self._ctx.Process(target=_worker_main, args=(name, settings_data, os.getpid(), self._wake),
                                     name=f"parity-worker-{name[-8:]}", daemon=False)  # fmt: skip
            proc.start()
            self._children[name] = proc
            logger.info("compare worker %s started in process %s", name, proc.pid)

    def _reap(self) -> None:
        for name, proc in list(self._children.items()):
            if proc.is_alive():
                continue
            proc.join()
            del self._children[name]
            self._recover(name, f"worker process exited with code {proc.exitcode}")

    def _recover(self, worker: str, why: str) -> None:
        """Queue again (or fail, past MAX_ATTEMPTS) the task or validation a dead worker held."""
        from parity.server.jobs.runner import finish_failed
        from parity.server.jobs.validation import recover

        recover(self.db, worker, why, MAX_ATTEMPTS)
        self._wake.ring()

        with self.db.read() as session:
            t = ComparisonTask
            held = session.execute(
                select(t.comparison_id, t.rank, t.slice, t.attempt).where(t.status == "running",
                                                                          t.worker == worker)
            ).all()  # fmt: skip
        for comparison_id, rank, slice_, attempt in held:
            if attempt >= MAX_ATTEMPTS:
                message = f"{why} (attempt {attempt})"
                finish_failed(self.db, comparison_id, rank, attempt, message, slice_=slice_)
                continue
            with self.db.write() as session:
                TaskRepository(session).requeue_running(worker)
            logger.warning("comparison %s rank %d: %s; queued again", comparison_id, rank, why)
            self._wake.ring()

    def _shutdown_children(self) -> None:
        from parity.server.jobs.validation import ValidationRepository

        for name, proc in list(self._children.items()):
            proc.kill()
            proc.join(timeout=10)
            with self.db.write() as session:
                requeued = TaskRepository(session).requeue_running(name)
                requeued += ValidationRepository(session).requeue(name)
            if requeued:
                logger.info("worker %s stopped with the server; its task is queued again", name)
        self._children.clear()
