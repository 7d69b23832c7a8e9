"""The Celery backend end to end with real parts: a ``parity server`` subprocess with
``PARITY_JOB_BACKEND=celery`` sending job ids through the Redis that ``scripts/test.sh`` starts
(``PARITY_TEST_REDIS_URL``), and a real ``celery worker`` subprocess, on the same data directory and
database, running them. Its results must be those of the local process pool for the same dumps."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.server.conftest import (
    REPO,
    ServerProcess,
    build_dump,
    service_url_or_skip,
    upload_run,
    wait_comparison,
)

CELERY_APP = "parity.server.jobs.celery_app"
QUEUE_KEY = "celery"  # Celery's default queue: a Redis list holding the messages no worker has taken yet


def redis_url_or_skip() -> str:
    """The test Redis's URL (see service_url_or_skip)."""
    return service_url_or_skip("PARITY_TEST_REDIS_URL", "Redis")


class WorkerProcess:
    """``celery -A parity.server.jobs.celery_app worker`` as a subprocess, configured by ``env`` as the server
    is (database, store, broker), as it is deployed."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = dict(env)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", CELERY_APP, "worker", "--pool=solo", "--concurrency=1",
             "-l", "info", "--without-gossip", "--without-mingle", "-n", f"test-{uuid.uuid4().hex[:8]}@%h"],
            cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        """SIGTERM (Celery's warm shutdown), then SIGKILL if it does not exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


Stoppable = ServerProcess | WorkerProcess


@pytest.fixture
def redis_url() -> str:
    return redis_url_or_skip()


@pytest.fixture
def broker(redis_url: str) -> Iterator[redis.Redis]:
    """A client of the test Redis, emptied before and after the test so no message outlives its test."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def spawn() -> Iterator[Callable[[Stoppable], Any]]:
    """Starts a server or worker and stops it at teardown, whatever the test did (last started, first
    stopped)."""
    started: list[Stoppable] = []

    def _spawn(proc: Stoppable) -> Any:
        started.append(proc)
        return proc.start()

    yield _spawn
    for proc in reversed(started):
        proc.stop()


def celery_env(redis_url: str) -> dict[str, str]:
    """The server's (and so the worker's) environment for the Celery backend; no result backend is used."""
    return {"PARITY_JOB_BACKEND": "celery", "PARITY_CELERY_BROKER_URL": redis_url}


def upload_pair(api: httpx.Client, tmp_path: Path) -> tuple[str, str]:
    target = upload_run(api, build_dump(tmp_path / "npu", perturb=0.5, ranks=(0, 1)))
    bench = upload_run(api, build_dump(tmp_path / "gpu", ranks=(0, 1)), device="gpu")
    return target["id"], bench["id"]


def post_comparison(api: httpx.Client, target: str, bench: str) -> dict[str, Any]:
    resp = api.post("/comparisons", json={"target_run": target, "bench_run": bench})
    assert resp.status_code == 202, resp.text
    return dict(resp.json())


def outcome(api: httpx.Client, cid: str) -> dict[str, Any]:
    """What a client sees of a succeeded comparison: summary, every row and the reports' text."""
    done = wait_comparison(api, cid, timeout=60)
    assert done["status"] == "succeeded", done["error"]
    rows = api.get(f"/comparisons/{cid}/rows", params={"limit": 10000})
    assert rows.status_code == 200, rows.text
    xlsx = api.get(f"/comparisons/{cid}/report.xlsx", params={"rank": 1})
    assert xlsx.status_code == 200 and xlsx.content[:2] == b"PK", xlsx.text[:200]
    advisor = [api.get(f"/comparisons/{cid}/advisor.txt", params={"rank": r}).text for r in (0, 1)]
    return {"summary": done["summary"], "rows": rows.json(), "advisor": advisor}


def test_worker_runs_the_job_as_the_local_pool_does(
    tmp_path: Path, redis_url: str, broker: redis.Redis, spawn: Callable[[Stoppable], Any]
) -> None:
    data_dir = tmp_path / "data"
    srv: ServerProcess = spawn(ServerProcess(data_dir, celery_env(redis_url)))
    worker: WorkerProcess = spawn(WorkerProcess(srv.env, tmp_path / "worker.log"))
    with srv.client() as api:
        target, bench = upload_pair(api, tmp_path)
        cid = post_comparison(api, target, bench)["id"]
        by_celery = outcome(api, cid)
    assert "Torch.relu.0.forward" in by_celery["summary"]["failing_apis"]
    assert by_celery["summary"]["ranks"] == [0, 1] and by_celery["rows"]["count"] > 0
    # The worker, not the server, ran it: the server has no pool in this mode.
    assert f"comparison {cid} succeeded" in worker.log(), worker.log()[-3000:]
    worker.stop()
    srv.stop()

    # The same runs, compared again by the local pool of a server on the same data directory.
    local: ServerProcess = spawn(
        ServerProcess(data_dir, {"PARITY_JOB_BACKEND": "local", "PARITY_WORKERS": "1"})
    )
    with local.client() as api:
        by_pool = outcome(api, post_comparison(api, target, bench)["id"])
    assert by_celery == by_pool


def test_a_job_waits_queued_for_a_worker(
    tmp_path: Path, redis_url: str, broker: redis.Redis, spawn: Callable[[Stoppable], Any]
) -> None:
    data_dir = tmp_path / "data"
    env = celery_env(redis_url)
    srv: ServerProcess = spawn(ServerProcess(data_dir, env))
    with srv.client() as api:
        target, bench = upload_pair(api, tmp_path)
        cid = post_comparison(api, target, bench)["id"]
        # The server sent the id to Redis and nobody took it: the job stays queued.
        assert broker.llen(QUEUE_KEY) == 1
        assert api.get(f"/comparisons/{cid}").json()["status"] == "queued"
    srv.stop()

    # The message is lost (a broker restarted without persistence): the next server start sends it again.
    broker.flushdb()
    srv = spawn(ServerProcess(data_dir, env))
    assert broker.llen(QUEUE_KEY) == 1, srv.log()[-3000:]

    worker: WorkerProcess = spawn(WorkerProcess(srv.env, tmp_path / "worker.log"))
    with srv.client() as api:
        done = wait_comparison(api, cid, timeout=60)
        assert done["status"] == "succeeded", (done["error"], worker.log()[-3000:])
        assert "Torch.relu.0.forward" in done["summary"]["failing_apis"]
    assert broker.llen(QUEUE_KEY) == 0
