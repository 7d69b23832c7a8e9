"""The one interface between the services and whatever runs jobs, and the helpers every job module shares.

Work is rows of ``jobs`` (``parity.server.models.Job``): a comparison fans out into one ``rank`` job per
rank pair (or slice of one), and ``complete`` queues a run's ``validate`` job. A backend only has to deliver
job ids to a worker's ``TaskRunner.run`` somewhere; the local process pool is the default, Celery the other.

This module is the bottom of the jobs layer: the services and the repositories import it (the protocol and
the ids), and it imports nothing of the server, so no import cycle can pass through it.
"""

from __future__ import annotations

import os
import socket
from typing import Protocol

__all__ = [
    "JobId",
    "JobQueue",
    "NullQueue",
    "import_engine",
    "parse_task_id",
    "task_id",
    "validated_run",
    "validation_id",
    "worker_name",
]

#: A job's id on the backends and in ``jobs.id``: ``{comparison}:{rank}`` (``{comparison}:{rank}.{slice}``
#: for a slice past the first of a rank split into slices), or ``validate:{run}``. Ids, never objects,
#: travel to workers.
JobId = str

#: The prefix of a validation's job id.
VALIDATE_PREFIX = "validate:"


def task_id(comparison_id: str, rank: int, slice_: int = 0) -> JobId:
    """The id of a comparison's rank job (slice ``slice_`` of that rank)."""
    return f"{comparison_id}:{rank}" if slice_ == 0 else f"{comparison_id}:{rank}.{slice_}"


def parse_task_id(value: JobId) -> tuple[str, int, int]:
    """``(comparison id, rank, slice)`` of a rank job's id."""
    comparison_id, sep, key = value.rpartition(":")
    rank, dot, slice_ = key.partition(".")
    if not sep or not rank.lstrip("-").isdigit() or (dot and not slice_.isdigit()):
        raise ValueError(f"not a task id: {value!r} (expected COMPARISON:RANK or COMPARISON:RANK.SLICE)")
    return comparison_id, int(rank), int(slice_ or 0)


def validation_id(run_id: str) -> JobId:
    """The id of a run's validation job."""
    return f"{VALIDATE_PREFIX}{run_id}"


def validated_run(job_id: JobId) -> str | None:
    """The run id of a validation's job id; None for any other job (a rank job)."""
    return job_id[len(VALIDATE_PREFIX) :] if job_id.startswith(VALIDATE_PREFIX) else None


class JobQueue(Protocol):
    def submit(self, task_id: JobId) -> None:
        """Ask for job ``task_id`` (already committed as ``queued``) to be run; returns at once."""
        ...

    def start(self) -> None:
        """Begin running jobs, including those left queued or running by a previous server."""
        ...

    def stop(self) -> None:
        """Stop running jobs; an interrupted one is queued again and runs at the next start."""
        ...


class NullQueue:
    """Runs nothing (``PARITY_WORKERS=0``): jobs stay queued for another server or a later start."""

    def submit(self, task_id: JobId) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def worker_name() -> str:
    """Who holds a job, as shown in the database: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def import_engine() -> None:
    """Import the compare engine ahead of the first job, while a worker waits for work (or, on Celery, in
    the parent its pool processes are forked from): otherwise each worker's first job pays for it (numba
    and the kernels, about a third of a second on a quiet core)."""
    import parity.shared.compare.engine  # noqa: F401
    import parity.shared.compare.job  # noqa: F401
