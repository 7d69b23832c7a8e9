"""Shared pytest configuration.

``make test`` runs the suite on pytest-xdist workers that share one Redis. Celery's queues live in a Redis
database, so each worker gets a database of its own (``gw0`` → 1, ``gw1`` → 2, ...): a Celery worker
started by one test file never takes the tasks of another file's server.
"""

from __future__ import annotations

import os
import re
from typing import Any

_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
_redis = os.environ.get("PARITY_TEST_REDIS_URL")
if _redis and (number := re.fullmatch(r"gw(\d+)", _worker)):
    os.environ["PARITY_TEST_REDIS_URL"] = re.sub(r"(/\d+)?$", f"/{int(number.group(1)) + 1}", _redis, count=1)


#: The folders whose test files take longest (servers, workers, msprobe subprocesses, a browser), collected
#: first: ``--dist loadfile`` hands out files in collection order, and a long file handed out last ran alone
#: at the end while the other worker idled (about a minute of ``make test`` on two cores).
HEAVY_FIRST = ("interop", "server", "e2e", "web")


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """The heavy folders first (a stable sort: each file keeps its order); the accelerator half of the capture
    tests runs under ``make test-accelerator`` (which sets ``PARITY_TEST_ACCELERATOR=1``); ``make test``
    keeps the CPU half, on any machine."""
    items.sort(key=_heaviness)
    if os.environ.get("PARITY_TEST_ACCELERATOR") == "1":
        return
    kept = [item for item in items if item.get_closest_marker("accelerator") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i.get_closest_marker("accelerator")])
        items[:] = kept


def _heaviness(item: Any) -> int:
    parts = item.nodeid.split("/")
    folder = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return HEAVY_FIRST.index(folder) if folder in HEAVY_FIRST else len(HEAVY_FIRST)
