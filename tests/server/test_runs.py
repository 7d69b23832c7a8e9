"""Runs over REST: create, read, list with every filter, files, delete (SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.server.conftest import ServerProcess, build_dump, new_run, put, upload_run


def test_healthz_needs_nothing(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}


def test_create_and_read_run(api: httpx.Client) -> None:
    run = new_run(api, project="p-create", device="gpu", tags={"dtype": "bf16"}, metadata={"torch": "2.13"})
    assert len(run["id"]) == 32 and run["status"] == "uploading"
    got = api.get(f"/runs/{run['id']}").json()
    assert got == run
    assert got["tags"] == {"dtype": "bf16"} and got["metadata"] == {"torch": "2.13"}
    assert (got["file_count"], got["total_bytes"], got["steps"], got["ranks"]) == (0, 0, [], [])


def test_create_run_rejects_unknown_device(api: httpx.Client) -> None:
    resp = api.post("/runs", json={"name": "x", "device": "tpu"})
    assert resp.status_code == 422
    assert "device" in resp.json()["detail"]


def test_unknown_run_is_404(api: httpx.Client) -> None:
    resp = api.get(f"/runs/{uuid.uuid4().hex}")
    assert resp.status_code == 404 and "not found" in resp.json()["detail"]


def test_list_filters_and_pagination(api: httpx.Client) -> None:
    project = f"p-{uuid.uuid4().hex[:8]}"
    a = new_run(api, name="alpha", project=project, device="npu", tags={"dtype": "fp32", "team": "x"})
    b = new_run(api, name="beta", project=project, device="gpu", tags={"dtype": "bf16", "team": "x"})
    c = new_run(api, name="Alphabet", project=project, device="gpu", tags={"dtype": "bf16"})

    def ids(**params: Any) -> set[str]:
        body = api.get("/runs", params={"project": project, **params}).json()
        assert body["count"] == len(body["data"])
        return {r["id"] for r in body["data"]}

    assert ids() == {a["id"], b["id"], c["id"]}
    assert ids(name="alpha") == {a["id"]}
    assert ids(name_contains="ALPHA") == {a["id"], c["id"]}
    assert ids(name_contains="phab") == {c["id"]}
    assert ids(device="gpu") == {b["id"], c["id"]}
    assert ids(tag="dtype=bf16") == {b["id"], c["id"]}
    assert ids(tag=["dtype=bf16", "team=x"]) == {b["id"]}
    assert ids(status="complete") == set()
    page1 = api.get("/runs", params={"project": project, "limit": 2, "offset": 0}).json()
    page2 = api.get("/runs", params={"project": project, "limit": 2, "offset": 2}).json()
    assert page1["count"] == page2["count"] == 3
    assert len(page1["data"]) == 2 and len(page2["data"]) == 1
    assert {r["id"] for r in page1["data"] + page2["data"]} == {a["id"], b["id"], c["id"]}
    refused = api.get("/runs", params={"tag": "dtype:bf16"})
    assert refused.status_code == 400 and "expected KEY=VALUE" in refused.json()["detail"]


def test_complete_run_reports_files_steps_ranks(api: httpx.Client, tmp_path: Path) -> None:
    root = build_dump(tmp_path / "d", ranks=(0, 1))
    run = upload_run(api, root, project="p-stats")
    assert run["status"] == "complete" and run["completed_at"] is not None
    assert run["steps"] == [0] and run["ranks"] == [0, 1]
    files = api.get(f"/runs/{run['id']}/files").json()
    assert (
        files["count"] == run["file_count"] == len(list(root.rglob("*.json"))) + len(list(root.rglob("*.pt")))
    )
    assert run["total_bytes"] == sum(f["size"] for f in files["data"])
    assert "step0/rank1/dump.json" in {f["path"] for f in files["data"]}
    listed = api.get("/runs", params={"project": "p-stats", "status": "complete"}).json()
    assert run["id"] in {r["id"] for r in listed["data"]}


def test_delete_run_removes_files(api: httpx.Client, server: ServerProcess, tmp_path: Path) -> None:
    run = new_run(api)
    assert put(api, run["id"], "step0/rank0/dump.json", b"{}").status_code == 201
    blob_dir = server.data_dir / "blobs" / "runs" / run["id"]
    assert [p.read_bytes() for p in blob_dir.rglob("*") if p.is_file()] == [b"{}"]
    assert api.delete(f"/runs/{run['id']}").status_code == 204
    assert api.get(f"/runs/{run['id']}").status_code == 404
    assert not blob_dir.exists()
    assert api.delete(f"/runs/{run['id']}").status_code == 404


def test_openapi_declares_the_contract(server: ServerProcess) -> None:
    schema = httpx.get(f"{server.url}/openapi.json").json()
    paths = schema["paths"]
    runs, comparisons = "/api/v1/runs", "/api/v1/comparisons/{comparison_id}"
    expected = ["/healthz", runs, f"{runs}/{{run_id}}", f"{runs}/{{run_id}}/files/{{path}}",
                f"{runs}/{{run_id}}/complete", "/api/v1/comparisons", comparisons, f"{comparisons}/rows",
                f"{comparisons}/report.xlsx", f"{comparisons}/advisor.txt"]  # fmt: skip
    for path in expected:
        assert path in paths, path
    put_op = paths["/api/v1/runs/{run_id}/files/{path}"]["put"]
    headers = {p["name"]: p for p in put_op["parameters"] if p["in"] == "header"}
    assert headers["X-Content-SHA256"]["required"] is True
    assert "application/octet-stream" in put_op["requestBody"]["content"]


def test_oversized_json_body_is_413(api: httpx.Client) -> None:
    before = api.get("/runs", params={"name": "huge"}).json()["count"]
    resp = api.post("/runs", json={"name": "huge", "device": "npu", "metadata": {"blob": "x" * (2 << 20)}})
    assert resp.status_code == 413
    assert api.get("/runs", params={"name": "huge"}).json()["count"] == before == 0
