"""The Celery backend behind the same ``JobQueue`` interface: a server that only sends job ids, and an
embedded Celery worker (in-memory broker) that runs them with ``run_compare_job``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery.contrib.testing.worker import start_worker
from parity.server.db import Database
from parity.server.jobs.base import NullQueue
from parity.server.jobs.celery_app import TASK_NAME, CeleryQueue
from parity.server.schemas import ComparisonCreate
from parity.server.services.comparisons import ComparisonService
from parity.server.settings import Settings
from parity.server.store import FileStore

from tests.server.conftest import ServerProcess, build_dump, upload_run, wait_comparison


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """An embedded worker reconfigures logging (root level ERROR, its own handler); later tests capture
    WARNING records, so the root logger is put back as it was."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def test_celery_worker_runs_the_job(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    # The HTTP server runs no jobs itself here: it stores runs and serves the results.
    srv = ServerProcess(data_dir, {"PARITY_WORKERS": "0"}).start()
    try:
        with srv.client() as api:
            target = upload_run(api, build_dump(tmp_path / "npu", perturb=0.5))
            bench = upload_run(api, build_dump(tmp_path / "gpu"))
            settings = Settings(data_dir=data_dir, job_backend="celery", celery_broker_url="memory://")
            db = Database.connect(settings.resolved_database_url)
            queue = CeleryQueue(settings, db)
            queue.app.loader.import_module("celery.contrib.testing.tasks")  # the worker's ping task
            queue.app.conf.worker_hijack_root_logger = False
            assert TASK_NAME in queue.app.tasks
            service = ComparisonService(db, FileStore(data_dir / "blobs"), queue)
            with start_worker(queue.app, perform_ping_check=False, shutdown_timeout=30):
                created = service.create(ComparisonCreate(target_run=target["id"], bench_run=bench["id"]))
                done = wait_comparison(api, created.id)
            assert done["status"] == "succeeded", done["error"]
            assert "Torch.relu.0.forward" in done["summary"]["failing_apis"]
            assert api.get(f"/comparisons/{created.id}/report.xlsx").content[:2] == b"PK"

            # Jobs queued while no worker listened are sent again when the server starts.
            idle = ComparisonService(db, FileStore(data_dir / "blobs"), NullQueue())
            waiting = idle.create(ComparisonCreate(target_run=target["id"], bench_run=bench["id"]))
            with start_worker(queue.app, perform_ping_check=False, shutdown_timeout=30):
                queue.start()
                assert wait_comparison(api, waiting.id)["status"] == "succeeded"
            db.dispose()
    finally:
        srv.stop()
