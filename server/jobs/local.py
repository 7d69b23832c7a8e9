"""The default job backend: a pool of worker processes in the server, pulling rank tasks from the database.

``workers`` processes (``spawn``: the server never imports the compare engine itself) each loop: claim the
next queued job (one statement, so two workers never pick the same one; validations first), run it, and
claim the next in the transaction that stores it (``TaskRunner(pull_next=True)``), until none is queued; an
idle worker sleeps until ``submit`` wakes it (or a second passes). A process is kept across tasks, so a task
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
from parity.server.job_repository import JobRepository
from parity.server.jobs.background import BackgroundLoop
from parity.server.jobs.base import JobId, import_engine, parse_task_id, validated_run
from parity.server.settings import Settings

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
    from parity.server.jobs.runner import TaskRunner

    # hard_stop: a deleted, cancelled or late job that does not stop within its grace ends this process;
    # the supervisor starts another.
    runner = TaskRunner(Settings(**settings_data), worker=name, pull_next=True, queue=_Wake(wake),
                        hard_stop=True)  # fmt: skip
    import_engine()
    while True:
        if not runner.run_next():  # validations first: a comparison of the run may be waiting for it
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
        with self.db.write() as session:
            requeued = JobRepository(session).requeue_running()
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
        """Queue again (or fail, past MAX_ATTEMPTS) the jobs a dead worker held."""
        with self.db.read() as session:
            held = JobRepository(session).held_by(worker)
        for job_id, attempt in held:
            if attempt >= MAX_ATTEMPTS:
                _fail(self.db, job_id, attempt, f"{why} (attempt {attempt})")
            else:
                logger.warning("job %s: %s; queued again", job_id, why)
        with self.db.write() as session:
            JobRepository(session).requeue_running(worker)
        self._wake.ring()

    def _shutdown_children(self) -> None:
        for name, proc in list(self._children.items()):
            proc.kill()
            proc.join(timeout=10)
            with self.db.write() as session:
                requeued = JobRepository(session).requeue_running(name)
            if requeued:
                logger.info("worker %s stopped with the server; its task is queued again", name)
        self._children.clear()


def _fail(db: Database, job_id: JobId, attempt: int, why: str) -> None:
    """A job whose worker died ``MAX_ATTEMPTS`` times fails (a rank, or a run made ``invalid``): one that
    kills its worker every time, out of memory say, must not loop forever."""
    from parity.server.jobs.rank_store import finish_failed
    from parity.server.jobs.validation_task import record_outcome

    run_id = validated_run(job_id)
    if run_id is not None:
        record_outcome(db, run_id, attempt, f"validation failed: {why}")
    else:
        comparison_id, rank, slice_ = parse_task_id(job_id)
        finish_failed(db, comparison_id, rank, attempt, why, slice_=slice_)
    logger.warning("job %s failed: %s", job_id, why)
