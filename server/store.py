"""Blob stores: where uploaded dump files and generated reports live, chosen by ``PARITY_STORE_URL``.

``file:///path`` keeps blobs as plain files under one root, so workers read (hard-link) them in place.
``s3://bucket/prefix`` uses boto3 with the usual ``AWS_*`` variables (``AWS_ENDPOINT_URL`` for a local
S3-compatible server); workers stream the blobs they need into a bounded cache (``blob_cache.BlobCache``).

Uploads are written to a local temp file first (``new_temp``) and made visible with ``publish``, which is
atomic on both stores, so a reader never sees half a file and a refused upload leaves nothing behind. Each
upload is published under its own key (``upload_key``: ``runs/{run}/blobs/{upload id}``), never under the
client's path: two uploads of one path cannot overwrite each other's bytes, and the database row
(``run_files``: path -> sha256, size, blob key) alone says which blob is the file.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

from parity.server.errors import StoreError

logger = logging.getLogger(__name__)

CHUNK = 1024 * 1024
#: a publish whose folder a concurrent delete of the run keeps removing tries this many times
PUBLISH_ATTEMPTS = 5


class BlobStore(Protocol):
    """What the services and workers need from a store; keys are ``/``-separated relative paths."""

    url: str

    def new_temp(self) -> Path:
        """A fresh, empty local file to stream an upload into (on the same filesystem as the store when
        that makes ``publish`` a rename)."""
        ...

    def publish(self, temp: Path, key: str) -> None:
        """Move ``temp`` to ``key`` atomically (keys of uploads are unique, so nothing is replaced);
        ``temp`` is gone afterwards."""
        ...

    def delete(self, key: str) -> None:
        """Remove one blob (an upload that lost its race); a missing blob is not an error."""
        ...

    def put_file(self, source: Path, key: str) -> None:
        """Copy a local file to ``key`` (reports); ``source`` stays."""
        ...

    def local_path(self, key: str) -> Path | None:
        """A local path to read ``key`` in place, or None when the store is remote."""
        ...

    def download(self, key: str, dest: Path) -> None: ...

    def iter_bytes(self, key: str) -> Iterator[bytes]: ...

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int | None:
        """The blob's size in bytes, or None when there is no such blob."""
        ...

    def delete_prefix(self, prefix: str) -> None:
        """Remove every blob under ``prefix/`` (a run's files, a comparison's reports)."""
        ...

    def iter_blobs(self, prefix: str) -> Iterator[tuple[str, float, int]]:
        """(key, last-modified time as a Unix timestamp, size) of every blob under ``prefix/``."""
        ...

    def sweep_temp(self, older_than_s: float | None = None, busy: Collection[str] = ()) -> int:
        """Remove the temp files and job folders a killed server or worker left behind: all of them at
        start (``older_than_s`` None), else those untouched for ``older_than_s`` seconds whose name does not
        start with one of ``busy`` (the staging folders of running jobs)."""
        ...


def _sweep(folder: Path, older_than_s: float | None = None, busy: Collection[str] = ()) -> int:
    count = 0
    now = time.time()
    for entry in folder.glob("*"):
        try:
            if older_than_s is not None:
                if any(entry.name.startswith(prefix) for prefix in busy):
                    continue
                if now - entry.lstat().st_mtime < older_than_s:
                    continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        except FileNotFoundError:
            continue  # removed meanwhile by its owner
        count += 1
    return count


def _sync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileStore:
    """Blobs as files under one root directory."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.url = self.root.as_uri()
        self._tmp = self.root / ".tmp"
        self._tmp.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root not in path.parents:
            raise StoreError(f"blob key {key!r} leaves the store")
        return path

    def new_temp(self) -> Path:
        fd, name = tempfile.mkstemp(dir=self._tmp, prefix="upload-")
        os.close(fd)
        return Path(name)

    def publish(self, temp: Path, key: str) -> None:
        dest = self._path(key)
        for attempt in range(PUBLISH_ATTEMPTS):
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(temp, dest)
                _sync_dir(dest.parent)  # the rename itself survives a crash once the folder is synced
                return
            except FileNotFoundError:
                # A delete of the run removed the folder between the mkdir and the rename. The upload's
                # transaction then finds no run (a 404) and removes the blob; publishing must not fail first.
                if attempt == PUBLISH_ATTEMPTS - 1 or not temp.exists():
                    raise

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def put_file(self, source: Path, key: str) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        temp = self.new_temp()
        try:
            shutil.copyfile(source, temp)
            with open(temp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(temp, dest)
        finally:
            temp.unlink(missing_ok=True)
        _sync_dir(dest.parent)

    def local_path(self, key: str) -> Path | None:
        return self._path(key)

    def download(self, key: str, dest: Path) -> None:
        shutil.copyfile(self._path(key), dest)

    def iter_bytes(self, key: str) -> Iterator[bytes]:
        with open(self._path(key), "rb") as fh:
            while chunk := fh.read(CHUNK):
                yield chunk

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None

    def delete_prefix(self, prefix: str) -> None:
        shutil.rmtree(self._path(prefix.rstrip("/")), ignore_errors=True)

    def iter_blobs(self, prefix: str) -> Iterator[tuple[str, float, int]]:
        top = self.root / prefix.strip("/")
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                path = Path(dirpath) / name
                try:
                    info = path.lstat()
                except FileNotFoundError:
                    continue
                yield path.relative_to(self.root).as_posix(), info.st_mtime, info.st_size

    def sweep_temp(self, older_than_s: float | None = None, busy: Collection[str] = ()) -> int:
        return _sweep(self._tmp, older_than_s, busy)


class S3Store:
    """Blobs as objects under ``s3://bucket/prefix``; uploads are staged locally, then sent in one
    (multipart) upload, which S3 makes visible atomically."""

    def __init__(self, bucket: str, prefix: str, temp_dir: Path) -> None:
        import boto3

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}"
        self._tmp = temp_dir
        self._tmp.mkdir(parents=True, exist_ok=True)
        self._s3 = boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def new_temp(self) -> Path:
        fd, name = tempfile.mkstemp(dir=self._tmp, prefix="upload-")
        os.close(fd)
        return Path(name)

    def publish(self, temp: Path, key: str) -> None:
        try:
            self._s3.upload_file(str(temp), self.bucket, self._key(key))
        except Exception as exc:  # boto3 raises many unrelated types
            raise StoreError(f"s3 upload of {key} to {self.url} failed: {exc}") from exc
        finally:
            temp.unlink(missing_ok=True)

    def delete(self, key: str) -> None:
        try:
            self._s3.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            raise StoreError(f"s3 delete of {key} in {self.url} failed: {exc}") from exc

    def put_file(self, source: Path, key: str) -> None:
        try:
            self._s3.upload_file(str(source), self.bucket, self._key(key))
        except Exception as exc:
            raise StoreError(f"s3 upload of {key} to {self.url} failed: {exc}") from exc

    def local_path(self, key: str) -> Path | None:
        return None

    def download(self, key: str, dest: Path) -> None:
        try:
            self._s3.download_file(self.bucket, self._key(key), str(dest))
        except Exception as exc:
            raise StoreError(f"s3 download of {key} from {self.url} failed: {exc}") from exc

    def iter_bytes(self, key: str) -> Iterator[bytes]:
        """The object streamed in ``CHUNK``-sized pieces (one GET; never the whole object in memory)."""
        try:
            body = self._s3.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        except Exception as exc:
            raise StoreError(f"s3 download of {key} from {self.url} failed: {exc}") from exc
        try:
            yield from body.iter_chunks(CHUNK)
        finally:
            body.close()

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            head = self._s3.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError:
            return None
        return int(head["ContentLength"])

    def delete_prefix(self, prefix: str) -> None:
        full = self._key(prefix.rstrip("/")) + "/"
        paginator = self._s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
            objects = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if objects:
                self._s3.delete_objects(Bucket=self.bucket, Delete={"Objects": objects})

    def iter_blobs(self, prefix: str) -> Iterator[tuple[str, float, int]]:
        full = self._key(prefix.strip("/")) + "/"
        skip = len(self.prefix) + 1 if self.prefix else 0
        paginator = self._s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
            for item in page.get("Contents", []):
                yield item["Key"][skip:], item["LastModified"].timestamp(), int(item.get("Size", 0))

    def sweep_temp(self, older_than_s: float | None = None, busy: Collection[str] = ()) -> int:
        return _sweep(self._tmp, older_than_s, busy)


def open_store(url: str, temp_dir: Path) -> BlobStore:
    """The store for ``url``: ``file://`` or ``s3://``; anything else names the valid schemes."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        # file:///abs/path; file://relative/path is read as a path relative to the working directory.
        host = parsed.netloc if parsed.netloc not in ("", "localhost") else ""
        return FileStore(Path(unquote(host + parsed.path)))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise StoreError(f"PARITY_STORE_URL {url!r}: no bucket (expected s3://bucket/prefix)")
        return S3Store(parsed.netloc, parsed.path, temp_dir)
    raise StoreError(f"PARITY_STORE_URL {url!r}: unknown scheme {parsed.scheme!r} (use file:// or s3://)")


def run_key(run_id: str, path: str = "") -> str:
    return f"runs/{run_id}/{path}" if path else f"runs/{run_id}"


def upload_key(run_id: str, upload_id: str) -> str:
    """Where one upload's bytes live: unique per upload, under the run's prefix so deleting the run takes
    it along."""
    return f"runs/{run_id}/blobs/{upload_id}"


def comparison_key(comparison_id: str, name: str = "") -> str:
    return f"comparisons/{comparison_id}/{name}" if name else f"comparisons/{comparison_id}"


def sidecar_key(blob: str) -> str:
    """Where the parsed columns of the dump.json stored at ``blob`` live (written at complete): beside it,
    under the run's prefix, so deleting the run takes it along; blob keys are unique per upload, so a
    sidecar always belongs to the bytes it was made from."""
    return f"{blob}.columns"
