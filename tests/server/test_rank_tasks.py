"""A comparison as one task per rank, run in this process by ``TaskRunner`` (what the local pool's workers and
the Celery workers run): the same rows and summary whatever the order and parallelism of the ranks, and the
same as ``parity compare`` on the step directories; a failed rank is retried alone; staging folders are
removed after a failure as after a success."""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from parity.server.db import Database
from parity.server.jobs.base import task_id
from parity.server.migrate import upgrade
from parity.server.models import Job, RunFile
from parity.server.schemas import ComparisonCreate
from parity.shared.compare.job import run_compare
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import json_cells
from parity.shared.compare.spec import CompareSpec
from sqlalchemy import select, update

from tests.server.conftest import build_dump
from tests.server.harness import InProcess as Server

RANKS = (0, 1, 2)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with Server.open(tmp_path / "data") as server:
        yield server


@pytest.fixture
def pair(tmp_path: Path, server: Server) -> tuple[str, str, Path, Path]:
    npu = build_dump(tmp_path / "npu", perturb=0.5, ranks=RANKS)
    gpu = build_dump(tmp_path / "gpu", ranks=RANKS)
    return server.upload(npu, "npu"), server.upload(gpu, "gpu"), npu, gpu


def _run_all(server: Server, cid: str, order: list[int], workers: int = 1) -> None:
    """Run the comparison's tasks in rank ``order`` on ``workers`` runners side by side."""
    server.run_tasks([task_id(cid, rank) for rank in order], workers)


def _create(server: Server, target: str, bench: str) -> str:
    return server.comparisons.create(ComparisonCreate(target_run=target, bench_run=bench)).id


def test_the_same_rows_whatever_the_order_and_parallelism(
    server: Server, pair: tuple[str, str, Path, Path], tmp_path: Path
) -> None:
    target, bench, npu, gpu = pair
    outcomes = []
    for order, workers in (([0, 1, 2], 1), ([2, 0, 1], 1), ([0, 1, 2], 2), ([1, 2, 0], 3)):
        cid = _create(server, target, bench)
        _run_all(server, cid, order, workers)
        public = server.comparisons.get(cid)
        assert public.status == "succeeded", public.error
        assert [t.status for t in public.tasks] == ["succeeded"] * 3 and public.progress == 1.0
        assert public.summary is not None
        outcomes.append((server.rows(cid), public.summary.model_dump()))
    assert all(outcome == outcomes[0] for outcome in outcomes[1:])
    rows, summary = outcomes[0]
    assert summary["ranks"] == [0, 1, 2] and "Torch.relu.0.forward" in summary["failing_apis"]

    # The CLI's pipeline on the same step directories gives the very same rows (NaN spelled alike).
    outputs = run_compare(CompareSpec(npu_path=npu / "step0", bench_path=gpu / "step0"), tmp_path / "cli",
                          CompareOptions())  # fmt: skip
    cli_rows = [(result.rank, i, row.api, row.status.value, json_cells(row.cells))
                for result in outputs.results for i, row in enumerate(result.rows)]  # fmt: skip
    assert [(*row[:4], row[-1]) for row in rows] == cli_rows  # (rank, idx, api, status, cells)
    cli_summary = json.loads(outputs.summary.read_text()) if outputs.summary else {}
    assert summary["rows"] == sum(cli_summary["status_counts"].values())
    assert server.staging_left() == []


def test_a_failed_rank_is_retried_alone_and_its_staging_is_removed(
    server: Server, pair: tuple[str, str, Path, Path], tmp_path: Path
) -> None:
    target, bench, _, _ = pair
    cid = _create(server, target, bench)
    # The store loses rank 1's bench dump.json behind the server's back.
    with server.db.read() as session:
        where = (RunFile.run_id == bench, RunFile.path == "step0/rank1/dump.json")
        blob = session.scalars(select(RunFile.blob).where(*where)).one()
    lost = server.store.root / blob
    kept = tmp_path / "kept.json"
    shutil.move(lost, kept)
    _run_all(server, cid, [0, 1, 2])

    failed = server.comparisons.get(cid)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.startswith("rank 1: ") and "missing from the store" in failed.error
    assert server.tasks(cid) == {0: ("succeeded", 1), 1: ("failed", 1), 2: ("succeeded", 1)}
    assert server.staging_left() == []  # removed after the failure as after the successes
    done_before = [row for row in server.rows(cid) if row[0] != 1]
    assert {row[0] for row in done_before} == {0, 2}  # stored as each rank finished

    shutil.move(kept, lost)
    retried = server.comparisons.retry(cid)
    assert retried.status == "running"
    assert [(t.rank, t.status) for t in retried.tasks] == [(0, "succeeded"), (1, "queued"), (2, "succeeded")]
    _run_all(server, cid, [0, 1, 2])  # the finished ranks are not claimable: only rank 1 runs

    done = server.comparisons.get(cid)
    assert done.status == "succeeded", done.error
    assert server.tasks(cid) == {0: ("succeeded", 1), 1: ("succeeded", 2), 2: ("succeeded", 1)}
    assert [row for row in server.rows(cid) if row[0] != 1] == done_before
    assert {row[0] for row in server.rows(cid)} == {0, 1, 2}
    assert server.staging_left() == []


def test_retry_refuses_a_comparison_that_did_not_fail(
    server: Server, pair: tuple[str, str, Path, Path]
) -> None:
    from parity.server.errors import Conflict

    cid = _create(server, pair[0], pair[1])
    with pytest.raises(Conflict, match="only a failed comparison is retried"):
        server.comparisons.retry(cid)


def test_tasks_read_the_columns_parsed_at_complete(server: Server, pair: tuple[str, str, Path, Path]) -> None:
    target, bench, _, _ = pair
    reference = _create(server, target, bench)
    _run_all(server, reference, list(RANKS))
    with server.db.read() as session:
        blobs = session.scalars(select(RunFile.blob).where(RunFile.path.endswith("/dump.json"))).all()
    assert len(blobs) == 2 * len(RANKS)
    for blob in blobs:
        assert (server.store.root / f"{blob}.columns").is_file()  # written by complete, beside the dump
        # The dump.json itself is now unreadable: only its sidecar can give the rows.
        (server.store.root / blob).unlink()
        (server.store.root / blob).write_text("not json")
    again = _create(server, target, bench)
    _run_all(server, again, list(RANKS))
    assert server.comparisons.get(again).status == "succeeded"
    assert server.rows(again) == server.rows(reference)


@pytest.mark.slow
def test_a_local_worker_killed_mid_rank_loses_only_that_rank(tmp_path: Path) -> None:
    """The local pool's child dies (SIGKILL) while it compares a rank: that rank is queued again at once and
    finished by the next child (attempt 2); the comparison succeeds with the rows of an undisturbed run."""
    import psutil

    from tests.server.conftest import ServerProcess, upload_run, wait_comparison
    from tests.server.test_celery_backend import build_large_dump, wait_status

    srv = ServerProcess(tmp_path / "data", {"PARITY_WORKERS": "1"}).start()
    try:
        with srv.client() as api:
            target = upload_run(api, build_large_dump(tmp_path / "npu", perturb=0.5))["id"]
            bench = upload_run(api, build_large_dump(tmp_path / "gpu", perturb=0.0), device="gpu")["id"]
            body = {"target_run": target, "bench_run": bench}
            cid = api.post("/comparisons", json=body).json()["id"]
            running = wait_status(api, cid, "running")
            held = next(t["rank"] for t in running["tasks"] if t["status"] == "running")
            assert srv.proc is not None
            (child,) = [p for p in psutil.Process(srv.proc.pid).children()
                        if "spawn_main" in " ".join(p.cmdline())]  # fmt: skip
            child.kill()
            done = wait_comparison(api, cid, timeout=120)
            assert done["status"] == "succeeded", done["error"]
            attempts = {t["rank"]: t["attempt"] for t in done["tasks"]}
            assert attempts[held] == 2 and all(a == 1 for r, a in attempts.items() if r != held), attempts
            assert "queued again" in srv.log()
            normal = wait_comparison(api, api.post("/comparisons", json=body).json()["id"], timeout=120)
            assert done["summary"] == normal["summary"]
            rows = [
                api.get(f"/comparisons/{c}/rows", params={"limit": 100}).json() for c in (cid, normal["id"])
            ]
            assert rows[0] == rows[1]
        assert not list((tmp_path / "data" / "blobs" / ".tmp").glob("task-*"))
    finally:
        srv.stop()


def test_a_rank_without_a_dump_json_on_one_side_is_skipped(server: Server, tmp_path: Path) -> None:
    npu = build_dump(tmp_path / "npu", perturb=0.5, ranks=RANKS)
    gpu = build_dump(tmp_path / "gpu", ranks=RANKS)
    (gpu / "step0" / "rank2" / "dump.json").unlink()  # its tensors are there, its dump.json is not
    cid = _create(server, server.upload(npu, "npu"), server.upload(gpu, "gpu"))
    # planned as the CLI plans it (plan_rank_sets): skipped when queued, so it gets no task
    assert [t.rank for t in server.comparisons.get(cid).tasks] == [0, 1]
    _run_all(server, cid, [0, 1])
    done = server.comparisons.get(cid)
    assert done.status == "succeeded" and done.summary is not None
    assert done.summary.ranks == [0, 1] and done.summary.skipped_ranks == [2]
    assert [(t.rank, t.status) for t in done.tasks] == [(0, "succeeded"), (1, "succeeded")]


def test_each_rank_stores_the_calls_its_rows_give(server: Server, pair: tuple[str, str, Path, Path]) -> None:
    """The calls and counts the rank tasks store with their rows (outside the merge, one rank at a time) are
    the ones ``index_comparison`` builds from the stored rows afterwards."""
    from parity.server.models import ComparisonCall, ComparisonCounts
    from parity.server.services.calls import index_comparison

    cid = _create(server, pair[0], pair[1])
    _run_all(server, cid, [2, 0, 1], workers=2)

    def stored() -> tuple[list[tuple[Any, ...]], dict[str, int]]:
        with server.db.read() as session:
            c = ComparisonCall
            calls = session.execute(
                select(c.rank, c.seq, c.api, c.backward, c.status, c.max_rel_err, c.one_minus_cos,
                       c.first_row).where(c.comparison_id == cid).order_by(c.rank, c.seq)
            ).all()  # fmt: skip
            counts = session.get(ComparisonCounts, cid)
            assert counts is not None
            return [tuple(row) for row in calls], dict(counts.counts)

    by_tasks = stored()
    assert {call[0] for call in by_tasks[0]} == set(RANKS)
    assert sum(by_tasks[1].values()) == len(server.rows(cid))
    assert index_comparison(server.db, cid)
    assert stored() == by_tasks


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_workers_claiming_the_next_task_at_once_each_get_a_different_one(
    tmp_path: Path, backend: str
) -> None:
    """``claim_next`` (the local pool's pull): six claimants at once over four queued tasks of two comparisons
    get four different tasks, the oldest comparison's first and its ranks in order, and two get none."""
    from datetime import timedelta

    from parity.server.job_repository import JobRepository
    from parity.server.models import Comparison, Run, utcnow

    from tests.server.conftest import fresh_postgres_database, postgres_url_or_skip

    if backend == "postgres":
        url = fresh_postgres_database(postgres_url_or_skip())
    else:
        url = f"sqlite:///{tmp_path / 'claims.db'}"
    upgrade(url)
    db = Database.connect(url)
    try:
        now = utcnow()
        with db.write() as session:
            session.add(Run(id="r1", name="n", project="p", device="npu", status="complete"))
            session.flush()
            for n, cid in enumerate(("c-old", "c-new")):
                session.add(Comparison(id=cid, target_run_id="r1", bench_run_id="r1", options={},
                                       status="queued"))  # fmt: skip
                session.flush()
                JobRepository(session).add_rank_jobs(cid, {0: 1, 1: 1}, now + timedelta(seconds=n))
        claimed: list[tuple[str, int] | None] = []
        barrier = threading.Barrier(6)

        def claim_next(worker: str) -> None:
            barrier.wait()
            with db.write() as session:
                claimed.append(JobRepository(session).claim_next(utcnow(), 60, worker))

        threads = [threading.Thread(target=claim_next, args=(f"w{i}",)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = sorted(c for c in claimed if c is not None)
        assert got == [("c-new:0", 1), ("c-new:1", 1), ("c-old:0", 1), ("c-old:1", 1)]
        assert claimed.count(None) == 2
        with db.read() as session:
            tasks = session.scalars(select(Job)).all()
            assert {t.status for t in tasks} == {"running"} and len({t.worker for t in tasks}) == 4
            assert {session.get_one(Comparison, cid).status for cid in ("c-old", "c-new")} == {"running"}
        # One at a time, the oldest comparison's lowest rank comes first.
        with db.write() as session:
            session.execute(update(Job).values(status="queued", attempt=0))
        order = []
        while True:
            with db.write() as session:
                nxt = JobRepository(session).claim_next(utcnow(), 60, "w")
            if nxt is None:
                break
            order.append(nxt[0])
        assert order == ["c-old:0", "c-old:1", "c-new:0", "c-new:1"]
    finally:
        db.dispose()


def test_each_task_logs_its_timeline_in_order(
    server: Server, pair: tuple[str, str, Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """The lines ``bench_scale.py --trace`` reads: one per task, its phases in order, a failed task's too."""
    from parity.server.jobs.timeline import PHASES, parse

    target, bench, _, _ = pair
    cid = _create(server, target, bench)
    with server.db.read() as session:  # rank 2 will fail: its target dump.json is gone from the store
        where = (RunFile.run_id == target, RunFile.path == "step0/rank2/dump.json")
        (server.store.root / session.scalars(select(RunFile.blob).where(*where)).one()).unlink()
    caplog.set_level(logging.INFO, logger="parity.server.jobs.timeline")
    _run_all(server, cid, [0, 1, 2])

    records = {r["task"]: r for r in parse(caplog.messages)}
    assert set(records) == {f"{cid}:0", f"{cid}:1", f"{cid}:2"}
    for task in (f"{cid}:0", f"{cid}:1"):  # succeeded: every phase, in order
        marks = [records[task][phase] for phase in PHASES]
        assert marks == sorted(marks) and records[task]["worker"]
    failed = records[f"{cid}:2"]
    assert [p for p in PHASES if p in failed] == ["start", "claimed", "end"]
    assert parse(["a line cut short: task-timeline {\"task\": "]) == []


def test_a_worker_claims_its_next_task_as_it_stores_one(server: Server, pair: tuple[str, str, Path, Path]
                                                        ) -> None:  # fmt: skip
    """``pull_next`` (the job backends' workers): storing a rank claims the oldest queued task in the same
    transaction, and the runner runs it next; a message whose task another worker took pulls the next queued
    one; a run's validation waiting is claimed next and ends the chain (workers run those first)."""
    from parity.server.job_repository import JobRepository
    from parity.server.jobs.runner import TaskRunner
    from parity.server.models import Run, utcnow

    target, bench, _, _ = pair
    plain = _create(server, target, bench)
    _run_all(server, plain, [0, 1, 2])
    plain_rows = server.rows(plain)
    server.comparisons.delete(plain)  # the same request again would find it

    def tasks(cid: str) -> list[tuple[int, str, int, str | None]]:
        with server.db.read() as session:
            t = Job
            found = session.execute(select(t.rank, t.status, t.attempt, t.worker)
                                    .where(t.subject == cid).order_by(t.started_at)).all()  # fmt: skip
        return [tuple(row) for row in found]  # type: ignore[misc]

    runner = TaskRunner(server.settings, worker="puller", pull_next=True)
    try:
        cid = _create(server, target, bench)
        assert runner.run(task_id(cid, 1))  # one message: rank 1, then the ranks still queued, oldest first
        assert tasks(cid) == [(1, "succeeded", 1, "puller"), (0, "succeeded", 1, "puller"),
                              (2, "succeeded", 1, "puller")]  # fmt: skip
        assert server.comparisons.get(cid).status == "succeeded"
        assert server.rows(cid) == plain_rows
        assert not runner.run(task_id(cid, 0))  # done, and nothing else queued: a no-op
        server.comparisons.delete(cid)

        cid = _create(server, target, bench)
        with server.db.write() as session:  # rank 0 is another worker's, under a live lease
            session.execute(update(Job).where(Job.subject == cid, Job.rank == 0)
                            .values(status="running", attempt=1, worker="other", started_at=utcnow(),
                                    lease_expires_at=utcnow() + timedelta(hours=1)))  # fmt: skip
        assert runner.run(task_id(cid, 0))  # its message pulls what is queued instead
        assert tasks(cid) == [(0, "running", 1, "other"), (1, "succeeded", 1, "puller"),
                              (2, "succeeded", 1, "puller")]  # fmt: skip
        server.comparisons.delete(cid)

        cid = _create(server, target, bench)
        with server.db.write() as session:  # a run waits for its validation
            session.add(Run(id="waiting", name="n", project="p", device="npu", status="validating"))
            JobRepository(session).queue_validation("waiting", utcnow())
        assert runner.run(task_id(cid, 2))
        # the validation was claimed next (it has no files: the run is invalid), and it ends the chain
        assert sorted((rank, status) for rank, status, _, _ in tasks(cid)) == [
            (0, "queued"), (1, "queued"), (2, "succeeded")]  # fmt: skip
        with server.db.read() as session:
            assert session.get_one(Run, "waiting").status == "invalid"
            assert session.get_one(Job, "validate:waiting").worker == "puller"
    finally:
        runner.close()
