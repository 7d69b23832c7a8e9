"""Fixtures for the server tests: a real ``parity server`` on a free 127.0.0.1 port, on SQLite and on the
PostgreSQL that ``scripts/test.sh`` starts (``PARITY_TEST_POSTGRES_URL``), plus dump builders and uploads."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import httpx
import numpy as np
import pytest

from parity.demo import ServerProcess as DemoServer
from tests.factories import DumpBuilder

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60


def service_url_or_skip(variable: str, service: str) -> str:
    """The URL of a service scripts/test.sh started; in CI its absence is a failure, elsewhere a visible
    skip (a developer running one test file without the services)."""
    url = os.environ.get(variable)
    if url:
        return url
    if os.environ.get("CI") == "true":
        pytest.fail(f"{variable} is not set in CI: scripts/test.sh must start {service}")
    pytest.skip(f"{variable} not set (run the suite through scripts/test.sh)")


def postgres_url_or_skip() -> str:
    """The test PostgreSQL's URL (see service_url_or_skip)."""
    return service_url_or_skip("PARITY_TEST_POSTGRES_URL", "PostgreSQL")


def fresh_postgres_database(base_url: str) -> str:
    """CREATE a new, empty database on the test server; returns its SQLAlchemy URL."""
    import psycopg
    from sqlalchemy.engine import make_url

    name = f"parity_test_{uuid.uuid4().hex[:12]}"
    url = make_url(base_url)
    plain = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.set(database=name).render_as_string(hide_password=False)


class LoggedProcess:
    """A service subprocess logging to ``log_path``: read its log, kill it, or stop it gracefully."""

    proc: subprocess.Popen[bytes] | None
    log_path: Path

    def start(self) -> Self:
        raise NotImplementedError

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs, as when a host dies mid-work."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM (a graceful shutdown), then SIGKILL if it does not exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ServerProcess(LoggedProcess):
    """``parity server`` as a subprocess (the demo's :class:`parity.demo.ServerProcess`: its own process
    group, stopped by SIGTERM to the server, which stops its workers), configured only through its
    environment, as in production: no ``PARITY_*`` variable of the test's own environment leaks in. One log
    per start (``server-{port}.log``), so a restarted server's log is its own. ``kill`` (LoggedProcess's) is
    SIGKILL to the server alone, as when it crashes: its workers must then die by themselves."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith("PARITY_")}
        self.server = DemoServer(data_dir, env={"PARITY_WORKERS": "1", **(env or {})}, base_env=base)
        self.data_dir = data_dir
        self.log_path = self.server.log_path = data_dir / f"server-{self.port}.log"

    @property  # type: ignore[override]
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.server.proc

    @property
    def port(self) -> int:
        return self.server.port

    @port.setter
    def port(self, port: int) -> None:  # a restart on the port of the server it replaces
        self.server.port = port

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def env(self) -> dict[str, str]:
        """The server's whole environment, for a Celery worker configured as the server is."""
        return self.server.environment()

    def start(self) -> ServerProcess:
        self.server.start(timeout=START_TIMEOUT_S)
        return self

    def stop(self) -> None:
        self.server.stop()

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=f"{self.url}/api/v1", headers=headers, timeout=60)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server with default settings on each database backend (module-scoped: tests isolate by run)."""
    env = {}
    if request.param == "postgres":
        env["PARITY_DATABASE_URL"] = fresh_postgres_database(postgres_url_or_skip())
    srv = ServerProcess(tmp_path_factory.mktemp(f"srv-{request.param}"), env).start()
    yield srv
    srv.stop()


@pytest.fixture
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


# -- dumps ---------------------------------------------------------------------------------------------------
def build_dump(root: Path, *, perturb: float = 0.0, ranks: tuple[int, ...] = (0,), seed: int = 0) -> Path:
    """A small tensor-mode dump ``root/step0/rank{R}`` (linear → relu → sum); ``perturb`` adds noise to the
    relu output, so a perturbed run's first suspect is ``Torch.relu.0.forward``."""
    for rank in ranks:
        rng = np.random.default_rng(seed + rank)
        x = rng.standard_normal((8, 16)).astype(np.float32)
        w = rng.standard_normal((4, 16)).astype(np.float32)
        y = x @ w.T
        r = np.maximum(y, 0)
        if perturb:
            r = r + perturb * rng.standard_normal(r.shape).astype(np.float32)
        s = np.asarray(r.sum(), dtype=np.float32)
        (DumpBuilder("tensor")
            .api("Functional.linear.0.forward", inputs=[x, w], outputs=[y])
            .api("Torch.relu.0.forward", inputs=[y], outputs=[r])
            .api("Torch.sum.0.forward", inputs=[r], outputs=[s])
            .write(root / "step0" / f"rank{rank}"))  # fmt: skip
    return root


def dump_files(root: Path) -> list[tuple[str, bytes]]:
    return [(p.relative_to(root).as_posix(), p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put(api: httpx.Client, run_id: str, path: str, data: bytes, digest: str | None = None) -> httpx.Response:
    return api.put(
        f"/runs/{run_id}/files/{path}", content=data,
        headers={"X-Content-SHA256": digest or sha(data), "Content-Type": "application/octet-stream"},
    )  # fmt: skip


def new_run(api: httpx.Client, **fields: Any) -> dict[str, Any]:
    body = {"name": f"run-{uuid.uuid4().hex[:8]}", "device": "npu", **fields}
    resp = api.post("/runs", json=body)
    assert resp.status_code == 201, resp.text
    return dict(resp.json())


def upload_run(api: httpx.Client, root: Path, **fields: Any) -> dict[str, Any]:
    """Create a run, upload every file under ``root`` and complete it."""
    run = new_run(api, **fields)
    for path, data in dump_files(root):
        resp = put(api, run["id"], path, data)
        assert resp.status_code == 201, resp.text
    resp = api.post(f"/runs/{run['id']}/complete")
    assert resp.status_code == 202, resp.text
    return wait_run(api, run["id"])


def wait_run(
    api: httpx.Client, run_id: str, status: str = "complete", timeout: float = 120
) -> dict[str, Any]:
    """The run once a worker has validated it (``complete`` or ``invalid``); fails unless it is ``status``."""
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = dict(api.get(f"/runs/{run_id}").json())
        if body["status"] not in ("validating", "uploading"):
            assert body["status"] == status, body
            return body
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} was not validated in {timeout}s: {body}")


def wait_comparison(api: httpx.Client, cid: str, timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = api.get(f"/comparisons/{cid}").json()
        if body["status"] in ("succeeded", "failed"):
            return dict(body)
        time.sleep(0.05)
    raise AssertionError(f"comparison {cid} did not finish in {timeout}s: {body}")
