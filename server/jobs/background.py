"""One background thread that a job backend starts with the server and stops with it: the local pool's
supervisor and the Celery backend's lease watcher."""

from __future__ import annotations

import threading
from collections.abc import Callable


class BackgroundLoop:
    """``loop()`` on a daemon thread named ``name``, from ``start`` until ``stop``; the loop returns once
    ``stopping`` is set (it waits on it between rounds, so a stop wakes it at once)."""

    def __init__(self, loop: Callable[[], None], name: str) -> None:
        self.loop, self.name = loop, name
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.stopping.clear()
        self._thread = threading.Thread(target=self.loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            self._thread = None
