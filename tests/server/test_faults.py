"""The fault suite (issue 12): a full filesystem and SIGKILL storms against a real ``parity server``, and
after each the invariants:

* every acknowledged file (a 201) is stored, readable, with the sha256 it was acknowledged with;
* every comparison once seen succeeded is still succeeded, with the same summary and row count;
* after ``parity gc`` no blob lacks a row, no comparison folder lacks its comparison, no temp file is left.

The full filesystem is a small tmpfs where the test can mount one (root on Linux), else a store that raises
ENOSPC inside the app.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from parity.server.main import create_app
from parity.server.settings import Settings
from parity.server.store import FileStore
from sqlalchemy import create_engine, text

from tests.server.conftest import REPO, ServerProcess, build_dump, put, sha, upload_run, wait_comparison

Acked = tuple[str, str, str]  # (run id, path, sha256)


# -- invariants ---------------------------------------------------------------------------------------------
def assert_acknowledged_files_intact(data_dir: Path, acked: list[Acked]) -> None:
    engine = create_engine(f"sqlite:///{data_dir / 'parity.db'}")
    try:
        with engine.connect() as conn:
            for run_id, path, digest in acked:
                row = conn.execute(text("SELECT sha256, blob FROM run_files WHERE run_id = :r AND path = :p"),
                                   {"r": run_id, "p": path}).one_or_none()  # fmt: skip
                assert row is not None, f"acknowledged {run_id}/{path} has no row"
                assert row.sha256 == digest
                blob = data_dir / "blobs" / row.blob
                assert hashlib.sha256(blob.read_bytes()).hexdigest() == digest, f"{blob} changed"
    finally:
        engine.dispose()


def run_gc(data_dir: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARITY_")}
    env["PARITY_DATA_DIR"] = str(data_dir)
    proc = subprocess.run([sys.executable, "-m", "parity", "gc", "--grace-seconds", "0"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def assert_no_orphans(data_dir: Path) -> None:
    blobs = data_dir / "blobs"
    engine = create_engine(f"sqlite:///{data_dir / 'parity.db'}")
    try:
        with engine.connect() as conn:
            blobs_of_rows = set(conn.scalars(text("SELECT blob FROM run_files")))
            # A dump.json's parsed-columns sidecar lives beside its blob, as long as it.
            recorded = blobs_of_rows | {f"{blob}.columns" for blob in blobs_of_rows}
            comparisons = set(conn.scalars(text("SELECT id FROM comparisons")))
    finally:
        engine.dispose()
    stored = {p.relative_to(blobs).as_posix() for p in (blobs / "runs").rglob("*") if p.is_file()}
    assert stored <= recorded, f"orphaned blobs: {sorted(stored - recorded)[:5]}"
    folders = {p.name for p in (blobs / "comparisons").glob("*")}
    assert folders <= comparisons, f"orphaned reports: {sorted(folders - comparisons)[:5]}"
    assert not any((blobs / ".tmp").iterdir()), "temp files left"


# -- a full filesystem --------------------------------------------------------------------------------------
@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs, or a skip where this process may not mount one (the ENOSPC store test covers it)."""
    yield from _mounted(tmp_path / "small-disk", "16m")


@pytest.fixture
def tmpfs_32m(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB tmpfs (room for a comparison of 42,240 rows), or a skip as above."""
    yield from _mounted(tmp_path / "small-disk", "32m")


def _mounted(mount: Path, size: str) -> Iterator[Path]:
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(path: Path) -> None:
    """Take every byte left on the filesystem of ``path``, as another process on the host might."""
    try:
        fh = open(path, "ab", buffering=0)  # noqa: SIM115 - unbuffered: a failed write fails here, not at close
    except OSError as exc:
        assert exc.errno == errno.ENOSPC  # already full to the last block
        return
    with fh:
        block = b"\0" * 65536
        while True:
            try:
                fh.write(block)
                fh.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        for size in (4096, 512, 1):  # the last partial blocks
            try:
                fh.write(b"\0" * size)
                fh.flush()
            except OSError:
                pass


def test_full_filesystem(tmpfs: Path, tmp_path: Path) -> None:
    data_dir = tmpfs / "data"
    srv = ServerProcess(data_dir, {"PARITY_WORKERS": "0", "PARITY_RESERVE_BYTES": str(1 << 20)})
    srv.log_path = tmp_path / "server.log"  # the log must not share the full disk
    srv.start()
    try:
        api = srv.client()
        run = api.post("/runs", json={"name": "big", "device": "npu"}).json()
        acked: list[Acked] = []
        for i in range(64):  # 16 MiB of disk: full long before 64 x 512 KiB
            data = os.urandom(512 * 1024)
            resp = put(api, run["id"], f"step0/rank0/f{i}.bin", data)
            if resp.status_code != 201:
                break
            acked.append((run["id"], f"step0/rank0/f{i}.bin", sha(data)))
        assert resp.status_code == 507, resp.text
        assert resp.json()["detail"].startswith("storage is full")
        assert acked
        _fill(tmpfs / "filler")
        # The database fills too: every write answers 507, never 500.
        big = {"name": "meta", "device": "npu", "metadata": {"pad": "x" * 400_000}}
        # Names are unique in a project: each try a name of its own.
        statuses = [api.post("/runs", json={**big, "name": f"meta-{i}"}).status_code for i in range(8)]
        assert set(statuses) <= {201, 507} and statuses[-1] == 507, statuses
        assert api.get("/runs").status_code == 200  # reads keep working
        assert api.get(f"/runs/{run['id']}/files").json()["count"] == len(acked)
        assert_acknowledged_files_intact(data_dir, acked)

        srv.kill()  # a restart on a full disk starts, and can still free space
        srv.start()
        api = srv.client()
        assert api.post("/runs", json=big).status_code == 507
        resp = api.delete(f"/runs/{run['id']}")
        assert resp.status_code == 204, resp.text
        for leftover in api.get("/runs").json()["data"]:
            assert api.delete(f"/runs/{leftover['id']}").status_code == 204
        after = api.post("/runs", json={"name": "after", "device": "npu"})
        assert after.status_code == 201, after.text
        data = os.urandom(64 * 1024)
        assert put(api, after.json()["id"], "step0/rank0/x.bin", data).status_code == 201
        assert_acknowledged_files_intact(data_dir, [(after.json()["id"], "step0/rank0/x.bin", sha(data))])
    finally:
        srv.stop()
    (tmpfs / "filler").unlink(missing_ok=True)
    run_gc(data_dir)
    assert_no_orphans(data_dir)


def _record_comparison(data_dir: Path, target: str, bench: str, rows: int) -> str:
    """A succeeded comparison of ``rows`` rows between two runs, written to the server's database as its
    workers would (the rows are what make its delete's WAL big)."""
    from parity.server.db import Database
    from parity.server.models import Comparison, ComparisonRow
    from sqlalchemy import insert

    db = Database.connect(Settings(data_dir=data_dir).resolved_database_url)
    cid = uuid.uuid4().hex
    try:
        with db.write() as session:
            session.add(Comparison(id=cid, target_run_id=target, bench_run_id=bench, status="succeeded"))
        cells = json.dumps(["Torch.add.0.forward.output.0", 0.999] + ["x" * 24] * 4)
        for start in range(0, rows, 5000):
            with db.write() as session:
                session.execute(insert(ComparisonRow), [
                    {"comparison_id": cid, "rank": 0, "idx": k, "api": f"Torch.add.{k}.forward",
                     "status": "pass", "highlight": None, "name": f"Torch.add.{k}.forward.output.0",
                     "failing": False, "cells": cells, "score": None}
                    for k in range(start, min(rows, start + 5000))])  # fmt: skip
        db.checkpoint()  # as SQLite's own checkpoints would have by the time the disk fills
    finally:
        db.dispose()
    return cid


def test_a_run_with_a_big_comparison_is_deleted_on_a_full_disk_after_a_restart(
    tmpfs_32m: Path, tmp_path: Path
) -> None:
    """Issue 37: the delete of a run with a 42,240-row comparison needed more WAL than the reserve; now its
    blobs go first and its rows in batches, each batch's WAL given back before the next."""
    data_dir = tmpfs_32m / "data"
    srv = ServerProcess(data_dir, {"PARITY_WORKERS": "0", "PARITY_RESERVE_BYTES": str(1 << 20)})
    srv.log_path = srv.server.log_path = tmp_path / "server.log"  # the log must not share the full disk
    srv.start()
    try:
        api = srv.client()
        target, bench = (api.post("/runs", json={"name": n, "device": "npu"}).json() for n in ("t", "b"))
        assert put(api, target["id"], "step0/rank0/blob.bin", os.urandom(2 << 20)).status_code == 201
        cid = _record_comparison(data_dir, target["id"], bench["id"], 42_240)
        assert api.get(f"/comparisons/{cid}").status_code == 200
        _fill(tmpfs_32m / "filler")
        big = {"device": "npu", "metadata": {"pad": "x" * 400_000}}
        statuses = [api.post("/runs", json={**big, "name": f"more-{i}"}).status_code for i in range(8)]
        assert statuses[-1] == 507, statuses  # the database is full too
        srv.kill()  # a restart on a full disk
        srv.start()
        api = srv.client()
        resp = api.delete(f"/runs/{target['id']}", params={"with_comparisons": "true"})
        assert resp.status_code == 204, srv.log()[-4000:]
        assert api.get(f"/comparisons/{cid}").status_code == 404
        assert api.get(f"/runs/{target['id']}").status_code == 404
        assert "blobs removed before its rows" in srv.log()
        assert api.post("/runs", json={"name": "after", "device": "npu"}).status_code == 201
    finally:
        srv.stop()
    (tmpfs_32m / "filler").unlink(missing_ok=True)


class FullStore(FileStore):
    """A file store on a disk that is full: nothing can be published."""

    def publish(self, temp: Path, key: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(self.root / key))


def test_a_store_raising_enospc_answers_507(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("parity.server.main.open_store", lambda url, tmp: FullStore(tmp_path / "blobs"))
    with TestClient(create_app(Settings(data_dir=tmp_path / "data", workers=0))) as client:
        run = client.post("/api/v1/runs", json={"name": "r", "device": "npu"}).json()
        resp = client.put(f"/api/v1/runs/{run['id']}/files/step0/rank0/a.bin", content=b"abc",
                          headers={"X-Content-SHA256": sha(b"abc")})  # fmt: skip
        assert resp.status_code == 507
        detail = resp.json()["detail"]
        assert detail.startswith("storage is full") and "delete runs" in detail
        assert str(tmp_path) not in detail
        assert client.get(f"/api/v1/runs/{run['id']}/files").json()["count"] == 0
        assert client.delete(f"/api/v1/runs/{run['id']}").status_code == 204
    assert not any((tmp_path / "blobs" / ".tmp").iterdir())  # the refused upload's temp file is gone


# -- SIGKILL storms -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sigkill_storms_during_uploads_and_compares(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    srv = ServerProcess(data_dir, {"PARITY_WORKERS": "1", "PARITY_JOB_LEASE_SECONDS": "5"}).start()
    rng = random.Random(12)
    with srv.client() as api:
        target = upload_run(api, build_dump(tmp_path / "npu", perturb=0.5))
        bench = upload_run(api, build_dump(tmp_path / "gpu"))
    pair = {"target_run": target["id"], "bench_run": bench["id"]}
    acked: list[Acked] = []
    submitted: list[str] = []
    finished: dict[str, tuple[Any, int]] = {}
    lock = threading.Lock()

    def note_finished(client: httpx.Client, cid: str) -> None:
        body = client.get(f"/comparisons/{cid}").json()
        if body.get("status") == "succeeded" and cid not in finished:
            rows = client.get(f"/comparisons/{cid}/rows", params={"limit": 10000}).json()["count"]
            with lock:
                finished[cid] = (body["summary"], rows)

    def uploader(stop: threading.Event, k: int) -> None:
        with srv.client() as client:
            try:
                run = client.post("/runs", json={"name": f"storm-{uuid.uuid4().hex[:6]}", "device": "npu"})
                run_id = run.json()["id"]
                for i in range(10_000):
                    if stop.is_set():
                        return
                    data = os.urandom(rng.randint(1, 256) * 1024)
                    path = f"step0/rank{k}/file{i}.bin"
                    if put(client, run_id, path, data).status_code == 201:
                        with lock:
                            acked.append((run_id, path, sha(data)))
            except (httpx.HTTPError, KeyError, ValueError):
                return  # the server died under us

    def comparer(stop: threading.Event) -> None:
        with srv.client() as client:
            try:
                resp = client.post("/comparisons", json=pair)
                if resp.status_code == 202:
                    with lock:
                        submitted.append(resp.json()["id"])
                while not stop.is_set():
                    for cid in list(submitted):
                        note_finished(client, cid)
                    time.sleep(0.2)
            except (httpx.HTTPError, KeyError, ValueError):
                return

    with srv.client() as api:  # one comparison finished before the storm: it must come out of it intact
        first = api.post("/comparisons", json=pair).json()["id"]
        wait_comparison(api, first, timeout=300)
        submitted.append(first)
        note_finished(api, first)
    assert first in finished

    rounds = 3
    for _ in range(rounds):
        stop = threading.Event()
        threads = [threading.Thread(target=uploader, args=(stop, k)) for k in range(4)]
        threads.append(threading.Thread(target=comparer, args=(stop,)))
        before = len(acked)
        for thread in threads:
            thread.start()
        # Kill mid-traffic: once uploads are flowing (a shared machine may take a while), at a random moment.
        deadline = time.monotonic() + 60
        while len(acked) < before + 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.5))
        srv.kill()
        stop.set()
        for thread in threads:
            thread.join(60)
        srv.start()
    with srv.client() as api:
        for cid in submitted:
            body = wait_comparison(api, cid, timeout=600)
            assert body["status"] == "succeeded", body
        for cid, (summary, rows) in finished.items():
            body = api.get(f"/comparisons/{cid}").json()
            assert body["status"] == "succeeded" and body["summary"] == summary
            assert api.get(f"/comparisons/{cid}/rows", params={"limit": 10000}).json()["count"] == rows
        all_done = {cid: api.get(f"/comparisons/{cid}").json()["summary"]["rows"] for cid in submitted}
    srv.stop()
    assert_acknowledged_files_intact(data_dir, acked)
    gc_line = run_gc(data_dir)
    assert_no_orphans(data_dir)
    print(f"\nfault suite: {rounds} SIGKILLs; {len(acked)} acknowledged files readable with their sha256; "
          f"{len(submitted)} comparisons submitted, all succeeded ({sum(all_done.values())} rows), "
          f"{len(finished)} seen succeeded before a kill and intact after; {gc_line}; 0 orphans after gc")
    assert acked and submitted
