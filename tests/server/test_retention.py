"""Retention (issue 12): ``parity gc`` and the server's periodic sweep remove orphaned blobs, stale temp files
and job folders, and runs older than ``PARITY_RETENTION_DAYS`` that are not marked keep."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from parity.server.db import Database
from parity.server.jobs.base import NullQueue
from parity.server.main import create_app
from parity.server.migrate import upgrade
from parity.server.models import Run, utcnow
from parity.server.services.comparisons import ComparisonService
from parity.server.services.retention import RetentionService
from parity.server.services.runs import RunService
from parity.server.settings import Settings
from parity.server.store import FileStore, open_store
from sqlalchemy import update

from tests.server.conftest import REPO, build_dump
from tests.server.test_hardening import API, new_run, upload
from tests.workers import validation_thread

OLD = time.time() - 7200  # older than the default grace of an hour


class World:
    """A database, a file store and the services over them, without an app."""

    def __init__(self, tmp_path: Path, retention_days: float | None = None) -> None:
        self.settings = Settings(data_dir=tmp_path / "data", workers=0, retention_days=retention_days)
        upgrade(self.settings.resolved_database_url)
        self.db = Database.connect(self.settings.resolved_database_url)
        store = open_store(self.settings.resolved_store_url, tmp_path / "data" / "tmp")
        assert isinstance(store, FileStore)
        self.store = store
        self.runs = RunService(self.db, store, 1 << 30)
        self.comparisons = ComparisonService(self.db, store, NullQueue())
        self.retention = RetentionService(
            self.db, store, self.runs, self.comparisons, retention_days=retention_days, grace_seconds=3600
        )

    def blob(self, key: str, mtime: float = OLD) -> Path:
        path = self.store.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 10)
        os.utime(path, (mtime, mtime))
        return path


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.db.dispose()


def test_orphaned_blobs_go_and_recorded_or_young_ones_stay(world: World, tmp_path: Path) -> None:
    from parity.server.schemas import RunCreate

    run = world.runs.create(RunCreate(name="r", device="npu"))
    with TestClient(create_app(world.settings)) as client, validation_thread(world.settings):
        upload(client, run.id, build_dump(tmp_path / "dump"))
    recorded = [world.store.root / key for key in _blob_keys(world, run.id)]
    sidecars = list((world.store.root / "runs" / run.id).rglob("*.columns"))
    assert sidecars  # complete stored the dump.json's parsed columns beside it
    recorded += sidecars
    for path in recorded:
        os.utime(path, (OLD, OLD))
    crashed = world.blob(f"runs/{run.id}/blobs/crashed-before-its-row")  # published, never recorded
    in_flight = world.blob(f"runs/{run.id}/blobs/in-flight", mtime=time.time())  # its row may come yet
    deleted_run = world.blob("runs/0123456789abcdef0123456789abcdef/blobs/x")  # its delete was cut short
    deleted_comparison = world.blob("comparisons/fedcba9876543210fedcba9876543210/rank0/report.xlsx")

    report = world.retention.sweep(dry_run=True)
    assert len(report.orphan_blobs) == 3 and crashed.exists()  # a dry run removes nothing
    report = world.retention.sweep()
    assert sorted(report.orphan_blobs) == sorted(
        p.relative_to(world.store.root).as_posix() for p in (crashed, deleted_run, deleted_comparison)
    )
    assert report.orphan_bytes == 30
    assert not crashed.exists() and not deleted_run.exists() and not deleted_comparison.exists()
    assert in_flight.exists() and all(p.exists() for p in recorded)


def _blob_keys(world: World, run_id: str) -> list[str]:
    from parity.server.repositories import RunRepository

    with world.db.read() as session:
        return [f.blob for f in RunRepository(session).files(run_id)]


def test_stale_temp_files_go_but_live_ones_stay(world: World) -> None:
    tmp = world.store.root / ".tmp"
    stale = tmp / "upload-stale"
    stale.write_bytes(b"partial")
    os.utime(stale, (OLD, OLD))
    fresh = world.store.new_temp()  # an upload streaming now
    busy = tmp / "job-abcdef12-xyz"  # the staging folder of a running job
    busy.mkdir()
    os.utime(busy, (OLD, OLD))
    assert world.store.sweep_temp(3600, busy=["job-abcdef12-"]) == 1
    assert not stale.exists() and fresh.exists() and busy.exists()


def test_runs_past_retention_go_unless_kept(tmp_path: Path) -> None:
    from parity.server.schemas import RunCreate

    world = World(tmp_path, retention_days=30)
    try:
        old = world.runs.create(RunCreate(name="old", device="npu"))
        kept = world.runs.create(RunCreate(name="kept", device="npu", keep=True))
        baseline = world.runs.create(RunCreate(name="baseline", device="npu"))  # kept as the baseline
        recent = world.runs.create(RunCreate(name="recent", device="npu"))
        with world.db.write() as session:
            session.execute(update(Run).where(Run.id.in_([old.id, kept.id, baseline.id]))
                            .values(created_at=utcnow() - timedelta(days=31)))  # fmt: skip
            session.execute(update(Run).where(Run.id == baseline.id).values(baseline=True))
        world.blob(f"runs/{old.id}/blobs/a", mtime=time.time())
        report = world.retention.sweep()
        assert report.expired_runs == [old.id]
        remaining = {r.id for r in world.runs.search(project=None, name=None, device=None, status=None,
                                                     tags=[], limit=10, offset=0).data}  # fmt: skip
        assert remaining == {kept.id, baseline.id, recent.id}
        assert not (world.store.root / "runs" / old.id).exists()
    finally:
        world.db.dispose()
    off = World(tmp_path / "off", retention_days=None)
    try:
        off.runs.create(RunCreate(name="x", device="npu"))
        assert off.retention.sweep(now=utcnow() + timedelta(days=10_000)).expired_runs == []
    finally:
        off.db.dispose()


def test_the_server_sweeps_periodically(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "data", workers=0, sweep_interval_seconds=0.2, temp_grace_seconds=0
    )
    with TestClient(create_app(settings)) as client:
        run = new_run(client)
        orphan = settings.resolved_data_dir / "blobs" / "runs" / run["id"] / "blobs" / "orphan"
        orphan.parent.mkdir(parents=True)
        orphan.write_bytes(b"x")
        deadline = time.monotonic() + 30
        while orphan.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not orphan.exists()
        assert client.get(f"{API}/runs/{run['id']}").status_code == 200


def test_parity_gc_command(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.blob("runs/0123456789abcdef0123456789abcdef/blobs/x")
    world.db.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARITY_")}
    env["PARITY_DATA_DIR"] = str(tmp_path / "data")
    for args, verb in ((["--dry-run"], "would remove"), ([], "removed")):
        proc = subprocess.run([sys.executable, "-m", "parity", "gc", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "orphaned blob runs/0123456789abcdef0123456789abcdef/blobs/x" in proc.stdout
        assert f"parity gc: {verb} 0 expired run(s), 1 orphaned blob(s) (10 bytes)" in proc.stdout
    assert not any((tmp_path / "data" / "blobs" / "runs").rglob("x"))
