"""``parity gc --dry-run`` writes nothing: no data folder or database where there was none, no change where
there is one (not even a migration), and it says where it looked."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from parity.server.main import create_app
from parity.server.settings import Settings

from parity.cli import main


@pytest.fixture(autouse=True)
def data_from_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PARITY_DATA_DIR", "PARITY_DATABASE_URL", "PARITY_STORE_URL", "PARITY_RETENTION_DAYS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file's size and time; SQLite's own ``-wal``/``-shm`` companions (a reader makes them for the
    time it reads, in WAL mode) aside."""
    return {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
            if p.is_file() and not p.name.endswith(("-wal", "-shm"))}  # fmt: skip


def test_a_dry_run_where_there_is_no_data_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["gc", "--dry-run"]) == 0
    out = capsys.readouterr().out
    data = tmp_path / "parity-data"
    store = (data / "blobs").as_uri()
    assert f"looking at the database sqlite:///{data / 'parity.db'} and the store {store}" in out
    assert f"no database at {data / 'parity.db'}: nothing to remove" in out
    assert list(tmp_path.iterdir()) == []


def test_a_dry_run_over_data_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings(data_dir=tmp_path / "parity-data", workers=0)
    with TestClient(create_app(settings)) as client:  # a server's data folder, with one run
        assert client.post("/api/v1/runs", json={"name": "r", "device": "cpu"}).status_code == 201
    orphan = tmp_path / "parity-data" / "blobs" / "runs" / ("0" * 32) / "blobs" / "x"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"orphan")
    before = files(tmp_path)
    assert main(["gc", "--dry-run", "--grace-seconds", "0"]) == 0
    out = capsys.readouterr().out
    assert f"orphaned blob runs/{'0' * 32}/blobs/x" in out and "would remove" in out
    assert files(tmp_path) == before
