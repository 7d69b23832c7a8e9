"""Blob stores without a server: URL parsing, atomic publish, confinement to the root."""

from __future__ import annotations

from pathlib import Path

import pytest
from parity.server.errors import StoreError
from parity.server.store import FileStore, open_store


def test_file_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(open_store((tmp_path / "a").as_uri(), tmp_path), FileStore)
    assert open_store((tmp_path / "a").as_uri(), tmp_path).root == (tmp_path / "a").resolve()  # type: ignore[attr-defined]
    monkeypatch.chdir(tmp_path)
    assert open_store("file://rel/blobs", tmp_path).root == (tmp_path / "rel" / "blobs").resolve()  # type: ignore[attr-defined]


@pytest.mark.parametrize("url", ["ftp://host/x", "blobs", "s3://"])
def test_bad_urls_name_the_valid_schemes(url: str, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="PARITY_STORE_URL"):
        open_store(url, tmp_path)


def test_publish_is_a_rename_and_keys_stay_inside(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "blobs")
    temp = store.new_temp()
    temp.write_bytes(b"data")
    store.publish(temp, "runs/r/step0/rank0/dump.json")
    assert not temp.exists() and store.exists("runs/r/step0/rank0/dump.json")
    assert b"".join(store.iter_bytes("runs/r/step0/rank0/dump.json")) == b"data"
    with pytest.raises(StoreError, match="leaves the store"):
        store.local_path("runs/../../outside")
    store.delete_prefix("runs/r")
    assert not store.exists("runs/r/step0/rank0/dump.json")
    (store.root / ".tmp" / "job-stale").mkdir()
    store.new_temp()
    assert store.sweep_temp() == 2 and not list((store.root / ".tmp").iterdir())
