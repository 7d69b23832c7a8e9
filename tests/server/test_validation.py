"""A run's validation is a job on the backend: ``complete`` answers at once with the run ``validating`` and
never parses a dump.json in the API process; a worker parses it (in a child) and makes the run ``complete``
or ``invalid`` naming the file and entry; a worker killed mid-validation has it taken over (local pool and
Celery: ``test_celery_backend.py``); the claim itself follows the rank tasks' lease rules."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import psutil
import pytest
from fastapi.testclient import TestClient
from parity.server.db import Database
from parity.server.job_repository import JobRepository
from parity.server.jobs import validation
from parity.server.main import create_app
from parity.server.migrate import upgrade
from parity.server.models import Job, Run, utcnow
from parity.server.settings import Settings

from tests.factories import stats_leaf, write_raw_dump
from tests.server.conftest import ServerProcess, dump_files, new_run, put, wait_run
from tests.workers import validate_waiting


@pytest.mark.parametrize("in_process_bytes", [validation.IN_PROCESS_BYTES, 0], ids=["in-process", "child"])
def test_a_valid_dump_passes_and_a_broken_one_is_named_with_its_problem(tmp_path: Path,
                                                                        in_process_bytes: int) -> None:
    good = write_raw_dump(
        tmp_path / "good", {"Torch.add.0.forward": {"output": [stats_leaf(1.0, 0.0, 0.5, 1.0)]}}
    )
    bad = tmp_path / "bad" / "dump.json"
    bad.parent.mkdir()
    bad.write_text('{"task": "statistics", "data": {"Torch.add.0.forward": ')
    limit = {"in_process_bytes": in_process_bytes}
    assert validation.validate_dumps([("step0/rank0/dump.json", good)], **limit) is None
    problem = validation.validate_dumps([("step0/rank0/dump.json", good), ("step0/rank1/dump.json", bad)],
                                        **limit)  # fmt: skip
    assert problem is not None and problem.startswith("step0/rank1/dump.json: ")
    assert "malformed JSON" in problem and str(tmp_path) not in problem  # no server-side path


def _upload(client: TestClient, root: Path) -> str:
    run_id = str(client.post("/runs", json={"name": root.name, "device": "npu"}).json()["id"])
    for path, data in dump_files(root):
        resp = put(client, run_id, path, data)  # type: ignore[arg-type]
        assert resp.status_code == 201, resp.text
    return run_id


def test_the_api_process_never_parses_a_dump_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``complete`` answers 202 without reading any dump.json (the reader raises in this process); the
    worker's validation parses it in its own child process and makes the run complete."""
    import parity.shared.dump.reader as reader

    def refuse(*args: object) -> None:
        raise AssertionError("load_dump ran in the API process")

    monkeypatch.setattr(reader, "load_dump", refuse)  # this process only; the spawned child imports afresh
    root = tmp_path / "run-a"
    write_raw_dump(root / "step0" / "rank0", {"Torch.add.0.forward": {"output": [stats_leaf(1, 0, 0.5, 1)]}})
    settings = Settings(data_dir=tmp_path / "data", workers=0)
    with TestClient(create_app(settings), base_url="http://parity/api/v1") as client:
        run_id = _upload(client, root)
        resp = client.post(f"/runs/{run_id}/complete")
        assert resp.status_code == 202 and resp.json()["status"] == "validating"
        # Nobody has validated it: comparisons wait for it with a clear 409.
        refused = client.post("/comparisons", json={"target_run": run_id, "bench_run": run_id})
        assert refused.status_code == 409 and "validating" in refused.json()["detail"]
        assert client.get(f"/runs/{run_id}").json()["status"] == "validating"
        page = client.get(f"http://parity/runs/{run_id}")  # the web page says so, and reloads until done
        assert page.status_code == 200 and 'id="run-status">validating<' in page.text
        assert '<meta http-equiv="refresh"' in page.text
        assert validate_waiting(settings) == 1  # what a worker of the backend does
        page = client.get(f"http://parity/runs/{run_id}")
        assert 'id="run-status">complete<' in page.text and 'http-equiv="refresh"' not in page.text
        run = client.get(f"/runs/{run_id}").json()
        assert run["status"] == "complete" and run["error"] is None and run["completed_at"] is not None
        blobs = list((tmp_path / "data" / "blobs" / "runs" / run_id / "blobs").glob("*.columns"))
        assert len(blobs) == 1  # the sidecar the compare tasks read


# -- the claim, on the database alone ---------------------------------------------------------------------
@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    url = f"sqlite:///{tmp_path / 'claims.db'}"
    upgrade(url)
    database = Database.connect(url)
    with database.write() as session:
        session.add(Run(id="r1", name="n", project="p", device="npu", status="validating"))
        JobRepository(session).queue_validation("r1", utcnow())
    yield database
    database.dispose()


def test_a_validation_is_claimed_once_and_taken_over_when_its_lease_passes(db: Database) -> None:
    now, job = utcnow(), "validate:r1"
    with db.write() as session:
        repo = JobRepository(session)
        assert repo.queued(10) == [job]
        assert repo.claim(job, now, 60, "w1") == 1
        assert repo.claim(job, now + timedelta(seconds=59), 60, "w2") is None  # held
        assert repo.queued(10) == [] and repo.lapsed(now + timedelta(seconds=59), 10) == []
        assert [r for r, _ in repo.lapsed(now + timedelta(seconds=61), 10)] == [job]
        assert repo.claim(job, now + timedelta(seconds=61), 60, "w2") == 2  # w1 is gone
        assert not repo.renew(job, 1, now + timedelta(seconds=200))  # the first attempt lost it
        assert repo.held(job, 1) is None and repo.held(job, 2) is not None
        assert repo.requeue_running("w2") == 1 and repo.queued(10) == [job]  # a dead local worker's: at once
        assert repo.claim_next(now, 60, "w3") == (job, 3)
        held = repo.held(job, 3)
        assert held is not None
        repo.finish(held, "succeeded", now=now)
        assert repo.claim(job, now + timedelta(seconds=999), 60, "w4") is None  # done: never again
        repo.queue_validation("r1", now)  # completed again (after an invalid one): attempts keep counting
        assert repo.claim(job, now, 60, "w4") == 4


def test_a_validation_lease_is_renewed_and_stops_the_work_once_another_attempt_holds_it(db: Database) -> None:
    """The validation runs under the rank jobs' lease helper (``server/jobs/lease.py``): renewed on its job
    row while held, ``LeaseLost`` once another worker took the validation over."""
    from parity.server.jobs.lease import LeaseLost
    from parity.server.jobs.runner import job_lease

    def expiry() -> object:
        with db.read() as session:
            return session.get_one(Job, "validate:r1").lease_expires_at

    with db.write() as session:
        assert JobRepository(session).claim("validate:r1", utcnow(), 0.3, "w1") == 1
    first = expiry()
    with job_lease(db, "validate:r1", 1, 0.3) as lease:
        deadline = time.monotonic() + 10
        while expiry() == first and time.monotonic() < deadline:  # renewed every 0.1 s
            time.sleep(0.02)
        assert expiry() != first
        lease.check()  # still held
        with db.write() as session:  # its lease passes unrenewed and another worker claims it
            assert JobRepository(session).claim("validate:r1", utcnow() + timedelta(seconds=5), 60, "w2") == 2
        assert lease.lost.wait(timeout=10)
        with pytest.raises(LeaseLost, match="attempt 1 no longer holds the job"):
            lease.check()


# -- a worker killed mid-validation -----------------------------------------------------------------------
def big_dump(root: Path, apis: int = 40_000) -> Path:
    """A statistics dump.json of ``apis`` calls (~10 MB): its validation takes the worker a few seconds."""
    leaf = stats_leaf(1.0, 0.0, 0.5, 1.0)
    data = {f"Torch.relu.{i}.forward": {"input_args": [leaf], "input_kwargs": {}, "output": [leaf]}
            for i in range(apis)}  # fmt: skip
    write_raw_dump(root / "step0" / "rank0", data)
    return root


def validation_claim(data_dir: Path, run_id: str) -> tuple[int, str | None]:
    conn = sqlite3.connect(f"file:{data_dir / 'parity.db'}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT attempt, worker FROM jobs WHERE id = ?", (f"validate:{run_id}",))
        attempt, worker = row.fetchone()
        return int(attempt), worker
    finally:
        conn.close()


def wait_claimed(data_dir: Path, run_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if validation_claim(data_dir, run_id)[1] is not None:
            return
        time.sleep(0.02)
    raise AssertionError(f"run {run_id}: no worker claimed its validation in {timeout}s")


def upload_big(api: httpx.Client, root: Path) -> str:
    run = new_run(api)
    for path, data in dump_files(root):
        assert put(api, run["id"], path, data).status_code == 201
    assert api.post(f"/runs/{run['id']}/complete").status_code == 202
    return str(run["id"])


def test_a_local_worker_killed_mid_validation_has_it_taken_over(tmp_path: Path) -> None:
    root = big_dump(tmp_path / "big")
    srv = ServerProcess(tmp_path / "data", {"PARITY_WORKERS": "1"}).start()
    try:
        with srv.client() as api:
            run_id = upload_big(api, root)
            wait_claimed(srv.data_dir, run_id)
            assert srv.proc is not None
            (worker,) = [p for p in psutil.Process(srv.proc.pid).children()
                         if "spawn_main" in " ".join(p.cmdline())]  # fmt: skip
            parse = worker.children()  # its parsing child, if it started yet: it dies with the worker
            worker.kill()
            run = wait_run(api, run_id)
            assert validation_claim(srv.data_dir, run_id)[0] == 2, srv.log()[-3000:]
            assert f"validation of run {run_id}" in srv.log() and "queued again" in srv.log()
            assert run["status"] == "complete" and run["error"] is None
            psutil.wait_procs(parse, timeout=10)
            assert not any(p.is_running() for p in parse)
    finally:
        srv.stop()


def test_a_local_worker_makes_a_broken_run_invalid_naming_file_and_entry(tmp_path: Path) -> None:
    root = tmp_path / "broken"
    write_raw_dump(root / "step0" / "rank0", {"Torch.add.0.forward": {"output": [stats_leaf(1, 0, 0.5, 1)]}})
    write_raw_dump(root / "step0" / "rank1", {"Torch.mul.3.backward": 5})
    srv = ServerProcess(tmp_path / "data", {"PARITY_WORKERS": "1"}).start()
    try:
        with srv.client() as api:
            run_id = upload_big(api, root)
            run = wait_run(api, run_id, status="invalid")
            assert run["error"] == "step0/rank1/dump.json: entry 'Torch.mul.3.backward': must be an object"
            published = list((srv.data_dir / "blobs" / "runs" / run_id).rglob("*.columns"))
            assert published == []  # nothing of an invalid run: no parsed columns
    finally:
        srv.stop()

