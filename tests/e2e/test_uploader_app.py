"""BackgroundUploader and the REST client against the real app in process (no network, no fake)."""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from parity.client.errors import UploadError
from parity.client.rest import ApiError, ServerUnreachable
from parity.client.uploader import BackgroundUploader, retry_call

from tests.e2e.app_wire import AppWire, app_wire
from tests.factories import DumpBuilder


@pytest.fixture
def wire(tmp_path: Path) -> Iterator[AppWire]:
    with app_wire(tmp_path / "server", workers=0) as w:
        yield w


def stored_files(wire: AppWire, run_id: str) -> dict[str, str]:
    return {f.path: f.sha256 for f in wire.api().list_files(run_id)}


FAST = {"retry_budget_s": 0.3, "initial_backoff_s": 0.01, "max_backoff_s": 0.05}


def write_rank(root: Path, step: int, rank: int, scale: float = 1.0) -> Path:
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4) * scale
    rank_dir = root / f"step{step}" / f"rank{rank}"
    DumpBuilder("tensor").api("Functional.gelu.0.forward", [x], [x * 0.5]).write(rank_dir)
    return rank_dir


def local_files(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


def uploader_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "parity.client.uploader" and r.levelno == logging.WARNING
    ]


# -- retry_call ------------------------------------------------------------------------------------------


def test_retry_call_backs_off_exponentially_then_succeeds() -> None:
    waits: list[float] = []
    calls = iter([ServerUnreachable("down"), ServerUnreachable("down"), ServerUnreachable("down"), None])

    def flaky() -> str:
        exc = next(calls)
        if exc is not None:
            raise exc
        return "ok"

    assert (
        retry_call(flaky, what="x", budget_s=10, initial_backoff_s=0.1, max_backoff_s=8, wait=waits.append)
        == "ok"
    )
    assert waits == pytest.approx([0.1, 0.2, 0.4])


def test_retry_call_total_wait_is_bounded() -> None:
    waits: list[float] = []

    def always_down() -> None:
        raise ServerUnreachable("down")

    def wait(seconds: float) -> None:
        waits.append(seconds)
        time.sleep(seconds)

    with pytest.raises(UploadError, match="gave up after"):
        retry_call(always_down, what="x", budget_s=0.2, initial_backoff_s=0.05, max_backoff_s=1, wait=wait)
    assert sum(waits) <= 0.2 + 1e-6
    assert len(waits) >= 2


def test_retry_call_does_not_retry_a_refusal() -> None:
    calls = []

    def refused() -> None:
        calls.append(1)
        raise ApiError("PUT", "http://x/api/v1/runs/1/files/a", 409, "a: exists with other content")

    with pytest.raises(ApiError, match="409"):
        retry_call(refused, what="x", budget_s=10, wait=lambda s: None)
    assert len(calls) == 1


def test_api_error_names_request_and_detail(wire: AppWire) -> None:
    api = wire.api()
    with pytest.raises(ApiError) as info:
        api.get_run("0" * 32)
    assert info.value.status_code == 404 and not info.value.retryable
    missing = "0" * 32
    assert str(info.value) == (
        f"GET http://parity/api/v1/runs/{missing}: HTTP 404: "
        f"run '{missing}' not found (no run has this id or name)"
    )


def test_a_request_outside_the_contract_is_refused_before_it_is_sent(wire: AppWire) -> None:
    api = wire.api()
    with pytest.raises(UploadError, match=r"^RunCreate: device: Input should be 'npu', 'gpu', 'cpu' or"):
        api.create_run("r", device="tpu")
    with pytest.raises(UploadError, match=r"^ComparisonCreate: step: Input should be greater than or equal"):
        api.create_comparison("a", "b", step=-1)
    assert wire.requests == []


def test_an_answer_outside_the_contract_names_the_field(wire: AppWire) -> None:
    api = wire.api()
    run = api.create_run("r", device="cpu")
    bad = {"id": run.id, "status": "sideways"}
    wire.fail = lambda r: httpx.Response(200, json=bad) if r.method == "GET" else None
    with pytest.raises(ApiError, match=r"not a RunPublic of the REST contract: name: Field required \(and"):
        api.get_run(run.id)


# -- BackgroundUploader ----------------------------------------------------------------------------------


def test_uploads_every_file_and_completes(
    wire: AppWire, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "mydump"
    write_rank(root, 0, 0)
    write_rank(root, 0, 1, scale=2.0)
    write_rank(root, 1, 0, scale=3.0)
    up = BackgroundUploader("http://parity", project="p1", tags={"lr": 0.1}, client=wire.client(), **FAST)
    for step, rank in ((0, 0), (0, 1), (1, 0)):
        up.submit_rank_dir(step, rank, root / f"step{step}" / f"rank{rank}")
    up.close(timeout=10)
    sent = list(wire.requests)

    (run,) = wire.api().find_runs()
    assert run.status == "complete" and up.run_id == run.id
    assert run.project == "p1" and run.tags == {"lr": "0.1"} and run.device == "cpu"
    assert re.fullmatch(r"mydump-\d{8}-\d{6}", run.name)
    meta = run.metadata
    assert meta["torch_version"] and meta["python"] and meta["hostname"] and meta["parity_version"]
    assert "git_commit" in meta
    stored = stored_files(wire, run.id)
    assert stored == local_files(root)
    # dump.json of a rank goes after its tensors, and the run is completed last
    puts = [p for m, p in sent if m == "PUT"]
    for rank_prefix in ("step0/rank0/", "step0/rank1/", "step1/rank0/"):
        mine = [p for p in puts if rank_prefix in p]
        assert mine[-1].endswith("/dump.json") and len(mine) == 3
    # The run is completed last, then read until the server's workers have validated it.
    after = sent[sent.index(("POST", f"/api/v1/runs/{run.id}/complete")):]
    assert after[1:] == [("GET", f"/api/v1/runs/{run.id}")] * (len(after) - 1)
    assert up.stats.files_uploaded == len(stored) == 9 and up.stats.files_failed == 0
    assert uploader_warnings(caplog) == []


def test_streams_with_content_length_and_token_from_env(
    wire: AppWire, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARITY_SERVER", "http://from-env:9")
    monkeypatch.setenv("PARITY_TOKEN", "s3cret")
    root = tmp_path / "d"
    write_rank(root, 0, 0)
    up = BackgroundUploader(run_name="named", client=wire.client(), **FAST)
    up.submit_rank_dir(0, 0, root / "step0" / "rank0")
    up.close(timeout=10)
    assert up.server == "http://from-env:9"
    assert all(h.get("authorization") == "Bearer s3cret" for h in wire.headers)
    put_headers = [h for h, (m, _) in zip(wire.headers, wire.requests, strict=True) if m == "PUT"]
    assert put_headers and all("content-length" in h and "transfer-encoding" not in h for h in put_headers)
    assert wire.api().find_runs()[0].name == "named"


def test_transient_errors_are_retried(
    wire: AppWire, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "d"
    write_rank(root, 0, 0)
    failures = {"n": 0}

    def flaky(request: httpx.Request) -> httpx.Response | Exception | None:
        if request.method == "PUT" and failures["n"] < 3:
            failures["n"] += 1
            if failures["n"] % 2:
                return httpx.Response(503, json={"detail": "busy"})
            return httpx.ConnectError("reset")
        return None

    wire.fail = flaky
    up = BackgroundUploader("http://parity", client=wire.client(), retry_budget_s=5, initial_backoff_s=0.01)
    up.submit_rank_dir(0, 0, root / "step0" / "rank0")
    up.close(timeout=10)
    run = wire.api().find_runs()[0]
    assert failures["n"] == 3
    assert run.status == "complete" and len(stored_files(wire, run.id)) == 3
    assert uploader_warnings(caplog) == []


def test_server_down_never_raises_warns_once_then_names_every_step_at_exit(
    wire: AppWire, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "d"
    dirs = [write_rank(root, s, 0) for s in range(4)]
    before = local_files(root)
    wire.fail = lambda request: httpx.ConnectError("connection refused")
    up = BackgroundUploader("http://parity", client=wire.client(), run_name="n", tags={"hw": "a b"},
                            device="cpu", **FAST)  # fmt: skip
    for step, d in enumerate(dirs):
        up.submit_rank_dir(step, 0, d)  # must not raise
    up.close(timeout=10)
    first, last = uploader_warnings(caplog)  # the first failure while training, and the one at exit
    assert "could not create the run" in first
    assert "steps 0-3 (rank 0) not uploaded to http://parity" in last
    assert last.endswith(f"parity upload {root} --server http://parity --name n --project default "
                         "--device cpu --tag 'hw=a b'")  # fmt: skip
    # close() gives a silent server DOWN_GRACE_S, not the queue's length: on a loaded machine the thread may
    # still be passing over the last directories (each counted as given up) when it returns
    assert up.flush(timeout=10)
    assert up.stats.items_failed == 4 and up.run_id is None
    assert local_files(root) == before
    # after the first give-up, later items try once instead of backing off again
    assert len(wire.requests) < 4 * 10


def test_refused_file_is_not_retried_and_run_left_open(
    wire: AppWire, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "d"
    write_rank(root, 0, 0)
    wire.fail = lambda r: (
        httpx.Response(422, json={"detail": "sha256 mismatch"}) if r.method == "PUT" else None
    )
    up = BackgroundUploader("http://parity", client=wire.client(), **FAST)
    up.submit_rank_dir(0, 0, root / "step0" / "rank0")
    up.close(timeout=10)
    puts = [p for m, p in wire.requests if m == "PUT"]
    assert len(puts) == 3  # one try per file, no retry of a refusal
    assert wire.api().find_runs()[0].status == "uploading"
    assert not any(p.endswith("/complete") for _, p in wire.requests)
    warning, at_exit = uploader_warnings(caplog)
    assert "sha256 mismatch" in warning and "step0/rank0/" in warning
    assert "step 0 (rank 0) not uploaded" in at_exit and "parity upload " in at_exit


def test_full_queue_drops_with_a_warning_instead_of_blocking(
    wire: AppWire, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "d"
    dirs = [write_rank(root, s, 0) for s in range(4)]
    gate = threading.Event()
    wire.fail = lambda r: (gate.wait(10), None)[1]
    up = BackgroundUploader(
        "http://parity", client=wire.client(), queue_size=1, enqueue_timeout_s=0.05, **FAST
    )
    for step, d in enumerate(dirs):
        up.submit_rank_dir(step, 0, d)
    gate.set()
    up.close(timeout=10)
    # one item in flight, one queued; the other two were dropped
    assert up.stats.items_dropped == 2
    assert "queue full" in uploader_warnings(caplog)[0]
    run = wire.api().find_runs()[0]
    assert run.status == "uploading"  # dropped items keep the run open for `parity upload`


def test_close_times_out_instead_of_hanging(
    wire: AppWire, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "d"
    write_rank(root, 0, 0)
    gate = threading.Event()
    wire.fail = lambda r: (gate.wait(10), None)[1]
    up = BackgroundUploader("http://parity", client=wire.client(), **FAST)
    up.submit_rank_dir(0, 0, root / "step0" / "rank0")
    start = time.monotonic()
    up.close(timeout=0.2)
    waited = time.monotonic() - start
    gate.set()
    # The aborted thread still sends what it had started; let it end before the app it talks to stops
    # (a request crossing TestClient's shutdown can hang its portal thread).
    assert up._thread is not None
    up._thread.join(timeout=10)
    assert not up._thread.is_alive()
    assert waited < 5
    assert any("not finished after" in w for w in uploader_warnings(caplog))


def test_no_server_disables_uploads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("PARITY_SERVER", raising=False)
    up = BackgroundUploader()
    up.submit_rank_dir(0, 0, tmp_path)
    up.close()
    assert len(uploader_warnings(caplog)) == 1
    assert "no Parity server given" in uploader_warnings(caplog)[0]


def test_malformed_server_url_disables_uploads(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    up = BackgroundUploader("localhost:8000")
    up.submit_rank_dir(0, 0, tmp_path)
    up.close()
    (warning,) = uploader_warnings(caplog)
    assert "'localhost:8000': expected an http:// or https:// URL" in warning


def test_health_reads_the_contract_and_never_raises(wire: AppWire) -> None:
    api = wire.api()
    assert api.health()
    wire.fail = lambda r: httpx.Response(200, json={"status": "starting"})
    assert not api.health()
    wire.fail = lambda r: httpx.ConnectError("refused")
    assert not api.health()
