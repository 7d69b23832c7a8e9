"""In-process checks of defects found in review: a comparison deleted while its job runs leaves no report in
the store, a bug is a one-line JSON 500, and a multi-line service message is served on one line."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from parity.server.db import Database
from parity.server.errors import StoreError
from parity.server.jobs.base import NullQueue
from parity.server.jobs.runner import TaskRunner
from parity.server.main import create_app
from parity.server.migrate import upgrade
from parity.server.schemas import ComparisonCreate, RunCreate
from parity.server.services.comparisons import ComparisonService
from parity.server.services.runs import RunService
from parity.server.settings import Settings
from parity.server.store import FileStore, open_store
from parity.shared.compare import job

from tests.server.conftest import build_dump, dump_files, sha
from tests.workers import validate_waiting


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _upload_run(runs: RunService, root: Path, device: str, settings: Settings) -> str:
    run = runs.create(RunCreate(name=f"run-{device}", device=device))  # type: ignore[arg-type]
    for path, data in dump_files(root):
        result = anyio.run(runs.upload, run.id, path, sha(data), str(len(data)), _body(data))
        assert result.created
    runs.complete(run.id)
    validate_waiting(settings)  # what a worker of the job backend does next
    return run.id


def test_comparison_deleted_while_running_leaves_no_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(data_dir=tmp_path / "data", workers=0)
    upgrade(settings.resolved_database_url)
    db = Database.connect(settings.resolved_database_url)
    store = open_store(settings.resolved_store_url, tmp_path / "tmp")
    assert isinstance(store, FileStore)
    runs, comparisons = RunService(db, store, 1 << 30), ComparisonService(db, store, NullQueue())
    try:
        target = _upload_run(runs, build_dump(tmp_path / "npu", perturb=0.5), "npu", settings)
        bench = _upload_run(runs, build_dump(tmp_path / "gpu"), "gpu", settings)
        cid = comparisons.create(ComparisonCreate(target_run=target, bench_run=bench)).id
        real = job.compare_rank
        deleted: list[str] = []

        def compare_then_delete(*args: Any, **kwargs: Any) -> Any:
            outputs = real(*args, **kwargs)
            # The user deletes the target run after the engine finished, before the reports are stored.
            deleted.extend(runs.delete(target, with_comparisons=True))
            comparisons.forget(deleted)
            return outputs

        monkeypatch.setattr(job, "compare_rank", compare_then_delete)
        runner = TaskRunner(settings)
        try:
            runner.run(f"{cid}:0")
        finally:
            runner.close()
        assert deleted == [cid]
        reports = store.root / "comparisons" / cid
        assert not (reports.exists() and any(p.is_file() for p in reports.rglob("*")))
    finally:
        db.dispose()


def test_a_bug_is_a_one_line_json_500(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path / "data", workers=0))
    with TestClient(app, raise_server_exceptions=False) as client:

        def broken(run_id: str) -> None:
            raise RuntimeError("boom\nsecond line")

        app.state.run_service.get = broken
        resp = client.get("/api/v1/runs/abc")
        assert resp.status_code == 500
        assert resp.headers["content-type"] == "application/json"
        detail = resp.json()["detail"]
        assert "RuntimeError" in detail and "GET /api/v1/runs/abc" in detail and "\n" not in detail

        def store_down(run_id: str) -> None:
            raise StoreError("s3 download failed: An error occurred\n  (SlowDown)")

        app.state.run_service.get = store_down
        resp = client.get("/api/v1/runs/abc")
        assert resp.status_code == 500
        assert resp.json() == {"detail": "s3 download failed: An error occurred   (SlowDown)"}
