"""Background writer of ``dump_tensor_data/*.pt`` files (task ``tensor``).

The training thread only clones the tensor (so later in-place updates cannot change what is saved) and puts
it on a bounded queue; one daemon thread moves it to the CPU and ``torch.save``s it. The bound applies back
pressure instead of letting clones pile up in memory. :meth:`drain` waits until every queued file is on disk
(called before a step's directory is handed to the uploader); write errors are logged once and counted, never
raised into the training loop.
"""

from __future__ import annotations

import logging
import queue
import threading
from pathlib import Path

import torch

__all__ = ["TensorWriter"]

log = logging.getLogger(__name__)


class TensorWriter:
    """One daemon thread saving ``(path, tensor)`` pairs from a bounded queue."""

    def __init__(self, max_queue: int = 256) -> None:
        self._queue: queue.Queue[tuple[Path, torch.Tensor] | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="parity-tensor-writer", daemon=True)
        self._thread.start()
        self.errors = 0
        self.written = 0

    def submit(self, path: Path, tensor: torch.Tensor) -> None:
        """Queue a private copy of ``tensor`` to be saved at ``path`` (blocks while the queue is full)."""
        self._queue.put((path, tensor.detach().clone(memory_format=torch.contiguous_format)))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                path, tensor = item
                try:
                    torch.save(tensor.cpu(), path)
                    self.written += 1
                except Exception as exc:  # a full disk must not stop training
                    self.errors += 1
                    if self.errors == 1:
                        log.warning("parity: cannot write %s: %s (further errors logged at DEBUG)",
                                    path, exc)  # fmt: skip
                    else:
                        log.debug("parity: cannot write tensor file %s: %s", path, exc)
            finally:
                self._queue.task_done()

    def drain(self) -> None:
        """Block until every queued tensor is written."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
