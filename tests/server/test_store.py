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


@pytest.mark.parametrize("removals", [1, 4])
def test_publish_survives_a_delete_of_the_run_between_mkdir_and_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, removals: int
) -> None:
    """What ``test_upload_race`` met on PostgreSQL: the run's folder removed under an upload's publish."""
    import parity.server.store as store_module

    store = FileStore(tmp_path / "blobs")
    real_replace = store_module.os.replace
    left = [removals]

    def replace_after_a_delete(src: Path, dst: Path) -> None:
        if left[0]:
            left[0] -= 1
            store.delete_prefix("runs/r")  # as ``RunService.delete`` does, concurrently
        real_replace(src, dst)

    monkeypatch.setattr(store_module.os, "replace", replace_after_a_delete)
    temp = store.new_temp()
    temp.write_bytes(b"data")
    store.publish(temp, "runs/r/blobs/k")
    assert not temp.exists() and b"".join(store.iter_bytes("runs/r/blobs/k")) == b"data"


def test_publish_gives_up_on_a_folder_that_keeps_vanishing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import parity.server.store as store_module

    store = FileStore(tmp_path / "blobs")
    real_replace = store_module.os.replace

    def replace_after_a_delete(src: Path, dst: Path) -> None:
        store.delete_prefix("runs/r")
        real_replace(src, dst)

    monkeypatch.setattr(store_module.os, "replace", replace_after_a_delete)
    temp = store.new_temp()
    temp.write_bytes(b"data")
    with pytest.raises(FileNotFoundError):
        store.publish(temp, "runs/r/blobs/k")
    assert temp.exists()  # nothing lost: the upload's clean-up removes it
