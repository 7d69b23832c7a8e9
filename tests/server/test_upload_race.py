"""Racing uploads of one path against a real server: exactly one wins, and the stored bytes always hash to
the sha256 the run's file list records (one row, one blob), on SQLite and PostgreSQL with the file store.
The S3 store's race is in ``test_s3_store.py``."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.server.conftest import ServerProcess, new_run, put, sha

N = 8
SIZE = 256 * 1024  # several body chunks, so the racing streams overlap on the server


def bodies(distinct: bool, seed: int) -> list[bytes]:
    base = hashlib.sha256(f"{seed}".encode()).digest() * (SIZE // 32)
    return [bytes([i]) + base[1:] if distinct else base for i in range(N)]


def race(server: ServerProcess, calls: list[Callable[[httpx.Client], int]]) -> list[int]:
    """Run each call on its own connection, all released at once; their status codes in order."""
    barrier = threading.Barrier(len(calls))

    def one(call: Callable[[httpx.Client], int]) -> int:
        with server.client() as client:
            client.get("/runs", params={"limit": 1})  # connect before the barrier
            barrier.wait(timeout=60)
            return call(client)

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(one, calls))


def race_puts(server: ServerProcess, run_id: str, path: str, datas: list[bytes]) -> list[int]:
    return race(server, [lambda c, d=d: put(c, run_id, path, d).status_code for d in datas])  # type: ignore[misc]


def blob_files(server: ServerProcess, run_id: str) -> list[Path]:
    run_dir = server.data_dir / "blobs" / "runs" / run_id
    return [p for p in run_dir.rglob("*") if p.is_file()] if run_dir.exists() else []


def temp_files(server: ServerProcess) -> list[Path]:
    return list((server.data_dir / "blobs" / ".tmp").glob("upload-*"))


def assert_consistent(api: httpx.Client, server: ServerProcess, run_id: str, paths: list[str]) -> None:
    """One row per path, one blob per row, and each blob's bytes are the row's size and sha256."""
    files = api.get(f"/runs/{run_id}/files").json()["data"]
    assert sorted(f["path"] for f in files) == sorted(paths)
    blobs = {sha(p.read_bytes()): p.stat().st_size for p in blob_files(server, run_id)}
    assert len(blob_files(server, run_id)) == len(paths)  # the losers' blobs are gone
    assert blobs == {f["sha256"]: f["size"] for f in files}
    assert temp_files(server) == []


def test_racing_puts_of_the_same_content_store_it_once(api: httpx.Client, server: ServerProcess) -> None:
    run = new_run(api)
    paths = [f"step0/rank0/dump_tensor_data/t{i}.pt" for i in range(3)]
    for seed, path in enumerate(paths):
        codes = race_puts(server, run["id"], path, bodies(distinct=False, seed=seed))
        assert sorted(codes) == [200] * (N - 1) + [201], codes
    assert_consistent(api, server, run["id"], paths)


def test_racing_puts_of_different_content_one_wins(api: httpx.Client, server: ServerProcess) -> None:
    run = new_run(api)
    paths = [f"step0/rank0/dump_tensor_data/d{i}.pt" for i in range(3)]
    for seed, path in enumerate(paths):
        datas = bodies(distinct=True, seed=seed)
        codes = race_puts(server, run["id"], path, datas)
        assert sorted(codes) == [201] + [409] * (N - 1), codes
        (recorded,) = [f for f in api.get(f"/runs/{run['id']}/files").json()["data"] if f["path"] == path]
        assert recorded["sha256"] == sha(datas[codes.index(201)])  # the one told 201 is the one kept
    assert_consistent(api, server, run["id"], paths)


def test_delete_racing_uploads_leaves_nothing(api: httpx.Client, server: ServerProcess) -> None:
    run = new_run(api)
    datas = bodies(distinct=True, seed=99)
    calls: list[Callable[[httpx.Client], int]] = [
        lambda c, i=i, d=d: put(c, run["id"], f"step0/rank0/f{i}.pt", d).status_code  # type: ignore[misc]
        for i, d in enumerate(datas)
    ]
    calls.insert(N // 2, lambda c: c.delete(f"/runs/{run['id']}").status_code)
    codes = race(server, calls)
    assert codes[N // 2] == 204
    assert set(codes) <= {201, 204, 404}, codes
    assert api.get(f"/runs/{run['id']}").status_code == 404
    assert blob_files(server, run["id"]) == [] and temp_files(server) == []
