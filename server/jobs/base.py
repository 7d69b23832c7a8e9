"""The one interface between the services and whatever runs compare tasks.

A comparison fans out into one task per rank pair, each a row of ``comparison_tasks`` (queued → running →
succeeded | failed | skipped); a backend only has to deliver task ids (``{comparison}:{rank}``) to
``TaskRunner.run`` somewhere. The local process pool is the default; Celery is the other backend.
"""

from __future__ import annotations

from typing import Protocol


class JobQueue(Protocol):
    def submit(self, task_id: str) -> None:
        """Ask for ``task_id`` (already committed as ``queued``) to be run; returns at once."""
        ...

    def start(self) -> None:
        """Begin running tasks, including those left queued or running by a previous server."""
        ...

    def stop(self) -> None:
        """Stop running tasks; an interrupted one is queued again and runs at the next start."""
        ...


class NullQueue:
    """Runs nothing (``PARITY_WORKERS=0``): tasks stay queued for another server or a later start."""

    def submit(self, task_id: str) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass
