"""Limits per job (issue 12): a cap on a tensor's element count, a wall-time limit, and cancellation of a job
whose comparison or runs are deleted. Rank tasks run in this process (``TaskRunner``), the API under
``TestClient``, on SQLite."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from parity.server.jobs.runner import TaskRunner
from parity.server.main import create_app
from parity.server.settings import Settings
from parity.shared.compare import job

from tests.server.conftest import build_dump
from tests.server.test_hardening import API, new_run, upload
from tests.workers import validation_thread


def _expanded_tensor() -> bytes:
    """1.3 KB on disk, 2**40 elements once loaded: the file that held a worker for hours."""
    buffer = io.BytesIO()
    torch.save(torch.ones(1, 1).expand(2**20, 2**20), buffer)
    return buffer.getvalue()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # A lease far longer than any test: only the mechanisms under test can stop a job.
    return Settings(data_dir=tmp_path / "data", workers=0, job_lease_seconds=600)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client, \
            validation_thread(settings):  # fmt: skip
        yield test_client


def _queued(client: TestClient, tmp_path: Path, replace: dict[str, bytes] | None = None) -> tuple[str, str]:
    """(comparison id, target run id) of a queued comparison of two small tensor-mode runs."""
    target, bench = new_run(client), new_run(client, device="gpu")
    upload(client, target["id"], build_dump(tmp_path / "npu", perturb=0.5), replace)
    upload(client, bench["id"], build_dump(tmp_path / "gpu"))
    resp = client.post(f"{API}/comparisons", json={"target_run": target["id"], "bench_run": bench["id"]})
    assert resp.status_code == 202, resp.text
    return resp.json()["id"], target["id"]


def test_a_tensor_over_the_element_cap_is_a_row_diagnostic(
    client: TestClient, settings: Settings, tmp_path: Path
) -> None:
    big = "Torch.relu.0.forward.output.0.pt"
    cid, _ = _queued(client, tmp_path, {big: _expanded_tensor()})
    run_task(cid, settings)
    body = client.get(f"{API}/comparisons/{cid}").json()
    assert body["status"] == "succeeded", body["error"]
    rows = client.get(f"{API}/comparisons/{cid}/rows").json()
    header = rows["header"]
    row = next(r for r in rows["data"] if r["cells"][0] == big.removesuffix(".pt"))
    message = row["cells"][header.index("Err_message")]
    assert "1099511627776 elements, over the cap of 2147483648" in message
    assert "PARITY_MAX_TENSOR_ELEMENTS" in message
    assert row["cells"][header.index("Cosine")] == "unsupported"
    # The other rows were compared as usual.
    assert any(isinstance(r["cells"][header.index("Cosine")], float) for r in rows["data"])


def run_task(cid: str, settings: Settings, rank: int = 0) -> None:
    runner = TaskRunner(settings)
    try:
        runner.run(f"{cid}:{rank}")
    finally:
        runner.close()


def _run_in_thread(cid: str, settings: Settings) -> threading.Thread:
    worker = threading.Thread(target=run_task, args=(cid, settings), daemon=True)
    worker.start()
    return worker


def _wait_status(client: TestClient, cid: str, wanted: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = client.get(f"{API}/comparisons/{cid}").json()
        if body.get("status") == wanted:
            return dict(body)
        time.sleep(0.05)
    raise AssertionError(f"comparison {cid} not {wanted} in {timeout} s: {body}")


def test_a_job_past_its_time_limit_fails_saying_so(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(data_dir=tmp_path / "data", workers=0, job_lease_seconds=600, job_timeout_seconds=1)
    cid, _ = _queued(client, tmp_path)
    stop = threading.Event()

    def endless(*args: Any, progress: Any, **kwargs: Any) -> Any:
        done = 0
        while not stop.wait(0.02):
            done += 1
            progress(done, 10**9)  # what the engine calls between tensor pairs
        raise AssertionError("the job was not stopped")

    monkeypatch.setattr(job, "compare_rank", endless)
    worker = _run_in_thread(cid, settings)
    body = _wait_status(client, cid, "failed")
    worker.join(30)
    stop.set()
    assert not worker.is_alive()
    assert "PARITY_JOB_TIMEOUT_SECONDS=1 s" in body["error"]


def test_a_job_stuck_in_one_unit_is_failed_at_its_deadline(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(data_dir=tmp_path / "data", workers=0, job_lease_seconds=600, job_timeout_seconds=1)
    cid, _ = _queued(client, tmp_path)
    release = threading.Event()
    real = job.compare_rank

    def stuck(*args: Any, **kwargs: Any) -> Any:
        release.wait(60)  # one long unit: no check is called meanwhile
        return real(*args, **kwargs)

    monkeypatch.setattr(job, "compare_rank", stuck)
    worker = _run_in_thread(cid, settings)
    body = _wait_status(client, cid, "failed")  # while the unit still runs
    assert worker.is_alive() and "PARITY_JOB_TIMEOUT_SECONDS" in body["error"]
    release.set()
    worker.join(60)
    # The late result is dropped: the job stays failed, with no rows.
    after = client.get(f"{API}/comparisons/{cid}").json()
    assert after["status"] == "failed" and after["summary"] is None


def test_deleting_a_run_cancels_its_running_job(
    client: TestClient, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cid, target = _queued(client, tmp_path)
    stop = threading.Event()
    pairs = []

    def endless(*args: Any, progress: Any, **kwargs: Any) -> Any:
        while not stop.wait(0.02):
            pairs.append(1)
            progress(len(pairs), 10**9)
        raise AssertionError("the job was not stopped")

    monkeypatch.setattr(job, "compare_rank", endless)
    worker = _run_in_thread(cid, settings)
    try:
        _wait_status(client, cid, "running")
        # The run's comparison goes with it (the flag says so); its running job must notice and stop.
        deleted = client.delete(f"{API}/runs/{target}", params={"with_comparisons": "true"})
        assert deleted.status_code == 204, deleted.text
        worker.join(30)  # without cancellation it would run until its 600 s lease came up for renewal
        assert not worker.is_alive()
    finally:
        stop.set()  # never leave the thread behind (it holds the worker's paused garbage collector)
        worker.join(30)
    assert client.get(f"{API}/comparisons/{cid}").status_code == 404
    assert pairs  # it was running when deleted


def test_a_validation_past_its_deadline_leaves_the_run_invalid_and_the_queue_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: every job has a deadline, a validation too (``PARITY_VALIDATION_TIMEOUT_SECONDS``): one stuck
    in a unit of work is failed by its lease's heartbeat, the run says why, and the next run validates."""
    from parity.server.jobs import validation_task

    assert Settings().validation_timeout_seconds > 0 and Settings().job_timeout_seconds > 0  # the defaults
    settings = Settings(data_dir=tmp_path / "data", workers=0, job_lease_seconds=600,
                        validation_timeout_seconds=1)  # fmt: skip
    release, calls = threading.Event(), []
    real = validation_task.validate_dumps

    def stuck_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            release.wait(60)  # one long unit: no check is called meanwhile
        return real(*args, **kwargs)

    monkeypatch.setattr(validation_task, "validate_dumps", stuck_once)
    with TestClient(create_app(settings)) as client, validation_thread(settings):
        run = new_run(client)
        with pytest.raises(AssertionError):  # upload() waits for "complete"
            upload(client, run["id"], build_dump(tmp_path / "npu"))
        body = client.get(f"{API}/runs/{run['id']}").json()
        assert body["status"] == "invalid", body
        assert "validation ran longer than PARITY_VALIDATION_TIMEOUT_SECONDS=1 s" in body["error"]
        release.set()
        upload(client, new_run(client)["id"], build_dump(tmp_path / "gpu"))  # the next one completes
