"""A worker's local copies of the blobs it reads, bounded in bytes: ``BlobCache`` and its ``checkout``.

A rank task or a validation needs local files (the engine and the reader open paths). On a file store they
are the blobs themselves, read in place. On S3 each blob the work names is streamed into this worker's
cache folder (one ``GET``, written in 1 MiB chunks, never held in memory), and only those blobs: a task of
one rank fetches that rank's files, a slice of a rank only its own.

The cache never holds more than ``PARITY_WORKER_CACHE_BYTES``: before a download, files no work is using
are evicted, least recently used first; a blob that cannot fit beside what is in use is refused with an
error that names the setting, rather than filling the disk. Files of work that succeeded stay for the next
(a project's baseline is read by every comparison against it) until evicted; files of work that failed are
removed at once (a partial or a bad download must not be served again), so a failed task leaves the cache
as it found it. The folder is per worker (``cache-{pid}-{id}``); a server start sweeps what a killed one
left.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from parity.server.errors import StoreError
from parity.server.settings import Settings
from parity.server.store import BlobStore

logger = logging.getLogger(__name__)


class MissingBlob(StoreError):
    """A blob the database names is not in the store."""


class CacheFull(StoreError):
    """A blob does not fit in the worker's cache beside the blobs the running work holds."""


@dataclass
class _Entry:
    path: Path
    size: int
    pins: int = 0
    used: float = 0.0


class BlobCache:
    """Local paths for blob keys: in place on a file store, bounded downloads from a remote one."""

    def __init__(self, store: BlobStore, root: Path, cap_bytes: int) -> None:
        self.store = store
        self.root = root
        self.cap_bytes = cap_bytes
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(e.size for e in self._entries.values())

    def files(self) -> list[Path]:
        """The files in the cache folder (what a test or a benchmark sees on disk)."""
        return sorted(p for p in self.root.glob("*") if p.is_file()) if self.root.is_dir() else []

    @contextmanager
    def checkout(self) -> Iterator[Checkout]:
        """The blobs of one piece of work: held while it runs; kept after success, dropped after failure."""
        out = Checkout(self)
        self._touch()
        try:
            yield out
        except BaseException:
            self._release(out.keys, drop=True)
            raise
        self._release(out.keys, drop=False)

    def clear(self) -> None:
        """Remove every file no work holds."""
        with self._lock:
            for key in [k for k, e in self._entries.items() if not e.pins]:
                self._entries.pop(key).path.unlink(missing_ok=True)

    # -- inside a checkout ------------------------------------------------------------------------------
    def _fetch(self, key: str, size: int | None) -> Path | None:
        """A pinned local copy of remote ``key``; None when the store has no such blob."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.path.is_file():  # a periodic temp sweep may have removed it
                entry.pins += 1
                entry.used = time.monotonic()
                return entry.path
            if entry is not None:
                del self._entries[key]
        if size is None:
            size = self.store.size(key)
            if size is None:
                return None
        with self._lock:
            self._make_room(key, size)
            # Reserved before the download (pinned, so no one evicts it), so two downloads at once cannot
            # together pass the cap.
            path = self.root / hashlib.sha256(key.encode()).hexdigest()
            entry = self._entries[key] = _Entry(path, size, pins=1, used=time.monotonic())
        try:
            self._download(key, path, size)
        except BaseException:
            with self._lock:
                self._entries.pop(key, None)
            path.unlink(missing_ok=True)
            raise
        return entry.path

    def _make_room(self, key: str, size: int) -> None:
        if size > self.cap_bytes:
            raise CacheFull(
                f"blob {key} is {size} bytes, more than the worker cache holds (PARITY_WORKER_CACHE_BYTES="
                f"{self.cap_bytes}); raise the setting to at least one rank pair's files"
            )
        used = sum(e.size for e in self._entries.values())
        idle = sorted((e.used, k) for k, e in self._entries.items() if not e.pins)
        while used + size > self.cap_bytes and idle:
            _, victim = idle.pop(0)
            evicted = self._entries.pop(victim)
            evicted.path.unlink(missing_ok=True)
            used -= evicted.size
        if used + size > self.cap_bytes:
            raise CacheFull(
                f"blob {key} ({size} bytes) does not fit in the worker cache beside the {used} bytes this "
                f"work holds (PARITY_WORKER_CACHE_BYTES={self.cap_bytes}); raise the setting to at least one "
                "rank pair's files"
            )

    def _download(self, key: str, path: Path, size: int) -> None:
        """Stream ``key`` into ``path`` through a temp name: a killed download is never taken as whole."""
        self.root.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".part")
        written = 0
        with open(partial, "wb") as fh:
            for chunk in self.store.iter_bytes(key):
                written += len(chunk)
                if written > size:
                    raise StoreError(f"blob {key} is larger than the {size} bytes recorded for it")
                fh.write(chunk)
        if written != size:
            partial.unlink(missing_ok=True)
            raise StoreError(f"blob {key}: {written} bytes read, {size} recorded")
        os.replace(partial, path)
        self._touch()
        logger.debug("cached %s (%d bytes)", key, size)

    def _touch(self) -> None:
        # The server's periodic sweep removes temp folders untouched for PARITY_TEMP_GRACE_SECONDS: a cache in
        # use is touched by every checkout and download (a file swept anyway is downloaded again).
        try:
            os.utime(self.root)
        except FileNotFoundError:
            pass

    def _release(self, keys: list[str], *, drop: bool) -> None:
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is None:
                    continue
                entry.pins -= 1
                if drop and not entry.pins:
                    del self._entries[key]
                    entry.path.unlink(missing_ok=True)


class Checkout:
    """The blobs one piece of work reads; see :meth:`BlobCache.checkout`."""

    def __init__(self, cache: BlobCache) -> None:
        self.cache = cache
        self.keys: list[str] = []

    def path(self, key: str, size: int | None = None) -> Path:
        """A local path to read ``key`` (``size``: its recorded size, saves asking the store)."""
        found = self.find(key, size)
        if found is None:
            raise MissingBlob(f"blob {key} is missing from the store")
        return found

    def find(self, key: str, size: int | None = None) -> Path | None:
        """As :meth:`path`, or None when the store has no ``key`` (an optional file, such as a sidecar)."""
        local = self.cache.store.local_path(key)
        if local is not None:
            return local if local.is_file() else None
        found = self.cache._fetch(key, size)
        if found is not None:
            self.keys.append(key)
        return found


def worker_cache(settings: Settings, store: BlobStore) -> BlobCache:
    """This worker process's cache, in the data folder's temp area (swept at a server start)."""
    root = settings.resolved_data_dir / "tmp" / f"cache-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return BlobCache(store, root, settings.worker_cache_bytes)
