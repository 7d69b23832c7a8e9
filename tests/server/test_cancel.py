"""Cancellation and deadlines that bite: a deleted or cancelled job stops at once, a job past its deadline is
failed and stopped, and the queue moves on, on a real local pool.

The heartbeat reads every half second whether its attempt still holds the job; the working thread stops at
its next check (between the phases of a statistics rank too, not only between tensor pairs), and if that
check does not come within ``STOP_GRACE_S`` a pool worker's heartbeat ends its process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from parity.server.db import Database
from parity.server.job_repository import JobRepository
from parity.server.jobs.lease import LeaseLost
from parity.server.jobs.runner import job_lease
from parity.server.migrate import upgrade
from parity.server.models import Comparison, Run, utcnow
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.job import RankPair, compare_rank
from parity.shared.compare.options import CompareOptions

from tests.server.conftest import (
    ServerProcess,
    build_dump,
    fresh_postgres_database,
    postgres_url_or_skip,
    upload_run,
    wait_comparison,
)
from tests.server.test_validation import big_dump


# -- the heartbeat, on the database alone -------------------------------------------------------------------
@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Database]:
    if request.param == "postgres":
        url = fresh_postgres_database(postgres_url_or_skip())
    else:
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
    upgrade(url)
    database = Database.connect(url)
    with database.write() as session:
        session.add(Run(id="r1", name="n", project="p", device="npu", status="complete"))
        session.flush()
        session.add(Comparison(id="c1", target_run_id="r1", bench_run_id="r1", options={}, status="queued"))
        session.flush()
        JobRepository(session).add_rank_jobs("c1", {0: 1}, utcnow())
    yield database
    database.dispose()


def _claim(db: Database) -> int:
    with db.write() as session:
        attempt = JobRepository(session).claim("c1:0", utcnow(), 60, "w1")
    assert attempt == 1
    return attempt


@pytest.mark.parametrize("how", ["deleted", "cancelled"])
def test_a_stuck_job_that_is_deleted_or_cancelled_has_its_process_ended(db: Database, how: str) -> None:
    """The working thread is inside one long unit and never checks: past the grace, the heartbeat ends the
    process (here a recorder stands in for the SIGKILL a pool worker gets). A 60 s lease: only the look
    every half second can see the change."""
    attempt = _claim(db)
    ended = threading.Event()
    with job_lease(db, "c1:0", attempt, 60, hard_stop=True) as lease:
        lease._stop_process = ended.set
        with db.write() as session:
            if how == "deleted":
                JobRepository(session).delete_for("rank", ["c1"])
            else:
                JobRepository(session).cancel("rank", "c1", "cancelled", utcnow())
        assert ended.wait(timeout=30), "the heartbeat did not end the stuck worker"
        assert lease.lost.is_set()
        with pytest.raises(LeaseLost):
            lease.check()


def test_a_job_that_checks_in_time_stops_by_itself(db: Database) -> None:
    attempt = _claim(db)
    ended = threading.Event()
    with job_lease(db, "c1:0", attempt, 60, hard_stop=True) as lease:
        lease._stop_process = ended.set
        with db.write() as session:
            JobRepository(session).delete_for("rank", ["c1"])
        with pytest.raises(LeaseLost):
            while True:  # the work's units: each checks (``progress``)
                lease.progress(0, 0)
                time.sleep(0.01)
    assert not ended.is_set()  # it left the block within its grace: no process ended


def test_a_job_past_its_deadline_is_failed_and_a_stuck_one_ended(db: Database) -> None:
    attempt = _claim(db)
    ended = threading.Event()
    with job_lease(db, "c1:0", attempt, 60, timeout=0.2, hard_stop=True) as lease:
        lease._stop_process = ended.set
        assert ended.wait(timeout=30)
    with db.read() as session:
        job = JobRepository(session).get("c1:0")
        assert job is not None and job.status == "failed"
        assert "PARITY_JOB_TIMEOUT_SECONDS" in (job.error or "")
        assert session.get_one(Comparison, "c1").status == "failed"


def test_a_statistics_rank_offers_its_caller_points_to_stop_between_phases(tmp_path: Path) -> None:
    root = build_dump(tmp_path / "d")
    dump = root / "step0" / "rank0" / "dump.json"
    calls: list[tuple[int, int]] = []
    compare_dumps(dump, dump, CompareOptions(), progress=lambda done, total: calls.append((done, total)))
    assert calls.count((0, 0)) >= 3  # reading, pairing, building the rows, highlighting
    calls.clear()
    compare_rank(RankPair(0, dump, dump), CompareOptions(), xlsx_path=tmp_path / "r.xlsx",
                 advisor_path=tmp_path / "a.txt", progress=lambda d, t: calls.append((d, t)))  # fmt: skip
    assert calls.count((0, 0)) >= 5  # and localizing, writing the xlsx

    class Cancelled(Exception):
        pass

    def cancel(done: int, total: int) -> None:
        raise Cancelled

    with pytest.raises(Cancelled):
        compare_dumps(dump, dump, CompareOptions(), progress=cancel)


# -- a real local pool --------------------------------------------------------------------------------------
def _wait_running(api: httpx.Client, cid: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = api.get(f"/comparisons/{cid}").json()
        if any(t["status"] == "running" for t in body["tasks"]):
            return
        assert body["status"] in ("queued", "running"), body
        time.sleep(0.02)
    raise AssertionError(f"comparison {cid} did not start in {timeout}s")


def _compare(api: httpx.Client, target: dict[str, Any], bench: dict[str, Any]) -> str:
    resp = api.post("/comparisons", json={"target_run": target["id"], "bench_run": bench["id"]})
    assert resp.status_code in (200, 201, 202), resp.text
    return str(resp.json()["id"])


@pytest.mark.slow
def test_a_local_pool_stops_deleted_cancelled_and_late_jobs_and_moves_on(tmp_path: Path) -> None:
    """One worker: a large statistics rank (seconds of work) is deleted, then another cancelled, just after
    they start; the small comparison queued behind each runs. With a deadline of 0.5 s, the large rank fails
    at its deadline, and the queue moves on (a run's validation, which has no deadline, runs next)."""
    big = big_dump(tmp_path / "big", apis=40_000)  # a rank of seconds' work, even on a fast machine
    small = build_dump(tmp_path / "small")
    data = tmp_path / "data"
    srv = ServerProcess(data, {"PARITY_WORKERS": "1"}).start()
    try:
        with srv.client() as api:
            big_runs = [upload_run(api, big) for _ in range(2)]
            small_runs = [upload_run(api, small) for _ in range(2)]
            for stop in ("delete", "cancel"):
                slow = _compare(api, *big_runs)
                _wait_running(api, slow)
                quick = _compare(api, *small_runs)
                if stop == "delete":
                    assert api.delete(f"/comparisons/{slow}").status_code == 204
                else:
                    cancelled = api.post(f"/comparisons/{slow}/cancel")
                    assert cancelled.status_code == 200, cancelled.text
                    assert cancelled.json()["status"] == "failed" and cancelled.json()["error"] == "cancelled"
                assert wait_comparison(api, quick)["status"] == "succeeded"
                assert api.delete(f"/comparisons/{quick}").status_code == 204
                log = srv.log()
                assert f"comparison {slow} rank 0 succeeded" not in log  # it stopped, not finished
                assert f"comparison {slow} rank 0: attempt 1 no longer holds the job" in log, log[-3000:]
                if stop == "cancel":
                    assert api.post(f"/comparisons/{slow}/retry").status_code == 200
                    assert api.delete(f"/comparisons/{slow}").status_code == 204  # stopped again
    finally:
        srv.stop()
    srv = ServerProcess(data, {"PARITY_WORKERS": "1", "PARITY_JOB_TIMEOUT_SECONDS": "0.5"}).start()
    try:
        with srv.client() as api:
            late = _compare(api, *big_runs)
            body = wait_comparison(api, late)
            assert body["status"] == "failed" and "PARITY_JOB_TIMEOUT_SECONDS=0.5 s" in body["error"], body
            assert f"comparison {late} rank 0 succeeded" not in srv.log()
            assert upload_run(api, small)["status"] == "complete"  # the queue moved on: the worker is free
    finally:
        srv.stop()
