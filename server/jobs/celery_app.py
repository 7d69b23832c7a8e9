"""The Celery job backend (``PARITY_JOB_BACKEND=celery``, ``PARITY_CELERY_BROKER_URL=redis://...``).

The server only sends job ids; workers started with ``celery -A parity.server.jobs.celery_app worker``
(configured by the same ``PARITY_*`` variables: database, store, broker) call ``run_compare_job``. Nothing
else changes: routes, services and the runner are the same as with the local pool. A message delivered twice
is harmless: the runner's claim lets only one delivery run a job, so messages are acknowledged late (after
the job) and a worker lost before it claimed the job leaves its message to be delivered again. No result
backend: the job's row in the database is its result.

A worker killed *mid-job* leaves the row ``running``. The runner holds each job under a lease that it renews
while it works (``PARITY_JOB_LEASE_SECONDS``); once a lease has passed, any delivery of the id claims the job
again. The broker redelivers the dead worker's unacknowledged message only after its visibility timeout
(an hour with Redis), so the server also watches the leases: every half lease it sends the id of each job
whose lease has passed, once per lapsed lease, and an idle worker picks it up within about a lease.
"""

from __future__ import annotations

import functools
import logging
import threading
from datetime import datetime
from typing import Any

from celery import Celery
from parity.server.db import Database
from parity.server.errors import ServiceError
from parity.server.models import utcnow
from parity.server.repositories import ComparisonRepository
from parity.server.settings import Settings

logger = logging.getLogger(__name__)

TASK_NAME = "parity.compare.run"
#: At most this many lapsed jobs are sent again per look at the leases.
LEASE_SCAN_LIMIT = 1000


def make_celery(settings: Settings) -> Celery:
    """A Celery app whose one task runs a compare job by id with ``settings``."""
    if not settings.celery_broker_url:
        # Celery would otherwise fall back to amqp://localhost and hang on a broker nobody runs.
        raise ServiceError(
            "PARITY_JOB_BACKEND=celery needs PARITY_CELERY_BROKER_URL (e.g. redis://host:6379/0)"
        )
    app = Celery("parity", broker=settings.celery_broker_url)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        worker_prefetch_multiplier=1,  # compare jobs are long: take one at a time
        task_acks_late=True,  # a worker lost before its claim leaves the message to be delivered again
        task_reject_on_worker_lost=True,
        broker_connection_retry_on_startup=True,  # a worker may start before the broker answers
    )

    @app.task(name=TASK_NAME)  # type: ignore[untyped-decorator]
    def run_compare(job_id: str) -> None:
        from parity.server.jobs.runner import run_compare_job

        run_compare_job(job_id, settings)

    return app


class CeleryQueue:
    """``JobQueue`` over Celery: ``submit`` sends the id; the workers do the rest. A watcher thread sends
    again the jobs whose worker died mid-job (their lease passed)."""

    def __init__(self, settings: Settings, db: Database) -> None:
        self.db = db
        self.app = make_celery(settings)
        self.watch_interval = max(settings.job_lease_seconds / 2, 0.5)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # job id -> the lapsed lease it was last sent for: one message per lapse, not one per look.
        self._resent: dict[str, datetime | None] = {}

    def submit(self, job_id: str) -> None:
        self.app.tasks[TASK_NAME].apply_async(args=[job_id])

    def start(self) -> None:
        # Jobs queued while no server could send them (or whose message was lost) are sent again.
        with self.db.read() as session:
            queued = ComparisonRepository(session).queued_ids(limit=10_000)
        for job_id in queued:
            self.submit(job_id)
        if queued:
            logger.info("sent %d queued comparison(s) to the Celery workers", len(queued))
        self._stopping.clear()
        self._thread = threading.Thread(target=self._watch_leases, name="parity-leases", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def resend_lapsed(self) -> list[str]:
        """Send the id of every running job whose lease has passed and was not yet sent for that lapse."""
        with self.db.read() as session:
            lapsed = ComparisonRepository(session).expired_leases(utcnow(), LEASE_SCAN_LIMIT)
        sent = [job_id for job_id, lease in lapsed
                if job_id not in self._resent or self._resent[job_id] != lease]  # fmt: skip
        for job_id in sent:
            self.submit(job_id)
            logger.warning("comparison %s: its worker's lease passed; sent to the workers again", job_id)
        self._resent = dict(lapsed)  # a job reclaimed (new lease) or finished is forgotten
        return sent

    def _watch_leases(self) -> None:
        while not self._stopping.is_set():
            try:
                self.resend_lapsed()
            except Exception:  # the watcher must outlive a database or broker hiccup
                logger.exception("lease watcher error; retrying")
            self._stopping.wait(self.watch_interval)


@functools.cache
def _worker_app() -> Celery:
    return make_celery(Settings())


def __getattr__(name: str) -> Any:
    # ``celery -A parity.server.jobs.celery_app worker`` looks up ``app``; it is built on first use, from
    # the environment, so that importing this module configures nothing; later look-ups get the same app.
    if name in ("app", "celery"):
        return _worker_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
