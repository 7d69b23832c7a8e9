"""The real Parity app in process, for the client's tests: no hand-written fake of the REST contract.

:class:`AppWire` runs ``create_app`` on a temporary SQLite database and store under FastAPI's ``TestClient``
(an httpx client), and hands the client under test an ``httpx.Client`` whose transport is the wire between
the two: it records every request and lets a test make one fail as a network or an overloaded server would
(``fail``), before the request reaches the app. Everything else is the server's own answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from parity.client.rest import ParityClient
from parity.server.main import create_app
from parity.server.settings import Settings

from tests.workers import validation_thread

URL = "http://parity"

#: Returns a response or an exception to inject instead of sending the request on, or None to send it.
FailHook = Callable[[httpx.Request], "httpx.Response | Exception | None"]


class AppWire(httpx.BaseTransport):
    """The transport between a client and the app: ``requests`` holds ``(method, path)`` of each request."""

    def __init__(self, app: TestClient) -> None:
        self.app = app
        self.requests: list[tuple[str, str]] = []
        self.headers: list[httpx.Headers] = []
        self.fail: FailHook | None = None
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            self.requests.append((request.method, request.url.path))
            self.headers.append(request.headers)
        if self.fail is not None:
            injected = self.fail(request)
            if isinstance(injected, Exception):
                raise injected
            if injected is not None:
                return injected
        return self.app.send(request)

    def client(self) -> httpx.Client:
        """A fresh ``httpx.Client`` over this wire (each uploader closes or keeps its own)."""
        return httpx.Client(transport=self)

    def api(self) -> ParityClient:
        """A :class:`ParityClient` over this wire, with no retries of its own."""
        return ParityClient(URL, client=self.client())


@contextmanager
def app_wire(data_dir: Path, *, workers: int = 1) -> Iterator[AppWire]:
    """The app started (migrations, store, job queue with ``workers`` worker processes) and its wire; with
    ``workers=0``, runs are still validated (by a thread of this process) and comparisons stay queued."""
    settings = Settings(data_dir=data_dir, database_url=None, store_url=None, workers=workers, tokens=None,
                        job_backend="local")  # fmt: skip
    with TestClient(create_app(settings), base_url=URL) as app:
        if workers:
            yield AppWire(app)
            return
        with validation_thread(settings):  # runs complete as on a server; comparisons stay queued
            yield AppWire(app)
