"""The one interface between the services and whatever runs compare jobs.

A job *is* its row in the ``comparisons`` table (queued → running → succeeded | failed); a backend only has
to deliver the job id to ``run_compare_job(job_id, settings)`` somewhere. The local process pool is the
default; a Celery backend would be another class with these three methods and a task calling the runner.
"""

from __future__ import annotations

from typing import Protocol


class JobQueue(Protocol):
    def submit(self, job_id: str) -> None:
        """Ask for ``job_id`` (already committed as ``queued``) to be run; returns at once."""
        ...

    def start(self) -> None:
        """Begin running jobs, including those left queued or running by a previous server."""
        ...

    def stop(self) -> None:
        """Stop running jobs; an interrupted job goes back to ``queued`` and runs again at the next start."""
        ...


class NullQueue:
    """Runs nothing (``PARITY_WORKERS=0``): jobs stay queued for another server or a later start."""

    def submit(self, job_id: str) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass
