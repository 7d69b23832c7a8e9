"""In-process checks of defects found in review: a comparison deleted while its job runs leaves no report in
the store, a bug is a one-line JSON 500, and a multi-line service message is served on one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from parity.server.errors import StoreError
from parity.server.main import create_app
from parity.server.schemas import ComparisonCreate
from parity.server.settings import Settings
from parity.shared.compare import job

from tests.server.conftest import build_dump
from tests.server.harness import InProcess


def test_comparison_deleted_while_running_leaves_no_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with InProcess.open(tmp_path / "data") as server:
        target = server.upload(build_dump(tmp_path / "npu", perturb=0.5), "npu")
        bench = server.upload(build_dump(tmp_path / "gpu"), "gpu")
        cid = server.comparisons.create(ComparisonCreate(target_run=target, bench_run=bench)).id
        real = job.compare_rank
        deleted: list[str] = []

        def compare_then_delete(*args: Any, **kwargs: Any) -> Any:
            outputs = real(*args, **kwargs)
            # The user deletes the target run after the engine finished, before the reports are stored.
            deleted.extend(server.runs.delete(target, with_comparisons=True))
            server.comparisons.forget(deleted)
            return outputs

        monkeypatch.setattr(job, "compare_rank", compare_then_delete)
        server.run_tasks([f"{cid}:0"])
        assert deleted == [cid]
        assert server.staging_left() == []
        reports = server.store.root / "comparisons" / cid
        assert not (reports.exists() and any(p.is_file() for p in reports.rglob("*")))


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
