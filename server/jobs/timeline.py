"""When each phase of a task happened: one log line per task, read back by ``bench_scale.py --trace``.

The task rows only say when a task was claimed and finished (``finished_at`` before the commit), which
made two Celery workers look idle 13–17% of a comparison's time between tasks; these lines showed 1–5 ms.
They say where a task's time goes: when the broker's message
reached the worker (``received``, Celery's main process), when the runner got the task (``start``), claimed
it, had staged its files, compared them, stored its reports and then its rows, and let the task go
(``end``: its lease thread stopped). Timestamps are the
wall clock (``time.time()``), so lines from several processes line up.

Each line is ``task-timeline {json}`` on the ``parity.server.jobs.timeline`` logger at INFO, so it can be
silenced on its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import orjson

MARKER = "task-timeline "
_logger = logging.getLogger("parity.server.jobs.timeline")
#: The runner's phases, in order; a task that stops early (skipped, failed, a slice that does not join)
#: has only some of them.
PHASES = (
    "start", "claimed", "staged", "compared", "reports", "records", "locked", "inserted", "stored", "end",
)  # fmt: skip


class Timeline:
    """The phases of one task as the runner went through them."""

    def __init__(self) -> None:
        self.marks: dict[str, float] = {"start": time.time()}

    def mark(self, phase: str) -> None:
        self.marks[phase] = time.time()

    def log(self, task: str, worker: str) -> None:
        self.marks.setdefault("end", time.time())
        _logger.info("%s%s", MARKER, orjson.dumps({"task": task, "worker": worker, **self.marks}).decode())


def log_received(task: str, worker: str) -> None:
    """A broker message for ``task`` reached the worker (before it is handed to a pool process)."""
    record = {"task": task, "worker": worker, "received": time.time()}
    _logger.info("%s%s", MARKER, orjson.dumps(record).decode())


def parse(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The timeline records in log ``lines`` (any log format: the record is the JSON after the marker)."""
    records = []
    for line in lines:
        at = line.find(MARKER)
        if at >= 0:
            try:
                records.append(orjson.loads(line[at + len(MARKER) :]))
            except orjson.JSONDecodeError:
                continue  # a line cut short by a killed process
    return records
