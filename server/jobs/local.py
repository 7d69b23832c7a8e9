"""The default job backend: a pool of spawned worker processes fed from the ``comparisons`` table.

One dispatcher thread starts a fresh process per job (``spawn``, at most ``workers`` at a time), so a job that
crashes or leaks memory takes nothing else with it, and the server never imports the compare engine itself.
Each child dies with the server (``PR_SET_PDEATHSIG``), and the job's ``attempt`` counter stops a stale child
from writing over a newer attempt in any case. The runner's lease (``PARITY_JOB_LEASE_SECONDS``) is not what
recovers a job here: the children die with the server, so at start every job still ``running`` is queued again
at once (its lease cleared) rather than after its lease passes; a child that dies alone fails its job.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading
from multiprocessing.process import BaseProcess
from typing import Any

from parity.server.db import Database
from parity.server.models import Comparison, utcnow
from parity.server.repositories import ComparisonRepository
from parity.server.settings import Settings
from sqlalchemy import update

logger = logging.getLogger(__name__)

POLL_SECONDS = 2.0


def _die_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel kill this process when the server dies (even by SIGKILL)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        os._exit(1)


def _child_main(job_id: str, settings_data: dict[str, Any], parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from parity.server.jobs.runner import run_compare_job

    run_compare_job(job_id, Settings(**settings_data))


class LocalProcessQueue:
    """``JobQueue`` over local processes; the database is the queue, ``submit`` only wakes the dispatcher."""

    def __init__(self, settings: Settings, db: Database) -> None:
        self.settings = settings
        self.db = db
        self.workers = max(1, settings.workers)
        self._ctx = multiprocessing.get_context("spawn")
        self._running: dict[str, BaseProcess] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def submit(self, job_id: str) -> None:
        self._wake.set()

    def start(self) -> None:
        # Only one server runs a given database's local pool, so whatever is still "running" was
        # interrupted by the death of the previous server: it runs again, without waiting for its lease.
        with self.db.write() as session:
            result = session.execute(
                update(Comparison)
                .where(Comparison.status == "running")
                .values(status="queued", progress=0.0, started_at=None, lease_expires_at=None)
            )
        requeued = getattr(result, "rowcount", 0)
        if requeued:
            logger.warning("%d comparison(s) interrupted by the last shutdown are queued again", requeued)
        self._stopping.clear()
        self._thread = threading.Thread(target=self._dispatch, name="parity-jobs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    # -- the dispatcher thread --------------------------------------------------------------------------
    def _dispatch(self) -> None:
        while not self._stopping.is_set():
            try:
                self._reap()
                self._launch()
            except Exception:  # the dispatcher must outlive a database hiccup
                logger.exception("job dispatcher error; retrying")
            self._wake.wait(timeout=0.2 if self._running else POLL_SECONDS)
            self._wake.clear()
        self._shutdown_children()

    def _launch(self) -> None:
        free = self.workers - len(self._running)
        if free <= 0:
            return
        with self.db.read() as session:
            job_ids = ComparisonRepository(session).queued_ids(free, exclude=list(self._running))
        settings_data = self.settings.model_dump()
        for job_id in job_ids:
            proc = self._ctx.Process(
                target=_child_main,
                args=(job_id, settings_data, os.getpid()),
                name=f"parity-job-{job_id[:8]}",
                daemon=False,
            )
            proc.start()
            self._running[job_id] = proc
            logger.info("comparison %s started in process %s", job_id, proc.pid)

    def _reap(self) -> None:
        for job_id, proc in list(self._running.items()):
            if proc.is_alive():
                continue
            proc.join()
            del self._running[job_id]
            if proc.exitcode != 0:
                # The runner records every error itself; a non-zero exit means the process died (a crash,
                # a kill, out of memory), so the job is failed here, once, if nothing newer claimed it.
                self._fail(job_id, f"worker process exited with code {proc.exitcode}")
            self._wake.set()  # a slot is free

    def _fail(self, job_id: str, message: str) -> None:
        with self.db.write() as session:
            session.execute(
                update(Comparison)
                .where(Comparison.id == job_id, Comparison.status == "running")
                .values(status="failed", error=message, finished_at=utcnow(), lease_expires_at=None)
            )
        logger.error("comparison %s failed: %s", job_id, message)

    def _shutdown_children(self) -> None:
        for job_id, proc in list(self._running.items()):
            proc.kill()
            proc.join(timeout=10)
            with self.db.write() as session:
                session.execute(
                    update(Comparison)
                    .where(Comparison.id == job_id, Comparison.status == "running")
                    .values(status="queued", progress=0.0, started_at=None, lease_expires_at=None)
                )
            logger.info("comparison %s interrupted by shutdown; queued again", job_id)
        self._running.clear()
