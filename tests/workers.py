"""A validation worker in a thread of the test process, for in-process apps and services run with
``workers=0`` (no local pool): the job backend's own ``Validator``, so runs completed there become
``complete`` (or ``invalid``) as on a server, while comparisons stay queued for the test to run."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from parity.server.jobs.base import NullQueue
from parity.server.jobs.runner import TaskRunner
from parity.server.jobs.validation import Validator
from parity.server.settings import Settings


def validate_waiting(settings: Settings) -> int:
    """Validate every run waiting for it, in this thread; returns how many were run."""
    runner = TaskRunner(settings, worker="test-validator")
    try:
        validator = Validator.beside(runner, NullQueue())
        done = 0
        while (run_id := validator.next_waiting()) is not None:
            done += validator.run(run_id)
        return done
    finally:
        runner.close()


@contextmanager
def validation_thread(settings: Settings, poll_s: float = 0.05) -> Iterator[None]:
    """Validate runs as they wait, from a daemon thread, until the block ends."""
    stop = threading.Event()

    def work() -> None:
        runner = TaskRunner(settings, worker="test-validator")
        validator = Validator.beside(runner, NullQueue())
        try:
            while not stop.is_set():
                run_id = validator.next_waiting()
                if run_id is None:
                    stop.wait(poll_s)
                else:
                    validator.run(run_id)
        finally:
            runner.close()

    thread = threading.Thread(target=work, name="test-validator", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=60)
