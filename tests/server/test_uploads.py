"""Uploads: idempotent, verified, streamed, bounded, authorised; every refusal leaves nothing behind."""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import ServerProcess, build_dump, dump_files, new_run, put, sha, wait_run

LIMIT = 4096
RW, RO = "secret-rw", "secret-ro"


def stored(server: ServerProcess, run_id: str) -> list[str]:
    """Every blob of the run (``blobs/{upload id}``) and every stray temp file: what a refused upload must
    not leave."""
    blobs = server.data_dir / "blobs"
    run_dir = blobs / "runs" / run_id
    found = (
        [p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file()]
        if run_dir.exists()
        else []
    )
    found += [f".tmp/{p.name}" for p in (blobs / ".tmp").glob("upload-*")]
    return found


def listed(api: httpx.Client, run_id: str) -> list[str]:
    return [f["path"] for f in api.get(f"/runs/{run_id}/files").json()["data"]]


def test_put_is_idempotent_and_conflicts_on_other_content(api: httpx.Client, server: ServerProcess) -> None:
    run = new_run(api)
    first = put(api, run["id"], "step0/rank0/dump.json", b'{"task": "tensor"}')
    assert first.status_code == 201
    assert first.json() == {"path": "step0/rank0/dump.json", "size": 18, "sha256": sha(b'{"task": "tensor"}')}
    again = put(api, run["id"], "step0/rank0/dump.json", b'{"task": "tensor"}')
    assert again.status_code == 200 and again.json() == first.json()
    other = put(api, run["id"], "step0/rank0/dump.json", b'{"task": "statistics"}')
    assert other.status_code == 409 and "step0/rank0/dump.json" in other.json()["detail"]
    assert listed(api, run["id"]) == ["step0/rank0/dump.json"]
    (blob,) = stored(server, run["id"])  # the retry and the conflict stored nothing
    assert blob.startswith("blobs/")
    assert (server.data_dir / "blobs" / "runs" / run["id"] / blob).read_bytes() == b'{"task": "tensor"}'


def test_sha_mismatch_is_422_and_nothing_is_kept(api: httpx.Client, server: ServerProcess) -> None:
    run = new_run(api)
    resp = put(api, run["id"], "step0/rank0/dump.json", b"abc", digest=sha(b"abd"))
    assert resp.status_code == 422 and "sha256 mismatch" in resp.json()["detail"]
    assert listed(api, run["id"]) == [] and stored(server, run["id"]) == []


@pytest.mark.parametrize("digest", ["sha256=abc", "xyz", "0" * 63, "g" * 64])
def test_bad_sha_header_is_400(api: httpx.Client, server: ServerProcess, digest: str) -> None:
    run = new_run(api)
    resp = put(api, run["id"], "step0/rank0/dump.json", b"abc", digest=digest)
    assert resp.status_code == 400 and "X-Content-SHA256" in resp.json()["detail"]
    assert stored(server, run["id"]) == []


def test_missing_sha_header_is_400(api: httpx.Client) -> None:
    run = new_run(api)
    resp = api.put(f"/runs/{run['id']}/files/step0/rank0/dump.json", content=b"abc")
    assert resp.status_code == 400 and "X-Content-SHA256" in resp.json()["detail"]


@pytest.mark.parametrize(
    "path",
    ["../evil", "step0/../../evil", "step0/./x", "a\\b", "step0//x", "step0/x/", "%2Fetc%2Fpasswd",
     "step0/%2e%2e/%2e%2e/x", "C:/x", "step0/nul%00byte"],
)  # fmt: skip
def test_traversal_paths_are_400(api: httpx.Client, server: ServerProcess, path: str) -> None:
    run = new_run(api)
    # Sent raw, so the client does not normalise the dots away before the server sees them.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("PUT", f"/api/v1/runs/{run['id']}/files/{path}", body=b"x",
                 headers={"X-Content-SHA256": sha(b"x")})  # fmt: skip
    resp = conn.getresponse()
    body = json.loads(resp.read())
    conn.close()
    assert resp.status == 400, (path, resp.status, body)
    assert "file path" in body["detail"]
    assert stored(server, run["id"]) == []
    assert not any(server.data_dir.rglob("evil"))


def test_unknown_run_is_404_and_complete_run_is_409(api: httpx.Client, tmp_path: Path) -> None:
    assert put(api, uuid.uuid4().hex, "step0/rank0/dump.json", b"{}").status_code == 404
    root = build_dump(tmp_path / "d")
    run = new_run(api)
    for path, data in dump_files(root):
        assert put(api, run["id"], path, data).status_code == 201
    queued = api.post(f"/runs/{run['id']}/complete")
    assert queued.status_code == 202 and queued.json()["status"] == "validating"
    # While a worker validates it, the run takes no file: the files validated are the run's.
    early = put(api, run["id"], "step0/rank0/extra.json", b"{}")
    assert early.status_code == 409 and "validating" in early.json()["detail"]
    wait_run(api, run["id"])
    again = api.post(f"/runs/{run['id']}/complete")
    assert again.status_code == 200 and again.json()["status"] == "complete"
    late = put(api, run["id"], "step0/rank0/extra.json", b"{}")
    assert late.status_code == 409 and "complete" in late.json()["detail"]


def test_a_broken_dump_json_makes_the_run_invalid_naming_file_and_entry(api: httpx.Client) -> None:
    run = new_run(api)
    good = b'{"task": "statistics", "level": "L1", "dump_data_dir": null, "data": {}}'
    assert put(api, run["id"], "step0/rank0/dump.json", good).status_code == 201
    broken = (
        b'{"task": "statistics", "level": "L1", "data": {"Torch.add.0.forward": {"output": [{"Max": 1}]}}}'
    )
    assert put(api, run["id"], "step0/rank1/dump.json", broken).status_code == 201
    assert api.post(f"/runs/{run['id']}/complete").status_code == 202
    got = wait_run(api, run["id"], status="invalid")
    assert got["error"].startswith("step0/rank1/dump.json: "), got["error"]
    assert "Torch.add.0.forward" in got["error"]  # the entry
    assert "/blobs/" not in got["error"]  # the server's own paths are not shown
    # Nothing of the invalid run is published: no parsed columns, and no comparison can use it.
    assert api.post("/comparisons", json={"target_run": run["id"], "bench_run": run["id"]}).status_code == 409


def test_a_malformed_dump_json_is_named_with_its_line(api: httpx.Client) -> None:
    run = new_run(api)
    broken = b'{\n "task": "tensor",\n "data": {,\n}'
    assert put(api, run["id"], "step0/rank0/dump.json", broken).status_code == 201
    assert api.post(f"/runs/{run['id']}/complete").status_code == 202
    error = wait_run(api, run["id"], status="invalid")["error"]
    assert error.startswith("step0/rank0/dump.json: line 3 column"), error


def test_complete_without_dump_json_is_422(api: httpx.Client) -> None:
    run = new_run(api)
    assert put(api, run["id"], "step0/rank0/stack.json", b"{}").status_code == 201
    resp = api.post(f"/runs/{run['id']}/complete")
    assert resp.status_code == 422 and "no dump.json" in resp.json()["detail"]


# -- a server with tokens and a small size limit ----------------------------------------------------------
@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    env = {"PARITY_TOKENS": f"{RW},{RO}:ro", "PARITY_MAX_UPLOAD_BYTES": str(LIMIT), "PARITY_WORKERS": "0"}
    srv = ServerProcess(tmp_path_factory.mktemp("guarded"), env).start()
    yield srv
    srv.stop()


def test_tokens_401_and_403_store_nothing(guarded: ServerProcess) -> None:
    with guarded.client(RW) as rw, guarded.client(RO) as ro, guarded.client() as anon, \
            guarded.client("wrong") as wrong:  # fmt: skip
        assert httpx.get(f"{guarded.url}/healthz").status_code == 200
        assert anon.get("/runs").status_code == 401
        assert wrong.get("/runs").status_code == 401
        assert ro.get("/runs").status_code == 200
        assert ro.post("/runs", json={"name": "x", "device": "npu"}).status_code == 403
        run = new_run(rw)
        for client, code in ((anon, 401), (wrong, 401), (ro, 403)):
            resp = put(client, run["id"], "step0/rank0/dump.json", b"{}")
            assert resp.status_code == code and "Authorization" in resp.json()["detail"]
            assert client.delete(f"/runs/{run['id']}").status_code == code
        assert stored(guarded, run["id"]) == [] and listed(rw, run["id"]) == []
        assert put(rw, run["id"], "step0/rank0/dump.json", b"{}").status_code == 201
        assert listed(ro, run["id"]) == ["step0/rank0/dump.json"]


def test_oversize_by_declared_length_is_413(guarded: ServerProcess) -> None:
    with guarded.client(RW) as rw:
        run = new_run(rw)
        resp = put(rw, run["id"], "step0/rank0/dump_tensor_data/x.pt", b"x" * (LIMIT + 1))
        assert resp.status_code == 413 and "Content-Length" in resp.json()["detail"]
        assert stored(guarded, run["id"]) == [] and listed(rw, run["id"]) == []
        assert put(rw, run["id"], "step0/rank0/dump_tensor_data/x.pt", b"x" * LIMIT).status_code == 201


def test_oversize_by_streamed_bytes_is_413(guarded: ServerProcess) -> None:
    data = b"y" * (LIMIT * 4)

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        for i in range(0, len(data), 1000):
            yield data[i : i + 1000]

    with guarded.client(RW) as rw:
        run = new_run(rw)
        resp = rw.put(f"/runs/{run['id']}/files/step0/rank0/big.pt", content=chunks(),
                      headers={"X-Content-SHA256": sha(data)})  # fmt: skip
        assert resp.status_code == 413 and "body exceeds" in resp.json()["detail"]
        assert stored(guarded, run["id"]) == [] and listed(rw, run["id"]) == []


def test_client_gone_mid_upload_leaves_nothing(api: httpx.Client, server: ServerProcess) -> None:
    import socket
    import time

    run = new_run(api)
    data = b"z" * 100_000
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(
            f"PUT /api/v1/runs/{run['id']}/files/step0/rank0/x.pt HTTP/1.1\r\nHost: x\r\n"
            f"X-Content-SHA256: {sha(data)}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data[:5000]
        )
        time.sleep(0.3)  # let the server start streaming into its temp file
    deadline = time.monotonic() + 10
    while stored(server, run["id"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stored(server, run["id"]) == [] and listed(api, run["id"]) == []
    assert put(api, run["id"], "step0/rank0/x.pt", data).status_code == 201  # the retry succeeds


def test_a_path_segment_longer_than_a_file_name_is_stored(api: httpx.Client, server: ServerProcess) -> None:
    # The client's path is a database key, never a file name in the store: a 300-character segment (over
    # the 255 bytes a file name may have) is stored and listed like any other.
    run = new_run(api)
    path = "step0/rank0/dump_tensor_data/" + "a" * 300 + ".pt"
    assert put(api, run["id"], path, b"t").status_code == 201
    assert listed(api, run["id"]) == [path] and len(stored(server, run["id"])) == 1
