"""The Celery job backend (``PARITY_JOB_BACKEND=celery``, ``PARITY_CELERY_BROKER_URL=redis://...``).

The server only sends job ids; workers started with ``celery -A parity.server.jobs.celery_app worker``
(configured by the same ``PARITY_*`` variables: database, store, broker) call ``run_compare_job``. Nothing
else changes: routes, services and the runner are the same as with the local pool. A message delivered twice
is harmless: the runner's claim lets only one delivery run a queued job, so messages are acknowledged late
(after the job) and a worker lost before it claimed the job leaves its message to be delivered again. No
result backend: the job's row in the database is its result.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from celery import Celery
from parity.server.db import Database
from parity.server.errors import ServiceError
from parity.server.repositories import ComparisonRepository
from parity.server.settings import Settings

logger = logging.getLogger(__name__)

TASK_NAME = "parity.compare.run"


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
    """``JobQueue`` over Celery: ``submit`` sends the id; the workers do the rest."""

    def __init__(self, settings: Settings, db: Database) -> None:
        self.db = db
        self.app = make_celery(settings)

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

    def stop(self) -> None:
        pass


@functools.cache
def _worker_app() -> Celery:
    return make_celery(Settings())


def __getattr__(name: str) -> Any:
    # ``celery -A parity.server.jobs.celery_app worker`` looks up ``app``; it is built on first use, from
    # the environment, so that importing this module configures nothing; later look-ups get the same app.
    if name in ("app", "celery"):
        return _worker_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
