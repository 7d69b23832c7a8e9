"""The Celery backend end to end with real parts: a ``parity server`` subprocess with
``PARITY_JOB_BACKEND=celery`` sending job ids through the Redis that ``scripts/test.sh`` starts
(``PARITY_TEST_REDIS_URL``), and a real ``celery worker`` subprocess, on the same data directory and
database, running them. Its results must be those of the local process pool for the same dumps, and a
worker killed mid-job must leave its job to the next worker (the runner's lease)."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from parity.server.db import Database
from parity.server.job_repository import JobRepository
from parity.server.jobs.celery_app import CeleryQueue
from parity.server.jobs.timeline import parse
from parity.server.migrate import upgrade
from parity.server.models import Comparison, Job, Run, utcnow
from parity.server.settings import Settings

from parity.demo import free_port
from tests.factories import stats_leaf, write_raw_dump
from tests.server.conftest import (
    REPO,
    LoggedProcess,
    ServerProcess,
    build_dump,
    service_url_or_skip,
    upload_run,
    wait_comparison,
    wait_run,
)
from tests.server.test_validation import big_dump, upload_big, validation_claim, wait_claimed

CELERY_APP = "parity.server.jobs.celery_app"
QUEUE_KEY = "celery"  # Celery's default queue: a Redis list holding the messages no worker has taken yet


def redis_url_or_skip() -> str:
    """The test Redis's URL (see service_url_or_skip)."""
    return service_url_or_skip("PARITY_TEST_REDIS_URL", "Redis")


class WorkerProcess(LoggedProcess):
    """``celery -A parity.server.jobs.celery_app worker`` as a subprocess, configured by ``env`` as the server
    is (database, store, broker), as it is deployed. ``pool="solo"`` runs the tasks in the worker process
    itself (killing it kills the task); Celery's default, ``prefork``, in ``concurrency`` daemonic
    children."""

    def __init__(self, env: dict[str, str], log_path: Path, pool: str = "solo", concurrency: int = 1) -> None:
        self.env = dict(env)
        self.log_path = log_path
        self.pool, self.concurrency = pool, concurrency
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", CELERY_APP, "worker", f"--pool={self.pool}",
             f"--concurrency={self.concurrency}",
             "-l", "info", "--without-gossip", "--without-mingle", "-n", f"test-{uuid.uuid4().hex[:8]}@%h"],
            cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        return self


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
def spawn() -> Iterator[Callable[[LoggedProcess], Any]]:
    """Starts a server or worker and stops it at teardown, whatever the test did (last started, first
    stopped)."""
    started: list[LoggedProcess] = []

    def _spawn(proc: LoggedProcess) -> Any:
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


def post_comparison(
    api: httpx.Client, target: str, bench: str, ranks: list[int] | None = None
) -> dict[str, Any]:
    """Queue a comparison; ``ranks`` named make it a request of its own (the same one is not run twice)."""
    resp = api.post("/comparisons", json={"target_run": target, "bench_run": bench, "ranks": ranks})
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


def outcome_on_the_local_pool(
    spawn: Callable[[LoggedProcess], Any], data_dir: Path, target: str, bench: str
) -> dict[str, Any]:
    """The same runs compared again, by the local pool of a server on the same data directory (ranks named:
    a request of its own, so not the comparison already done)."""
    local: ServerProcess = spawn(
        ServerProcess(data_dir, {"PARITY_JOB_BACKEND": "local", "PARITY_WORKERS": "1"})
    )
    with local.client() as api:
        return outcome(api, post_comparison(api, target, bench, ranks=[0, 1])["id"])


def test_worker_runs_the_job_as_the_local_pool_does(
    tmp_path: Path, redis_url: str, broker: redis.Redis, spawn: Callable[[LoggedProcess], Any]
) -> None:
    data_dir = tmp_path / "data"
    srv: ServerProcess = spawn(ServerProcess(data_dir, celery_env(redis_url)))
    # Celery's default pool, as deployed: its processes are daemonic, and the runs' validation (which
    # parses in a child of its own) runs there too.
    worker: WorkerProcess = spawn(WorkerProcess(srv.env, tmp_path / "worker.log", "prefork", 2))
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
    # Each rank's message arrival, then its run, in the worker's log (what ``bench_scale.py --trace`` reads).
    timeline = parse(worker.log().splitlines())
    for task in (f"{cid}:0", f"{cid}:1"):
        received = [r["received"] for r in timeline if r["task"] == task and "received" in r]
        ran = [r for r in timeline if r["task"] == task and "start" in r]
        assert len(ran) == 1 and received and received[0] <= ran[0]["start"] <= ran[0]["end"], timeline

    assert by_celery == outcome_on_the_local_pool(spawn, data_dir, target, bench)


def test_a_job_waits_queued_for_a_worker(
    tmp_path: Path, redis_url: str, broker: redis.Redis, spawn: Callable[[LoggedProcess], Any]
) -> None:
    data_dir = tmp_path / "data"
    env = celery_env(redis_url)
    srv: ServerProcess = spawn(ServerProcess(data_dir, env))
    validator: WorkerProcess = spawn(WorkerProcess(srv.env, tmp_path / "validator.log"))
    with srv.client() as api:
        target, bench = upload_pair(api, tmp_path)  # the runs validated by a worker, which then stops
        validator.stop()
        cid = post_comparison(api, target, bench)["id"]
        # The server sent one task id per rank to Redis and nobody took them: the job stays queued.
        assert broker.llen(QUEUE_KEY) == 2
        assert api.get(f"/comparisons/{cid}").json()["status"] == "queued"
    srv.stop()

    # The message is lost (a broker restarted without persistence): the next server start sends it again.
    broker.flushdb()
    srv = spawn(ServerProcess(data_dir, env))
    assert broker.llen(QUEUE_KEY) == 2, srv.log()[-3000:]

    worker: WorkerProcess = spawn(WorkerProcess(srv.env, tmp_path / "worker.log"))
    with srv.client() as api:
        done = wait_comparison(api, cid, timeout=60)
        assert done["status"] == "succeeded", (done["error"], worker.log()[-3000:])
        assert "Torch.relu.0.forward" in done["summary"]["failing_apis"]
    # The worker may have run the second rank as the first one's follower (one transaction claims it) before
    # taking that rank's own message, which then finds it done: the queue empties soon after, not before.
    deadline = time.monotonic() + 30
    while broker.llen(QUEUE_KEY) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert broker.llen(QUEUE_KEY) == 0


# -- a worker killed mid-job ---------------------------------------------------------------------------------
LEASE_S = 3  # short, so the test sees a dead worker's lease pass; the server looks at leases every 1.5 s
LARGE_APIS = 10_000  # per rank: 20,000 rows per rank, a few seconds of work for one worker


def build_large_dump(root: Path, *, perturb: float, ranks: tuple[int, ...] = (0, 1)) -> Path:
    """A statistics-mode dump of ``LARGE_APIS`` relu calls per rank: one dump.json per rank (quick to
    upload) whose rows take the worker long enough (matching, metrics, xlsx, row inserts) to be killed
    while it runs. ``perturb`` shifts the statistics so the target's rows differ from the bench's."""
    for rank in ranks:
        stats = np.random.default_rng(rank).standard_normal((LARGE_APIS, 2, 4)) + 5.0  # same on both sides
        shift = perturb * np.random.default_rng(100 + rank).standard_normal(stats.shape)
        data = {
            f"Torch.relu.{i}.forward": {
                "input_args": [stats_leaf(*map(float, stats[i, 0] + shift[i, 0]))],
                "input_kwargs": {},
                "output": [stats_leaf(*map(float, stats[i, 1] + shift[i, 1]))],
            }
            for i in range(LARGE_APIS)
        }
        write_raw_dump(root / "step0" / f"rank{rank}", data)
    return root


def wait_status(api: httpx.Client, cid: str, status: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = dict(api.get(f"/comparisons/{cid}").json())
        if body["status"] == status:
            return body
        assert body["status"] in ("queued", "running"), body
        time.sleep(0.05)
    raise AssertionError(f"comparison {cid} was not {status} within {timeout}s: {body}")


def attempt_of(data_dir: Path, cid: str) -> int:
    """The most claims any rank task of the comparison took, read from the server's SQLite database."""
    conn = sqlite3.connect(f"file:{data_dir / 'parity.db'}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT MAX(attempt) FROM jobs WHERE kind = 'rank' AND subject = ?", (cid,))
        return int(row.fetchone()[0])
    finally:
        conn.close()


def test_a_job_whose_worker_is_killed_runs_again_on_the_next(
    tmp_path: Path, redis_url: str, broker: redis.Redis, spawn: Callable[[LoggedProcess], Any]
) -> None:
    data_dir = tmp_path / "data"
    env = {**celery_env(redis_url), "PARITY_JOB_LEASE_SECONDS": str(LEASE_S)}
    srv: ServerProcess = spawn(ServerProcess(data_dir, env))
    first: WorkerProcess = spawn(WorkerProcess(srv.env, tmp_path / "worker1.log"))
    with srv.client() as api:
        target = upload_run(api, build_large_dump(tmp_path / "npu", perturb=0.5))["id"]
        bench = upload_run(api, build_large_dump(tmp_path / "gpu", perturb=0.0), device="gpu")["id"]
        cid = post_comparison(api, target, bench)["id"]
        wait_status(api, cid, "running")
        first.kill()
        # Killed mid-job: nothing finished it, and nothing but another worker will.
        assert api.get(f"/comparisons/{cid}").json()["status"] == "running", first.log()[-3000:]
        assert f"comparison {cid} succeeded" not in first.log()

        second: WorkerProcess = spawn(WorkerProcess(srv.env, tmp_path / "worker2.log"))
        done = wait_comparison(api, cid, timeout=60)
        assert done["status"] == "succeeded", (done["error"], second.log()[-3000:])
        assert re.search(f"comparison {cid} rank [01] claimed: attempt 2", second.log()), second.log()[-3000:]
        assert attempt_of(data_dir, cid) == 2
        assert "its worker's lease passed" in srv.log(), srv.log()[-3000:]
        recovered = outcome(api, cid)

        # The same pair compared by an undisturbed worker: the recovered job's results are a normal run's.
        normal_id = post_comparison(api, target, bench, ranks=[0, 1])["id"]
        normal = outcome(api, normal_id)
        assert attempt_of(data_dir, normal_id) == 1
    assert recovered == normal
    assert recovered["summary"]["ranks"] == [0, 1]
    assert recovered["summary"]["rows"] == 2 * 2 * LARGE_APIS and recovered["summary"]["failing_rows"] > 0


# -- the claim itself, on the database alone -----------------------------------------------------------------
@pytest.fixture
def db_with_job(tmp_path: Path) -> Iterator[tuple[Database, str]]:
    url = f"sqlite:///{tmp_path / 'claims.db'}"
    upgrade(url)
    db = Database.connect(url)
    with db.write() as session:
        session.add(Run(id="r1", name="n", project="p", device="npu", status="complete"))
        session.flush()  # the run first: no ORM relationship orders the two inserts
        session.add(Comparison(id="c1", target_run_id="r1", bench_run_id="r1", options={}, status="queued"))
        session.flush()
        JobRepository(session).add_rank_jobs("c1", {0: 1}, utcnow())
    yield db, "c1"
    db.dispose()


def claim(db: Database, cid: str, at: datetime, lease_s: float = 60) -> int | None:
    """Claim rank 0 of comparison ``cid`` (the one task of the fixture's comparison)."""
    with db.write() as session:
        return JobRepository(session).claim(f"{cid}:0", at, lease_s, worker="test")


def test_a_live_lease_keeps_the_job_and_a_lapsed_one_gives_it_up(db_with_job: tuple[Database, str]) -> None:
    db, cid = db_with_job
    now = utcnow()
    assert claim(db, cid, now) == 1
    assert claim(db, cid, now + timedelta(seconds=59)) is None  # its worker still holds it
    with db.read() as session:
        repo = JobRepository(session)
        assert repo.lapsed(now + timedelta(seconds=59), 10) == []
        assert [task for task, _ in repo.lapsed(now + timedelta(seconds=61), 10)] == [f"{cid}:0"]
        assert session.get_one(Comparison, cid).status == "running"  # from its first claimed rank on
    assert claim(db, cid, now + timedelta(seconds=61)) == 2  # the lease passed: its worker is gone
    with db.write() as session:
        repo = JobRepository(session)
        assert not repo.renew(f"{cid}:0", 1, now + timedelta(seconds=120))  # the first attempt lost it
        assert repo.renew(f"{cid}:0", 2, now + timedelta(seconds=180))
    assert claim(db, cid, now + timedelta(seconds=121)) is None  # renewed: still held
    with db.write() as session:
        session.get_one(Job, f"{cid}:0").status = "succeeded"
    assert claim(db, cid, now + timedelta(seconds=999)) is None  # a finished job is never claimed again


def test_exactly_one_of_many_claimants_wins_a_lapsed_job(db_with_job: tuple[Database, str]) -> None:
    db, cid = db_with_job
    now = utcnow()
    assert claim(db, cid, now, lease_s=1) == 1
    later = now + timedelta(seconds=2)
    results: list[int | None] = []
    barrier = threading.Barrier(6)

    def contend() -> None:
        barrier.wait()
        results.append(claim(db, cid, later))

    threads = [threading.Thread(target=contend) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results, key=lambda r: r or 0) == [None] * 5 + [2]


def test_a_worker_renews_its_lease_and_stops_once_another_holds_the_job(
    db_with_job: tuple[Database, str],
) -> None:
    from parity.server.jobs.lease import LeaseLost
    from parity.server.jobs.runner import job_lease

    db, cid = db_with_job
    now = utcnow()
    assert claim(db, cid, now, lease_s=0.3) == 1

    def lease_expiry() -> datetime:
        with db.read() as session:
            value = session.get_one(Job, f"{cid}:0").lease_expires_at
        assert value is not None
        return value

    first = lease_expiry()
    with job_lease(db, f"{cid}:0", 1, 0.3) as lease:
        deadline = time.monotonic() + 10
        while lease_expiry() <= first and time.monotonic() < deadline:  # renewed every 0.1 s
            time.sleep(0.02)
        assert lease_expiry() > first
        lease.check()  # still held: the work goes on
        # Its lease passes unrenewed (as when the worker stalls) and another worker claims the job.
        assert claim(db, cid, lease_expiry() + timedelta(seconds=1)) == 2
        assert lease.lost.wait(timeout=10)
        with pytest.raises(LeaseLost, match="attempt 1 no longer holds the job"):
            lease.check()
    with db.read() as session:
        assert session.get_one(Job, f"{cid}:0").attempt == 2  # the lost attempt wrote nothing


def test_a_celery_worker_killed_mid_validation_has_it_taken_over(
    tmp_path: Path, redis_url: str, broker: redis.Redis, spawn: Callable[[LoggedProcess], Any]
) -> None:
    """Real Redis and Celery workers: the first is killed while it validates; the server's lease watcher
    sends ``validate:{run}`` again once its lease passed, and the second worker validates it (attempt 2)."""
    root = big_dump(tmp_path / "big")
    data_dir = tmp_path / "data"
    env = {**celery_env(redis_url), "PARITY_JOB_LEASE_SECONDS": str(LEASE_S)}
    srv: ServerProcess = spawn(ServerProcess(data_dir, env))
    first: WorkerProcess = spawn(WorkerProcess(srv.env, tmp_path / "worker1.log"))
    with srv.client() as api:
        run_id = upload_big(api, root)
        wait_claimed(data_dir, run_id)
        first.kill()
        assert api.get(f"/runs/{run_id}").json()["status"] == "validating", first.log()[-3000:]
        second: WorkerProcess = spawn(WorkerProcess(srv.env, tmp_path / "worker2.log"))
        run = wait_run(api, run_id)
        assert run["status"] == "complete", second.log()[-3000:]
        assert validation_claim(data_dir, run_id)[0] == 2
        assert f"validation of run {run_id} claimed: attempt 2" in second.log(), second.log()[-3000:]
        assert f"task validate:{run_id}: its worker's lease passed" in srv.log(), srv.log()[-3000:]


def test_the_server_connects_to_the_broker_before_its_first_send(tmp_path: Path, redis_url: str) -> None:
    """``warm_up`` (the lease watcher's first act) opens the connection ``submit`` uses: the first
    comparison after a start no longer waits 0.1 s for it. A broker not reachable yet is an error the
    watcher logs, not a server that does not start."""
    db = Database.connect(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        queue = CeleryQueue(Settings(data_dir=tmp_path, celery_broker_url=redis_url), db)
        with queue.app.producer_or_acquire() as producer:
            assert not producer.connection.connected  # kombu connects on first use
        queue.warm_up()
        with queue.app.producer_or_acquire() as producer:
            assert producer.connection.connected
        unreachable = CeleryQueue(
            Settings(data_dir=tmp_path, celery_broker_url=f"redis://127.0.0.1:{free_port()}/0"), db
        )
        with pytest.raises(Exception, match="(?i)connect"):
            unreachable.warm_up()
    finally:
        db.dispose()
