"""The Celery job backend (``PARITY_JOB_BACKEND=celery``, ``PARITY_CELERY_BROKER_URL=redis://...``).

The server only sends ids: a rank task's (``{comparison}:{rank}``, one message per rank of a comparison) or a
run's validation (``validate:{run}``, task ``parity.run.validate``, sent by ``complete``); workers
started with ``celery -A parity.server.jobs.celery_app worker`` (configured by the same ``PARITY_*``
variables: database, store, broker) run them with ``TaskRunner``, the same as the local pool's processes.
A message delivered twice is harmless: the runner's claim lets only one delivery run a task, so messages are
acknowledged late (after the task) and a worker lost before it claimed the task leaves its message to be
delivered again. A worker that stores a rank claims the oldest queued task in the same transaction and runs
it at once (``TaskRunner(pull_next=True)``): the messages wake workers, the database hands out the work, and
a message whose task another worker took pulls the next queued one, or finds none and is done. No result
backend: the task's row in the database is its result.

A worker killed *mid-rank* leaves that task ``running``. The runner holds each task under a lease that it
renews while it works (``PARITY_JOB_LEASE_SECONDS``); once a lease has passed, any delivery of the id claims
the task again. The broker redelivers the dead worker's unacknowledged message only after its visibility
timeout (an hour with Redis), so the server also watches the leases: every half lease it sends the id of each
task whose lease has passed, once per lapsed lease, and an idle worker picks it up within about a lease.
"""

from __future__ import annotations

import functools
import logging
import os
from datetime import datetime
from typing import Any

from celery import Celery
from celery.signals import task_received, worker_init
from parity.server.db import Database
from parity.server.errors import ServiceError
from parity.server.job_repository import JobRepository
from parity.server.jobs.background import BackgroundLoop
from parity.server.jobs.base import import_engine, validated_run, validation_id, worker_name
from parity.server.models import utcnow
from parity.server.settings import Settings

logger = logging.getLogger(__name__)

TASK_NAME = "parity.compare.rank"
VALIDATE_TASK_NAME = "parity.run.validate"
#: At most this many lapsed tasks are sent again per look at the leases.
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
        worker_prefetch_multiplier=1,  # rank tasks can be long: take one at a time
        task_acks_late=True,  # a worker lost before its claim leaves the message to be delivered again
        task_reject_on_worker_lost=True,
        broker_connection_retry_on_startup=True,  # a worker may start before the broker answers
    )

    @app.task(name=TASK_NAME)  # type: ignore[untyped-decorator]
    def run_rank(task_id: str) -> None:
        _runner(settings, app).run(task_id)

    @app.task(name=VALIDATE_TASK_NAME)  # type: ignore[untyped-decorator]
    def validate_run(run_id: str) -> None:
        _runner(settings, app).run(validation_id(run_id))

    @worker_init.connect(weak=False)  # type: ignore[untyped-decorator]
    def _import_engine(**_: Any) -> None:
        # In the worker's main process, before its pool processes are forked: they start with the engine
        # imported instead of paying for it in their first task.
        _main_pid[:] = [os.getpid()]
        import_engine()

    # Connected once per process, whatever the number of apps built (each test builds its own).
    task_received.connect(_received, weak=False, dispatch_uid="parity-task-received")
    return app


def _received(request: Any = None, **_: Any) -> None:
    """In a worker's main process, as a broker message arrives: the first mark of the task's timeline."""
    if request is not None and request.name in (TASK_NAME, VALIDATE_TASK_NAME) and request.args:
        from parity.server.jobs.timeline import log_received

        log_received(str(request.args[0]), worker_name())


class _Sender:
    """A worker's ``JobQueue`` for the tasks it queues itself (the comparison against a project's baseline,
    once a run it validated is complete): sent through the worker's own app."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def submit(self, task_id: str) -> None:
        send(self.app, task_id)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def send(app: Celery, job_id: str) -> None:
    """One message for a rank task (``{comparison}:{rank}``) or a run's validation (``validate:{run}``)."""
    run_id = validated_run(job_id)
    if run_id is not None:
        app.tasks[VALIDATE_TASK_NAME].apply_async(args=[run_id])
    else:
        app.tasks[TASK_NAME].apply_async(args=[job_id])


_runners: dict[int, Any] = {}
#: The pid of the worker's main process (set at ``worker_init``): its prefork pool's processes differ.
_main_pid: list[int] = []


def _runner(settings: Settings, app: Celery) -> Any:
    """One ``TaskRunner`` (a database pool, a store) per worker process, built on its first task. A prefork
    pool process may be ended by a lost or late job's heartbeat (Celery starts another; the message is
    rejected and redelivered, and finds the job finished or gone); the worker's own process never is."""
    from parity.server.jobs.runner import TaskRunner

    runner = _runners.get(id(settings))
    if runner is None:
        pool_child = bool(_main_pid) and os.getpid() != _main_pid[0]
        runner = _runners[id(settings)] = TaskRunner(settings, pull_next=True, queue=_Sender(app),
                                                     hard_stop=pool_child)  # fmt: skip
    return runner


class CeleryQueue:
    """``JobQueue`` over Celery: ``submit`` sends a task id; the workers do the rest. A watcher thread sends
    again the tasks whose worker died mid-rank (their lease passed)."""

    def __init__(self, settings: Settings, db: Database) -> None:
        self.db = db
        self.app = make_celery(settings)
        self.watch_interval = max(settings.job_lease_seconds / 2, 0.5)
        self._loop = BackgroundLoop(self._watch_leases, "parity-leases")
        self._stopping = self._loop.stopping
        # task id -> the lapsed lease it was last sent for: one message per lapse, not one per look.
        self._resent: dict[str, datetime | None] = {}

    def submit(self, task_id: str) -> None:
        send(self.app, task_id)

    def start(self) -> None:
        # Jobs queued while no server could send them (or whose message was lost) are sent again.
        with self.db.read() as session:
            queued = JobRepository(session).queued(limit=100_000)
        for task_id in queued:
            self.submit(task_id)
        if queued:
            logger.info("sent %d queued rank task(s) to the Celery workers", len(queued))
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    def resend_lapsed(self) -> list[str]:
        """Send the id of every running task whose lease has passed and was not yet sent for that lapse."""
        with self.db.read() as session:
            lapsed = JobRepository(session).lapsed(utcnow(), LEASE_SCAN_LIMIT)
        sent = [task_id for task_id, lease in lapsed
                if task_id not in self._resent or self._resent[task_id] != lease]  # fmt: skip
        for task_id in sent:
            self.submit(task_id)
            logger.warning("task %s: its worker's lease passed; sent to the workers again", task_id)
        self._resent = dict(lapsed)  # a task reclaimed (new lease) or finished is forgotten
        return sent

    def warm_up(self) -> None:
        """Open the broker connection that ``submit`` will use, and load what a first send loads.

        Otherwise the first comparison after a start waits for them: its first message reached a worker
        0.10–0.16 s after the comparison was created (0.01 s on the local pool), of which the first send
        took 0.11 s: the Redis connection (about 0.1 s), the result backend's look-up (an entry-points
        scan, even with results ignored) and an import (measured with ``bench_scale.py --trace``).
        """
        self.app.backend  # noqa: B018  (the look-up is the point)
        with self.app.producer_or_acquire() as producer:
            producer.connection.ensure_connection(max_retries=1)

    def _watch_leases(self) -> None:
        try:
            self.warm_up()  # here, not in ``start``: a broker still starting must not delay the server
        except Exception:
            logger.warning("could not reach the Celery broker yet; the first send will retry", exc_info=True)
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
