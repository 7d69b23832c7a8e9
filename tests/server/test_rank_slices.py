"""A rank too large for one task (``PARITY_TASK_MAX_BYTES`` small here) runs as slices of its calls: the same
rows, xlsx and summary as one task per rank (tensor and statistics, SQLite and PostgreSQL); a failed slice is
retried alone; a slice stages only the tensor files its calls read."""

from __future__ import annotations

import json
import math
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from parity.server.jobs import staging as staging_module
from parity.server.jobs.base import task_id
from parity.server.models import RunFile
from parity.server.schemas import ComparisonCreate
from parity.server.services.comparisons import ComparisonService
from parity.server.store import comparison_key
from parity.shared.compare.job import RankPair, slice_tensor_files
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.slices import CallSlice
from sqlalchemy import select

from tests.factories import DumpBuilder
from tests.server.conftest import (
    LoggedProcess,
    fresh_postgres_database,
    postgres_url_or_skip,
)
from tests.server.harness import InProcess as Server
from tests.server.test_celery_backend import broker, redis_url, spawn  # noqa: F401 - fixtures

RANKS = (0, 1)
SLICES = 3


def _dump(root: Path, task: str, *, drift: float) -> Path:
    """Six calls a rank (three forwards, their backwards), the drift growing from the second call on."""
    for rank in RANKS:
        rng = np.random.default_rng(rank)
        x = rng.standard_normal(64).astype(np.float32)
        builder = DumpBuilder(task)
        for i in range(3):
            y = (np.tanh(x) + drift * i).astype(np.float32)
            builder.api(f"Torch.tanh.{i}.forward", inputs=[x], outputs=[y])
            x = y
        for i in reversed(range(3)):
            g = np.full(64, 1.0 + i, dtype=np.float32) * (1 + drift * i)
            builder.api(f"Torch.tanh.{i}.backward", inputs=[g], outputs=[g * 0.5])
        builder.write(root / "step0" / f"rank{rank}")
    return root


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    extra = {}
    if request.param == "postgres":
        extra["database_url"] = fresh_postgres_database(postgres_url_or_skip())
    with Server.open(tmp_path / "data", **extra) as server:
        yield server


def _runs(server: Server, tmp_path: Path, task: str) -> tuple[str, str]:
    npu = _dump(tmp_path / f"npu-{task}", task, drift=0.02)
    gpu = _dump(tmp_path / f"gpu-{task}", task, drift=0.0)
    return server.upload(npu, "npu"), server.upload(gpu, "gpu")


def _sliced(server: Server, target: str, bench: str) -> tuple[ComparisonService, int]:
    """A service whose PARITY_TASK_MAX_BYTES gives rank 0 SLICES slices, and that figure."""
    max_bytes = math.ceil(server.rank_bytes((target, bench), 0) / SLICES)
    return server.comparison_service(max_bytes), max_bytes


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_slices_give_the_rows_xlsx_and_summary_of_one_task_per_rank(
    server: Server, tmp_path: Path, task: str
) -> None:
    target, bench = _runs(server, tmp_path, task)
    whole = server.comparisons.create(ComparisonCreate(target_run=target, bench_run=bench))  # 2 GiB a task
    assert [(t.rank, t.slice, t.slices) for t in whole.tasks] == [(0, 0, 1), (1, 0, 1)]
    server.run_tasks([task_id(whole.id, r) for r in RANKS], workers=2)

    service, max_bytes = _sliced(server, target, bench)
    # another request (ranks named), so not the same comparison as the one above
    sliced = service.create(ComparisonCreate(target_run=target, bench_run=bench, ranks=list(RANKS)))
    planned = {r: math.ceil(server.rank_bytes((target, bench), r) / max_bytes) for r in RANKS}
    assert planned[0] == SLICES
    assert [(t.rank, t.slice, t.slices) for t in sliced.tasks] == [
        (r, k, planned[r]) for r in RANKS for k in range(planned[r])
    ]
    ids = [task_id(sliced.id, t.rank, t.slice) for t in sliced.tasks]
    random.Random(3).shuffle(ids)  # any order, two workers: whichever slice finishes last joins its rank
    server.run_tasks(ids, workers=2)

    a, b = service.get(whole.id), service.get(sliced.id)
    assert (a.status, b.status) == ("succeeded", "succeeded"), (a.error, b.error)
    assert all(t.status == "succeeded" and t.progress == 1.0 for t in b.tasks)
    assert a.summary is not None and b.summary is not None
    assert a.summary.model_dump() == b.summary.model_dump()
    assert a.summary.failing_rows > 0
    if task == "tensor":  # the joining slice fetched the suspects' tensor files for their float64 replay
        assert b.summary.replay and all(v.target.refusal is None for v in b.summary.replay), b.summary.replay
    assert server.rows(a.id) == server.rows(b.id)
    for rank in RANKS:
        assert server.xlsx(a.id, rank) == server.xlsx(b.id, rank)
    summaries = [json.loads(b"".join(service.summary_file(c)[1])) for c in (a.id, b.id)]
    for doc, c in zip(summaries, (a, b), strict=True):  # the dumps by run and path, never a staging folder
        assert "/.tmp/" not in json.dumps(doc)
        for rank_doc in doc["ranks"]:
            where = f"step0/rank{rank_doc['rank']}/dump.json"
            assert rank_doc.pop("npu_path") == f"target run {c.target_run}: {where}"
            assert rank_doc.pop("bench_path") == f"bench run {c.bench_run}: {where}"
            files = rank_doc.pop("files")  # the names each comparison serves its reports under
            assert files["xlsx"] == f"report_{c.id[:8]}_rank{rank_doc['rank']}.xlsx"
    assert summaries[0] == summaries[1]
    assert server.staging_left() == []
    stored = [key for key, _, _ in server.store.iter_blobs(comparison_key(b.id))]
    assert stored and not [key for key in stored if key.endswith(".part")]  # spent once the rank is stored


def test_a_failed_slice_is_retried_alone_and_stages_only_its_tensor_files(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, bench = _runs(server, tmp_path, "tensor")
    service, _ = _sliced(server, target, bench)
    cid = service.create(ComparisonCreate(target_run=target, bench_run=bench, ranks=[0])).id

    staged: dict[tuple[str, str], list[str]] = {}
    real_stage = staging_module.stage

    def recording_stage(blobs: Any, run_id: str, files: Any, dest: Path, label: str) -> int:
        files = list(files)
        staged.setdefault((dest.parent.name, label), []).extend(f.path for f in files)
        return real_stage(blobs, run_id, files, dest, label)

    monkeypatch.setattr(staging_module, "stage", recording_stage)

    # What each slice reads, from the dumps themselves.
    root = tmp_path / "npu-tensor" / "step0" / "rank0"
    pair = RankPair(0, root / "dump.json", tmp_path / "gpu-tensor" / "step0" / "rank0" / "dump.json")
    options = CompareOptions()
    expected = [slice_tensor_files(pair, options, CallSlice(k, SLICES)) for k in range(SLICES)]
    assert all(npu and bench for npu, bench in expected)
    # The store loses one tensor file that only slice 1 reads.
    lost_name = expected[1][1][0]
    with server.db.read() as session:
        where = (RunFile.run_id == bench, RunFile.path == f"step0/rank0/dump_tensor_data/{lost_name}")
        blob = session.scalars(select(RunFile.blob).where(*where)).one()
    kept = tmp_path / "kept.pt"
    shutil.move(server.store.root / blob, kept)

    server.run_tasks([task_id(cid, 0, k) for k in range(SLICES)], workers=1)
    failed = service.get(cid)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.startswith("rank 0 slice 1: ") and "missing from the store" in failed.error
    assert [(t.slice, t.status, t.attempt) for t in failed.tasks] == [
        (0, "succeeded", 1), (1, "failed", 1), (2, "succeeded", 1)
    ]  # fmt: skip
    assert server.rows(cid) == []  # the rank's rows wait for its last slice
    assert server.staging_left() == []

    # Each slice staged its rank's dump.json and only the tensor files its calls read.
    for k, (npu_names, bench_names) in enumerate(expected):
        folders = [name for name in staged if name[1] == "target" and f"-s{k}-" in name[0]]
        assert len(folders) == 1
        tensors = sorted(p.rsplit("/", 1)[1] for p in staged[folders[0]] if "/dump_tensor_data/" in p)
        assert tensors == sorted(npu_names), k
        assert "step0/rank0/dump.json" in staged[folders[0]]
        if k != 1:  # slice 1 stopped at its lost file
            bench_folder = (folders[0][0], "bench")
            assert sorted(p.rsplit("/", 1)[1] for p in staged[bench_folder] if "/dump_tensor_data/" in p) == \
                sorted(bench_names)  # fmt: skip

    shutil.move(kept, server.store.root / blob)
    retried = service.retry(cid)
    assert [(t.slice, t.status) for t in retried.tasks] == [(0, "succeeded"), (1, "queued"), (2, "succeeded")]
    server.run_tasks([task_id(cid, 0, k) for k in range(SLICES)], workers=1)  # only slice 1 is claimable
    done = service.get(cid)
    assert done.status == "succeeded", done.error
    assert [(t.slice, t.status, t.attempt) for t in done.tasks] == [
        (0, "succeeded", 1), (1, "succeeded", 2), (2, "succeeded", 1)
    ]  # fmt: skip
    whole = server.comparisons.create(ComparisonCreate(target_run=target, bench_run=bench))  # 2 GiB a task
    server.run_tasks([task_id(whole.id, r) for r in RANKS], workers=2)
    assert server.rows(cid) == [row for row in server.rows(whole.id) if row[0] == 0]
    assert server.staging_left() == []


def test_a_server_with_a_small_task_max_bytes_runs_slices_on_its_local_pool(tmp_path: Path) -> None:
    """``parity server`` configured by its environment only: PARITY_TASK_MAX_BYTES splits the ranks, two
    local workers run the slices, and the REST body shows each rank's slices; the summary is the CLI's."""
    from parity.shared.compare.job import run_compare
    from parity.shared.compare.spec import CompareSpec

    from tests.server.conftest import ServerProcess, upload_run, wait_comparison

    npu = _dump(tmp_path / "npu", "tensor", drift=0.02)
    gpu = _dump(tmp_path / "gpu", "tensor", drift=0.0)
    env = {"PARITY_TASK_MAX_BYTES": "12000", "PARITY_WORKERS": "2"}
    srv = ServerProcess(tmp_path / "srv", env).start()
    try:
        with srv.client() as api:
            target, bench = upload_run(api, npu)["id"], upload_run(api, gpu, device="gpu")["id"]
            resp = api.post("/comparisons", json={"target_run": target, "bench_run": bench})
            assert resp.status_code in (200, 201, 202), resp.text
            body = wait_comparison(api, resp.json()["id"])
    finally:
        srv.stop()
    assert body["status"] == "succeeded", body["error"]
    slices = {t["rank"]: t["slices"] for t in body["tasks"]}
    assert all(k > 1 for k in slices.values()) and set(slices) == set(RANKS)
    assert sorted((t["rank"], t["slice"]) for t in body["tasks"]) == [
        (r, k) for r in RANKS for k in range(slices[r])
    ]
    assert all(t["status"] == "succeeded" for t in body["tasks"])
    cli = run_compare(CompareSpec(npu_path=npu / "step0", bench_path=gpu / "step0"), tmp_path / "cli",
                      CompareOptions())  # fmt: skip
    assert body["summary"]["rows"] == sum(len(r.rows) for r in cli.results)
    failing = dict.fromkeys(api for result in cli.results for api in result.failing_apis())
    assert body["summary"]["failing_apis"] == list(failing) and failing


def test_celery_runs_slices_and_gives_what_one_task_per_rank_gives(
    tmp_path: Path,
    redis_url: str,  # noqa: F811 - the fixtures imported above
    broker: Any,  # noqa: F811
    spawn: Callable[[LoggedProcess], Any],  # noqa: F811
) -> None:
    """A real Redis and ``celery worker``: the slices of each rank (task ids ``COMPARISON:RANK.SLICE``) give
    the summary, rows and advisor text that the local pool gives with one task per rank."""
    from tests.server.conftest import ServerProcess, upload_run
    from tests.server.test_celery_backend import (
        WorkerProcess,
        celery_env,
        outcome,
        outcome_on_the_local_pool,
        post_comparison,
    )

    npu = _dump(tmp_path / "npu", "tensor", drift=0.02)
    gpu = _dump(tmp_path / "gpu", "tensor", drift=0.0)
    data_dir = tmp_path / "data"
    env = {**celery_env(redis_url), "PARITY_TASK_MAX_BYTES": "12000"}
    srv: ServerProcess = spawn(ServerProcess(data_dir, env))
    worker = spawn(WorkerProcess(srv.env, tmp_path / "worker.log"))
    with srv.client() as api:
        target, bench = upload_run(api, npu)["id"], upload_run(api, gpu, device="gpu")["id"]
        cid = post_comparison(api, target, bench)["id"]
        by_slices = outcome(api, cid)
        tasks = api.get(f"/comparisons/{cid}").json()["tasks"]
    assert all(t["slices"] > 1 for t in tasks), tasks
    assert f"comparison {cid} rank 0 slice 1 claimed" in worker.log()  # its id went through the broker
    worker.stop()
    srv.stop()

    assert by_slices == outcome_on_the_local_pool(spawn, data_dir, target, bench)  # one task per rank
