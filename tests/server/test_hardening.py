"""Issue 12, items 1-12: hostile input, typos in settings and server internals never answer 500, open the
server, forge its log or show its paths. Each test failed on the code before its fix. In-process (the app
under ``TestClient``) except where the subject is the process itself."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from parity.server.errors import BadRequest, ConfigError
from parity.server.jobs.runner import TaskRunner
from parity.server.main import create_app
from parity.server.services.paths import check_upload_path
from parity.server.settings import Settings, load_settings
from parity.shared.compare import job

from tests.server.conftest import REPO, build_dump, dump_files, sha
from tests.workers import validation_thread

API = "/api/v1"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", workers=0)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client, \
            validation_thread(settings):  # fmt: skip
        yield test_client


def new_run(client: TestClient, **fields: Any) -> dict[str, Any]:
    # Names are unique in a project: each run a name of its own.
    resp = client.post(f"{API}/runs", json={"name": f"r-{uuid.uuid4().hex[:8]}", "device": "npu", **fields})
    assert resp.status_code == 201, resp.text
    return dict(resp.json())


def upload(client: TestClient, run_id: str, root: Path, replace: dict[str, bytes] | None = None) -> None:
    for path, data in dump_files(root):
        data = (replace or {}).get(path.rsplit("/", 1)[-1], data)
        resp = client.put(f"{API}/runs/{run_id}/files/{path}", content=data,
                          headers={"X-Content-SHA256": sha(data)})  # fmt: skip
        assert resp.status_code == 201, resp.text
    resp = client.post(f"{API}/runs/{run_id}/complete")
    assert resp.status_code == 202, resp.text
    deadline = time.monotonic() + 60
    while client.get(f"{API}/runs/{run_id}").json()["status"] == "validating" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.get(f"{API}/runs/{run_id}").json()["status"] == "complete"


# -- 1. metadata nested 300 deep ----------------------------------------------------------------------------
def test_deeply_nested_metadata_is_refused_and_the_list_keeps_working(client: TestClient) -> None:
    deep: dict[str, Any] = {}
    for _ in range(300):
        deep = {"a": deep}
    resp = client.post(f"{API}/runs", json={"name": "deep", "device": "npu", "metadata": deep})
    assert resp.status_code == 422
    assert "metadata" in resp.json()["detail"]
    listed = client.get(f"{API}/runs")
    assert listed.status_code == 200 and listed.json()["count"] == 0
    ok = {"a": {"b": {"c": [1, {"d": 2}]}}}
    assert new_run(client, metadata=ok)["metadata"] == ok


# -- 4 and 7. step folders: one spelling per step, no overflow ----------------------------------------------
@pytest.mark.parametrize(
    ("path", "problem"),
    [("step00/rank0/dump.json", "no leading zeros"), ("step０/rank0/dump.json", "ASCII digits"),
     ("step0/rank01/dump.json", "no leading zeros"), ("step0/rank٣/dump.json", "ASCII digits"),
     ("step99999999999999999999999/rank0/dump.json", "at most 9 digits")],
)  # fmt: skip
def test_step_and_rank_folders_have_one_spelling(path: str, problem: str) -> None:
    with pytest.raises(BadRequest, match=problem):
        check_upload_path(path)


def test_canonical_and_unrelated_folders_still_pass() -> None:
    assert check_upload_path("step0/rank0/dump.json") == (0, 0)
    assert check_upload_path("step10/rank7/dump_tensor_data/x.pt") == (10, 7)
    assert check_upload_path("stepping/rank0/x") == (None, None)
    assert check_upload_path("step0x/rank0/x") == (None, None)


def test_a_second_spelling_of_step_zero_is_refused_over_http(client: TestClient) -> None:
    run = new_run(client)
    resp = client.put(f"{API}/runs/{run['id']}/files/step00/rank0/dump.json", content=b"{}",
                      headers={"X-Content-SHA256": sha(b"{}")})  # fmt: skip
    assert resp.status_code == 400 and "step00" in resp.json()["detail"]
    assert client.get(f"{API}/runs/{run['id']}/files").json()["count"] == 0


@pytest.mark.parametrize(
    "url", ["/runs?offset=9223372036854775808", "/comparisons?offset=9223372036854775808",
            "/comparisons/x/rows?offset=9223372036854775808", "/comparisons/x/rows?rank=9223372036854775808"],
)  # fmt: skip
def test_huge_offsets_are_422_not_500(client: TestClient, url: str) -> None:
    resp = client.get(API + url)
    assert resp.status_code == 422, resp.text
    assert isinstance(resp.json()["detail"], str)


# -- 5. a non-ASCII bearer token ----------------------------------------------------------------------------
def test_a_non_ascii_token_is_401(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(Settings(data_dir=tmp_path / "data", workers=0, tokens="secret:rw,viewer:ro"))
    with TestClient(app, raise_server_exceptions=False) as client, caplog.at_level(logging.ERROR):
        for token in (b"Bearer \xff", "Bearer sécret".encode("latin-1")):
            resp = client.get(f"{API}/runs", headers={"Authorization": token})  # type: ignore[dict-item]
            assert resp.status_code == 401, resp.text
        assert client.get(f"{API}/runs", headers={"Authorization": "Bearer secret"}).status_code == 200
        resp = client.post(f"{API}/runs", json={"name": "r", "device": "npu"},
                           headers={"Authorization": "Bearer viewer"})  # fmt: skip
        assert resp.status_code == 403
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# -- 6. token settings fail closed --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("tokens", "named"),
    [("viewer:readonly", "'readonly'"), ("guest:r", "'r'"), ("a:ro,b:admin", "'admin'"), (",", "','"),
     (" ", "' '"), (" , ,", "names no token"), (":ro", "empty token")],
)  # fmt: skip
def test_bad_token_settings_refuse_to_start(tokens: str, named: str) -> None:
    with pytest.raises(ConfigError, match="PARITY_TOKENS") as info:
        load_settings(tokens=tokens)
    assert named in str(info.value)


def test_token_roles() -> None:
    roles = Settings(tokens="a, b:rw, c:RO").token_roles()
    assert roles == {"a": True, "b": True, "c": False}
    assert Settings().token_roles() == {}


def test_parity_server_exits_with_the_bad_value(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARITY_")}
    env.update(PARITY_DATA_DIR=str(tmp_path), PARITY_TOKENS="viewer:readonly")
    proc = subprocess.run([sys.executable, "-m", "parity", "server", "--port", "1"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2
    assert "PARITY_TOKENS" in proc.stderr and "'readonly'" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- 8. forged log lines ------------------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["name", "project"])
def test_control_characters_in_names_are_refused(client: TestClient, field: str) -> None:
    resp = client.post(f"{API}/runs", json={"name": "r", "device": "npu", field: "ok\nINFO forged line"})
    assert resp.status_code == 422 and field in resp.json()["detail"]
    resp = client.post(f"{API}/runs", json={"name": "r", "device": "npu", "tags": {"k\r": "v"}})
    assert resp.status_code == 422


def test_a_newline_in_a_failing_path_stays_on_one_log_line(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(run_id: str) -> None:
        raise RuntimeError("boom")

    client.app.state.run_service.get = broken  # type: ignore[attr-defined]
    with caplog.at_level(logging.ERROR):
        assert client.get(f"{API}/runs/x%0AINFO%20forged").status_code == 500
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert messages and all("\n" not in m for m in messages)


# -- 9. server paths in a failed job's error ----------------------------------------------------------------
def test_a_failed_job_does_not_show_server_paths(
    client: TestClient, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, bench = new_run(client), new_run(client, device="gpu")
    upload(client, target["id"], build_dump(tmp_path / "npu"))
    upload(client, bench["id"], build_dump(tmp_path / "gpu"))

    def missing_folder(pair: Any, *args: Any, **kwargs: Any) -> Any:
        raise FileNotFoundError(2, "No such file or directory", str(pair.npu_dump.parent.parent))

    monkeypatch.setattr(job, "compare_rank", missing_folder)
    resp = client.post(f"{API}/comparisons", json={"target_run": target["id"], "bench_run": bench["id"]})
    cid = resp.json()["id"]
    runner = TaskRunner(settings)
    try:
        runner.run(f"{cid}:0")
    finally:
        runner.close()
    error = client.get(f"{API}/comparisons/{cid}").json()["error"]
    assert "FileNotFoundError" in error and "<server path>/npu" in error
    assert str(settings.resolved_data_dir) not in error and str(tmp_path) not in error


# -- 10. /docs offline --------------------------------------------------------------------------------------
def test_docs_are_served_from_the_package(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    assert "cdn" not in page.text.lower() and "https://" not in page.text
    for asset in ("/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css"):
        assert asset in page.text
        resp = client.get(asset)
        assert resp.status_code == 200 and len(resp.content) > 10_000
    assert client.get("/openapi.json").json()["openapi"].startswith("3.1")


# -- 11. durability: fsync before the acknowledgement -------------------------------------------------------
def test_an_upload_is_fsynced_before_it_is_acknowledged(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    run = new_run(client)
    monkeypatch.setattr(os, "fsync", recording_fsync)
    resp = client.put(f"{API}/runs/{run['id']}/files/step0/rank0/dump.json", content=b"{}",
                      headers={"X-Content-SHA256": sha(b"{}")})  # fmt: skip
    assert resp.status_code == 201
    assert any("/.tmp/upload-" in p for p in synced)  # the bytes, before the rename
    assert any(p.endswith("/blobs") for p in synced)  # the folder holding the rename


# -- 12. the schema tells the truth -------------------------------------------------------------------------
def test_error_bodies_match_the_schema(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    post = schema["paths"]["/api/v1/runs"]["post"]["responses"]
    for code in ("400", "404", "409", "413", "422", "507"):
        assert post[code]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorPublic")
    resp = client.post(f"{API}/runs", json={"device": "npu"})
    assert resp.status_code == 422 and isinstance(resp.json()["detail"], str)
    put = schema["paths"]["/api/v1/runs/{run_id}/files/{path}"]["put"]
    sha_header = next(p for p in put["parameters"] if p["name"] == "X-Content-SHA256")
    assert "pattern" in sha_header["schema"]
    assert not any(p["name"] == "Content-Length" for p in put["parameters"])
