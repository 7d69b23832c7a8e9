"""The background writer of the dump: ``dump_tensor_data/*.pt`` files and each step's JSON documents.

The training thread only clones a tensor (so later in-place updates cannot change what is saved), or hands
over a step's finished documents, and puts the job on a bounded queue; one daemon thread runs the jobs in
order. CPU copies go in batches (one job a batch: a wake-up of the writer a file cost more CPU than a
small file), and any other job first queues the batch so far, so the queue keeps submission order. The
files hold ``torch.save``'s bytes, serialized by :mod:`parity.client.tensor_file` at a third of its cost.

Order is the contract the recorder relies on: a step's tensor files are queued before its dump.json, and
the uploader hand-off is queued after it, so the uploader only ever sees complete directories.

A tensor on an accelerator is snapshotted on the device (a copy at device bandwidth, so later in-place updates
cannot reach it) and the snapshot is transferred into a page-locked host buffer on a side stream, overlapping
training; the writer thread waits for that transfer's event before saving, and only then lets the snapshot
go. The bytes of such copies not yet written are bounded (``host_buffer_mb``, which bounds the snapshots'
device memory too): past the bound, training waits for the writer, so a step is never slower than writing
its bytes and memory never grows with the step. On a CPU-only machine these paths are plain copies
(see :mod:`parity.client.devices`).

The bounds apply back pressure instead of letting clones (or whole steps of documents) pile up in memory.
:meth:`drain` waits until every queued job is done. Errors are logged once at WARNING (the rest at DEBUG)
and counted, never raised into the training loop. In a forked child (a DataLoader worker) the thread does
not exist, so jobs there are dropped rather than queued forever.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from parity.client import devices
from parity.client.dtensors import plain_tensor
from parity.client.tensor_file import TensorFiles
from parity.shared.dump.writer import fsync_dir

__all__ = ["BackgroundWriter", "TensorWriter"]

log = logging.getLogger(__name__)

_Job = Callable[[], object]
_BATCH_FILES = 32  # CPU copies queued as one job ...
_BATCH_BYTES = 1 << 20  # ... or fewer, once they hold this many bytes


class BackgroundWriter:
    """One daemon thread running write jobs (tensor saves, document writes, callbacks) in FIFO order."""

    def __init__(self, max_queue: int = 256, max_documents: int = 2, max_host_bytes: int = 1 << 30) -> None:
        # bytes of staged host copies queued and not yet written (device tensors; CPU ones are clones)
        self.max_host_bytes = max_host_bytes
        self.staged_bytes = 0
        self.peak_staged_bytes = 0
        self._staged = threading.Condition()
        self._streams: dict[torch.device, object] = {}  # one side stream per device, made on first use
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=max_queue)
        # whole steps of documents waiting to be written: a slow disk stalls training here, not in memory
        self._documents = threading.BoundedSemaphore(max_documents)
        self._pid = os.getpid()
        self._files = TensorFiles()  # the serializer's cache (writer thread only)
        # CPU copies submitted and not yet queued: queued as one job per _BATCH_FILES files (or bytes), or
        # before any other job, since a job a file cost a wake-up of the writer thread (and a GIL hand-over)
        # each, more CPU than writing a small file
        self._pending: list[tuple[torch.Tensor, str | Path]] = []
        self._pending_bytes = 0
        self._pending_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="parity-writer", daemon=True)
        self._thread.start()
        self.errors = 0
        self.written = 0
        self._unsynced: list[str | Path] = []  # tensor files written, not yet synced (writer thread only)
        self._syncing: threading.Thread | None = None  # their sync in progress (see _start_sync)

    def _usable(self) -> bool:
        return os.getpid() == self._pid and self._thread.is_alive()

    def submit(self, path: str | Path, tensor: torch.Tensor, *, staged: bool | None = None) -> None:
        """Queue a private copy of ``tensor`` to be saved at ``path`` (blocks while the queue is full).

        ``staged`` (default: the tensor is not on the CPU) copies into a bounded host buffer instead of
        cloning where the tensor lives; the tests force it on CPU to check the bound."""
        if not self._usable():
            return
        tensor = plain_tensor(tensor)  # a DTensor's file holds its local shard, a plain tensor
        if staged is None:
            staged = tensor.device.type != "cpu"
        if not staged:
            copy = tensor.detach().clone(memory_format=torch.contiguous_format)
            with self._pending_lock:  # batched: one job, and one wake-up of the writer, per batch
                self._pending.append((copy, path))
                self._pending_bytes += copy.numel() * copy.element_size()
                if len(self._pending) >= _BATCH_FILES or self._pending_bytes >= _BATCH_BYTES:
                    self._put_pending()
            return
        self.submit_host(tensor, lambda host: self._save(host, path))

    def _put_pending(self) -> None:
        """Queue the batch of CPU copies gathered so far (the caller holds ``_pending_lock``)."""
        if self._pending:
            batch, self._pending, self._pending_bytes = self._pending, [], 0
            self._queue.put(lambda: self._save_batch(batch))

    def _put(self, job: _Job | None) -> None:
        """Queue ``job`` after the pending batch, so the queue keeps submission order."""
        with self._pending_lock:
            self._put_pending()
            self._queue.put(job)

    def _save_batch(self, batch: list[tuple[torch.Tensor, str | Path]]) -> None:
        """Writer thread: save each file of a batch; a failure counts (and is logged) per file."""
        options = self._files.options()
        for tensor, path in batch:
            try:
                self._save(tensor, path, options)
            except Exception as exc:  # a full disk must not stop training (nor the batch's other files)
                self._failed(exc)

    def _save(self, tensor: torch.Tensor, path: str | Path, options: tuple[bool, int] | None = None) -> None:
        """Writer thread: write one tensor file; it is made durable with the others before the next document
        (:meth:`_sync_files`)."""
        _save(tensor, path, sync=False, files=self._files, options=options)
        self._unsynced.append(path)

    def _sync_files(self) -> None:
        """Writer thread: make the tensor files written since the last document durable, before a document
        (a dump.json naming them) is written: one file-system sync (``syncfs``) rather than an fsync a file,
        which cost ~5 ms each here (200 files: 1 s against 5-70 ms), where the platform has it."""
        self._start_sync()
        self.files_synced()

    def _start_sync(self) -> None:
        """Writer thread: start :meth:`_sync_files`'s sync on a helper thread; :meth:`files_synced` waits for
        it. The sync waits for the disk (5-70 ms) without the GIL, so it overlaps the encoding of the
        document that must follow it (tens of ms of Python) instead of coming before it."""
        paths, self._unsynced = self._unsynced, []
        if paths:
            syncing = threading.Thread(target=_sync_logged, args=(paths,), name="parity-sync", daemon=True)
            syncing.start()
            self._syncing = syncing

    def files_synced(self) -> None:
        """Writer thread: wait until the tensor files written before the current document are durable; a
        document job calls it before its document becomes visible (see ``submit_call``)."""
        syncing, self._syncing = self._syncing, None
        if syncing is not None:
            syncing.join()

    def submit_host(self, tensor: torch.Tensor, consume: Callable[[torch.Tensor], object]) -> None:
        """Queue ``consume(a host copy of tensor)`` on the writer thread: the copy is made as for a device
        tensor (snapshot, side-stream transfer, bounded by ``max_host_bytes``) on any device, plain on CPU.

        What md5 of accelerator tensors uses: the CRC is computed on the writer thread from the copy,
        instead of a synchronous device-to-host copy per tensor on the training thread."""
        if not self._usable():
            return
        src = tensor.detach()
        nbytes = src.numel() * src.element_size()
        self._reserve(nbytes)
        try:
            host, ready = self._stage(src)
        except BaseException:
            self._release(nbytes)
            raise

        def run() -> None:
            try:
                if ready is not None:
                    ready[0].synchronize()  # the side stream's copy has landed in the host buffer
                consume(host)
            finally:
                self._release(nbytes)

        self._put(run)

    def _stage(self, src: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """A host copy of ``src``, and what the writer must wait for before reading it (None: ready).

        With a side stream: a device-side snapshot on the training stream (at device bandwidth, so a later
        in-place update on that stream cannot reach the copy), then the transfer of the snapshot into pinned
        host memory on the side stream, overlapping training. The returned job keeps the snapshot alive until
        the transfer's event has completed, so its memory is never reused early. Without a stream (CPU, MPS):
        a plain synchronous copy."""
        host = devices.pinned_empty(src.numel(), src.dtype).view(src.shape)
        device = src.device
        if device not in self._streams:
            self._streams[device] = devices.side_stream(device)
        stream: Any = self._streams[device]
        if stream is None:
            host.copy_(src)
            return host, None
        snapshot = src.clone(memory_format=torch.contiguous_format)
        stream.wait_stream(devices.current_stream(device))
        with devices.stream_context(stream):
            host.copy_(snapshot, non_blocking=True)
            event = stream.record_event()
        return host, (event, snapshot)

    def _reserve(self, nbytes: int) -> None:
        """Wait until ``nbytes`` more fit the host bound (a tensor larger than the bound goes alone)."""
        with self._staged:
            while self.staged_bytes and self.staged_bytes + nbytes > self.max_host_bytes:
                self._staged.wait()
            self.staged_bytes += nbytes
            self.peak_staged_bytes = max(self.peak_staged_bytes, self.staged_bytes)

    def _release(self, nbytes: int) -> None:
        with self._staged:
            self.staged_bytes -= nbytes
            self._staged.notify_all()

    def submit_call(self, job: _Job, *, document: bool = False, syncs_files: bool = False) -> None:
        """Queue ``job`` after everything queued so far; ``document``: it holds a step's documents, written
        once the tensor files before it are durable: ``syncs_files``, the job itself calls
        :meth:`files_synced` before its document becomes visible (the sync overlaps its encoding); else the
        sync comes first."""
        if not self._usable():
            log.debug("parity: writer not running in this process (forked child?): job dropped")
            return
        if not document:
            self._put(job)
            return
        self._documents.acquire()

        def run_and_release() -> object:
            try:
                if not syncs_files:
                    self._sync_files()
                    return job()
                self._start_sync()
                try:
                    return job()
                finally:
                    self.files_synced()  # a job that failed before waiting: the next one starts after it
            finally:
                self._documents.release()

        self._put(run_and_release)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                try:
                    job()
                    self.written += 1
                except Exception as exc:  # a full disk must not stop training
                    self._failed(exc)
            finally:
                # the job (a step's documents) is released before drain() can return, not when the next
                # one comes: the collector's pass after step() then has little to walk
                job = None
                self._queue.task_done()

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        if self.errors == 1:
            log.warning("parity: background write failed: %s (further errors logged at DEBUG)", exc)
        else:
            log.debug("parity: background write failed: %s", exc)

    def drain(self) -> None:
        """Block until every queued job (and every file submitted) is done."""
        if self._usable():
            with self._pending_lock:
                self._put_pending()
            self._queue.join()

    def close(self) -> None:
        """Run what is queued, then stop the thread."""
        if self._usable():
            self._put(self._sync_files)  # files no document followed (an interrupted step)
            self._queue.put(None)
            self._thread.join()


def _save(tensor: torch.Tensor, path: str | Path, *, sync: bool = True, files: TensorFiles | None = None,
          options: tuple[bool, int] | None = None) -> None:  # fmt: skip
    """Write one ``.pt`` file, fsynced (or, ``sync`` False, left for :func:`sync_files`); never half a file
    under a name a dump.json gives.

    A new file (nearly all: a step's files are new names in a new folder) is created exclusively and written
    in place: no dump.json names it before it is complete and synced, since a step's documents are queued
    after its files. A file that exists (a later micro-batch's gradient of the same name, an earlier run in
    the same dump path) may be named by a dump.json already, so it is replaced atomically: written under a
    temporary name, then renamed over it. In place saves the temporary's creation and the rename, the larger
    part of a small file's cost on the file system.

    The bytes are ``torch.save``'s (``files``: the writer thread's cached serializer; ``options``: its
    settings, read once a batch), written with one ``writev`` of plain ``os`` calls on ``str`` paths: a
    Python file object, or a ``Path`` a file, costs more CPU than the write itself for a file of a few KiB."""
    path = os.fspath(path)
    created: str | None = None  # the file this call made, removed if the write fails
    try:
        if not tensor.is_cpu:
            tensor = tensor.cpu()
        parts = (files or TensorFiles()).parts(tensor, options)
        try:
            fd = os.open(path, _CREATE_NEW, 0o666)
        except FileExistsError:
            folder, name = os.path.split(path)
            tmp = os.path.join(folder, f".{name}.tmp")
            fd = os.open(tmp, _CREATE, 0o666)
            created = tmp
        else:
            created = path
        try:
            _write_all(fd, parts)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if created != path:
            os.replace(created, path)
    except Exception as exc:  # name the file: torch's own message often does not
        if created is not None:
            with contextlib.suppress(OSError):
                os.unlink(created)
        raise OSError(f"cannot write {path}: {exc}") from exc


_O_BINARY = getattr(os, "O_BINARY", 0)
_CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_BINARY
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_BINARY


def _write_all(fd: int, parts: Sequence[Any]) -> None:
    """All of ``parts``' bytes to ``fd``: one ``writev`` where the platform has it (and it writes all)."""
    done = os.writev(fd, parts) if _WRITEV else 0
    if done == sum(memoryview(part).nbytes for part in parts):
        return
    data = memoryview(b"".join(parts))  # a short write (or no writev): the rest in plain writes
    while done < len(data):
        done += os.write(fd, data[done:])


_WRITEV = hasattr(os, "writev")


def _syncfs() -> Callable[[int], int] | None:
    """Linux's ``syncfs(fd)`` (flush one file system), or None where libc has none."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syncfs  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_SYNCFS = _syncfs() if sys.platform.startswith("linux") else None


def _sync_logged(paths: Sequence[str | Path]) -> None:
    """:func:`sync_files`; a failure is logged: the files are written, and a failed flush must not hold back
    the document."""
    try:
        sync_files(paths)
    except OSError as exc:
        log.warning("parity: could not sync %d tensor files (%s): %s", len(paths), os.path.dirname(paths[0]),
                    exc)  # fmt: skip


def sync_files(paths: Sequence[str | Path]) -> None:
    """Make ``paths`` (written, renamed into place) durable: one ``syncfs`` per file system they are on, or
    an fsync of each file and its folder where ``syncfs`` is missing or fails."""
    folders = {os.path.dirname(p) for p in paths}
    if _SYNCFS is not None:
        devices_done: set[int] = set()
        failed = False
        for folder in folders:
            fd = os.open(folder, os.O_RDONLY)
            try:
                if os.fstat(fd).st_dev not in devices_done:
                    failed |= _SYNCFS(fd) != 0
                    devices_done.add(os.fstat(fd).st_dev)
            finally:
                os.close(fd)
        if not failed:
            return
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for folder in folders:
        fsync_dir(Path(folder))


#: The former name: the writer started out saving tensor files only.
TensorWriter = BackgroundWriter
