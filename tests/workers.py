"""A validation worker in a thread of the test process, for in-process apps and services run with
``workers=0`` (no local pool): the job backend's own ``TaskRunner``, taking validations only, so runs
completed there become ``complete`` (or ``invalid``) as on a server, while comparisons stay queued for the
test to run."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from parity.server.jobs.runner import TaskRunner
from parity.server.settings import Settings


def validate_waiting(settings: Settings) -> int:
    """Validate every run waiting for it, in this thread; returns how many were run."""
    runner = TaskRunner(settings, worker="test-validator")
    try:
        done = 0
        while runner.run_next(kinds=("validate",)):
            done += 1
        return done
    finally:
        runner.close()


def run_waiting(settings: Settings) -> int:
    """Run every task waiting (validations, then the rank tasks they queue) in this thread; how many."""
    runner = TaskRunner(settings, worker="test")
    try:
        done = 0
        while runner.run_next():
            done += 1
        return done
    finally:
        runner.close()


@contextmanager
def validation_thread(settings: Settings, poll_s: float = 0.05) -> Iterator[None]:
    """Validate runs as they wait, from a daemon thread, until the block ends."""
    stop = threading.Event()

    def work() -> None:
        runner = TaskRunner(settings, worker="test-validator")
        try:
            while not stop.is_set():
                if not runner.run_next(kinds=("validate",)):
                    stop.wait(poll_s)
        finally:
            runner.close()

    thread = threading.Thread(target=work, name="test-validator", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=60)
