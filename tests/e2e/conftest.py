"""Fixtures of the end-to-end tests: a real ``parity server`` subprocess on 127.0.0.1 and a free port.

The server runs on SQLite in a temporary data dir, and again on PostgreSQL when ``PARITY_TEST_POSTGRES_URL``
is set (``scripts/test.sh`` exports it). One server per backend for the whole session (per xdist worker),
shared by the modules, keeps the suite fast (a start is 2-3 s); tests use unique run names, so they never see
each other's runs.

Each PostgreSQL server gets a database of its own. Servers that share a database must share the blob store:
the workers of one claim any validation or rank task the database holds, so a second server (another xdist
worker's, with its own data dir) once took a run uploaded to the first and found its blobs missing.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from parity.client.rest import ParityClient
from parity.client.run_metadata import ENVIRONMENT_FILE

from parity.demo import ServerProcess
from tests.e2e.app_wire import URL, AppWire
from tests.factories import DumpBuilder
from tests.server.conftest import fresh_postgres_database

if TYPE_CHECKING:
    from parity.server.settings import Settings

BACKENDS = ["sqlite"] + (["postgres"] if os.environ.get("PARITY_TEST_POSTGRES_URL") else [])


@pytest.fixture(scope="session", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A running server (session scope); its log is printed when it fails to start."""
    env = {"PARITY_WORKERS": "2"}
    if request.param == "postgres":
        env["PARITY_DATABASE_URL"] = fresh_postgres_database(os.environ["PARITY_TEST_POSTGRES_URL"])
    proc = ServerProcess(tmp_path_factory.mktemp(f"server-{request.param}"), env=env)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def api(server: ServerProcess) -> Iterator[ParityClient]:
    with ParityClient(server.url, token=getattr(server, "token", None)) as client:
        yield client


@pytest.fixture
def unique() -> str:
    """A suffix that makes run names unique across tests, modules and a shared PostgreSQL."""
    return uuid.uuid4().hex[:8]


@dataclass
class Loop:
    """The real app in process, no worker of its own: the test validates runs and runs tasks itself
    (``tests.workers.validate_waiting``, ``TaskRunner``), and the commands' ``connect`` talks to it."""

    wire: AppWire
    settings: Settings

    def api(self) -> ParityClient:
        return self.wire.api()


@pytest.fixture
def loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Loop]:
    from fastapi.testclient import TestClient
    from parity.server.main import create_app
    from parity.server.settings import Settings

    settings = Settings(data_dir=tmp_path / "server", database_url=None, store_url=None, workers=0,
                        tokens=None, job_backend="local")  # fmt: skip
    with TestClient(create_app(settings), base_url=URL) as app:
        wire = AppWire(app)
        monkeypatch.setattr("parity.commands.server_args.connect", lambda args: wire.api())
        yield Loop(wire, settings)


def write_model_dump(
    root: Path, *, ranks: tuple[int, ...] = (0,), step: int = 0, gelu_noise: float = 0.0
) -> Path:
    """A tensor dump of linear → gelu → linear per rank; ``gelu_noise`` perturbs gelu's output only."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w1 = rng.standard_normal((8, 8)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((8, 8)).astype(np.float32) * 0.3
    h = x @ w1.T
    g = 0.5 * h * (1 + np.tanh(0.7978845608 * (h + 0.044715 * h**3)))
    g_out = g * (1 + gelu_noise * rng.standard_normal(g.shape).astype(np.float32))
    y = g_out @ w2.T
    for rank in ranks:
        b = DumpBuilder("tensor")
        b.api("Functional.linear.0.forward", [x, w1], [h])
        b.api("Functional.gelu.0.forward", [h], [g_out])
        b.api("Functional.linear.1.forward", [g_out, w2], [y])
        b.stack = {
            "Functional.gelu.0.forward": ["File train.py, line 12, in forward, x = F.gelu(x)"],
        }
        b.write(root / f"step{step}" / f"rank{rank}")
    return root


def local_files(root: Path) -> set[str]:
    """The dump's files as the server stores them: the environment beside the dump goes as metadata."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} - {ENVIRONMENT_FILE}
