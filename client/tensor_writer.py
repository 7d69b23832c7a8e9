"""The background writer of the dump: ``dump_tensor_data/*.pt`` files and each step's JSON documents.

The training thread only clones a tensor (so later in-place updates cannot change what is saved), or hands
over a step's finished documents, and puts the job on a bounded queue; one daemon thread runs the jobs in
order. Order is the contract the recorder relies on: a step's tensor files are queued before its dump.json,
and the uploader hand-off is queued after it, so the uploader only ever sees complete directories.

The bounds apply back pressure instead of letting clones (or whole steps of documents) pile up in memory.
:meth:`drain` waits until every queued job is done. Errors are logged once at WARNING (the rest at DEBUG)
and counted, never raised into the training loop. In a forked child (a DataLoader worker) the thread does
not exist, so jobs there are dropped rather than queued forever.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["BackgroundWriter", "TensorWriter"]

log = logging.getLogger(__name__)

_Job = Callable[[], object]


class BackgroundWriter:
    """One daemon thread running write jobs (tensor saves, document writes, callbacks) in FIFO order."""

    def __init__(self, max_queue: int = 256, max_documents: int = 2) -> None:
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=max_queue)
        # whole steps of documents waiting to be written: a slow disk stalls training here, not in memory
        self._documents = threading.BoundedSemaphore(max_documents)
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="parity-writer", daemon=True)
        self._thread.start()
        self.errors = 0
        self.written = 0

    def _usable(self) -> bool:
        return os.getpid() == self._pid and self._thread.is_alive()

    def submit(self, path: Path, tensor: torch.Tensor) -> None:
        """Queue a private copy of ``tensor`` to be saved at ``path`` (blocks while the queue is full)."""
        if not self._usable():
            return
        copy = tensor.detach().clone(memory_format=torch.contiguous_format)
        self._queue.put(lambda: _save(copy, path))

    def submit_call(self, job: _Job, *, document: bool = False) -> None:
        """Queue ``job`` after everything queued so far; ``document``: it holds a step's documents."""
        if not self._usable():
            log.debug("parity: writer not running in this process (forked child?): job dropped")
            return
        if not document:
            self._queue.put(job)
            return
        self._documents.acquire()

        def run_and_release() -> object:
            try:
                return job()
            finally:
                self._documents.release()

        self._queue.put(run_and_release)

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
                    self.errors += 1
                    if self.errors == 1:
                        log.warning("parity: background write failed: %s (further errors logged at DEBUG)",
                                    exc)  # fmt: skip
                    else:
                        log.debug("parity: background write failed: %s", exc)
            finally:
                self._queue.task_done()

    def drain(self) -> None:
        """Block until every queued job is done."""
        if self._usable():
            self._queue.join()

    def close(self) -> None:
        """Run what is queued, then stop the thread."""
        if self._usable():
            self._queue.put(None)
            self._thread.join()


def _save(tensor: torch.Tensor, path: Path) -> None:
    """Write one ``.pt`` file atomically: a temporary name, fsynced, then renamed (no half file, ever)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            torch.save(tensor.cpu(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except Exception as exc:  # name the file: torch's own message often does not
        tmp.unlink(missing_ok=True)
        raise OSError(f"cannot write {path}: {exc}") from exc


#: The former name: the writer started out saving tensor files only.
TensorWriter = BackgroundWriter
