"""Shared pytest configuration.

``make test`` runs the suite on pytest-xdist workers that share one Redis. Celery's queues live in a Redis
database, so each worker gets a database of its own (``gw0`` → 1, ``gw1`` → 2, ...): a Celery worker
started by one test file never takes the tasks of another file's server.
"""

from __future__ import annotations

import os
import re

_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
_redis = os.environ.get("PARITY_TEST_REDIS_URL")
if _redis and (number := re.fullmatch(r"gw(\d+)", _worker)):
    os.environ["PARITY_TEST_REDIS_URL"] = re.sub(r"(/\d+)?$", f"/{int(number.group(1)) + 1}", _redis, count=1)
