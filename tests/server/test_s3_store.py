"""The S3 store against moto's standalone S3 server: uploads, validation, a compare job, deletion; the
worker cache (streamed downloads of the blobs a task names, under a byte cap, dropped after a failure)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from parity.server.blob_cache import BlobCache
from parity.server.jobs.base import task_id
from parity.server.jobs.runner import TaskRunner
from parity.server.schemas import ComparisonCreate

from parity.demo import free_port
from tests.server.conftest import (
    ServerProcess,
    build_dump,
    new_run,
    put,
    sha,
    upload_run,
    wait_comparison,
)
from tests.server.harness import InProcess

BUCKET = "parity-test"


@pytest.fixture(scope="module")
def s3_env() -> Iterator[dict[str, str]]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    moto.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                      aws_access_key_id="test", aws_secret_access_key="test")  # fmt: skip
    s3.create_bucket(Bucket=BUCKET)
    yield env
    moto.stop()


def keys(env: dict[str, str], prefix: str) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                      aws_access_key_id="test", aws_secret_access_key="test")  # fmt: skip
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []))


def test_s3_store_end_to_end(s3_env: dict[str, str], tmp_path: Path) -> None:
    env = {**s3_env, "PARITY_STORE_URL": f"s3://{BUCKET}/team", "PARITY_WORKERS": "1"}
    srv = ServerProcess(tmp_path / "data", env).start()
    try:
        with srv.client() as api:
            run = new_run(api)
            assert put(api, run["id"], "step0/rank0/stack.json", b"{}").status_code == 201
            assert put(api, run["id"], "step0/rank0/stack.json", b"{}").status_code == 200
            assert put(api, run["id"], "step0/rank0/x.pt", b"abc", digest=sha(b"abd")).status_code == 422
            stored = keys(s3_env, f"team/runs/{run['id']}/")
            assert len(stored) == 1 and stored[0].startswith(f"team/runs/{run['id']}/blobs/")
            assert not (tmp_path / "data" / "blobs").exists()

            target = upload_run(api, build_dump(tmp_path / "npu", perturb=0.5))
            bench = upload_run(api, build_dump(tmp_path / "gpu"))
            stored = keys(s3_env, f"team/runs/{target['id']}/")
            sidecars = [k for k in stored if k.endswith(".columns")]  # the parsed dump.json, from complete
            assert len(stored) - len(sidecars) == api.get(f"/runs/{target['id']}/files").json()["count"]
            assert len(sidecars) == 1
            cid = api.post(
                "/comparisons", json={"target_run": target["id"], "bench_run": bench["id"]}
            ).json()["id"]
            done = wait_comparison(api, cid)
            assert done["status"] == "succeeded", done["error"]
            assert "Torch.relu.0.forward" in done["summary"]["failing_apis"]
            assert keys(s3_env, f"team/comparisons/{cid}/") == [
                f"team/comparisons/{cid}/rank0/advisor.txt",
                f"team/comparisons/{cid}/rank0/report.xlsx",
            ]
            report = api.get(f"/comparisons/{cid}/report.xlsx")
            assert report.status_code == 200 and report.content[:2] == b"PK"
            assert api.get(f"/comparisons/{cid}/rows").json()["count"] == done["summary"]["rows"]

            assert api.delete(f"/runs/{target['id']}", params={"with_comparisons": True}).status_code == 204
            assert keys(s3_env, f"team/runs/{target['id']}/") == []
            assert keys(s3_env, f"team/comparisons/{cid}/") == []
            assert not list((tmp_path / "data" / "tmp").glob("upload-*"))
    finally:
        srv.stop()


def test_s3_racing_uploads_keep_one_object_matching_its_row(s3_env: dict[str, str], tmp_path: Path) -> None:
    from tests.server.test_upload_race import N, bodies, race_puts

    s3 = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                      aws_access_key_id="test", aws_secret_access_key="test")  # fmt: skip
    srv = ServerProcess(tmp_path / "data", {**s3_env, "PARITY_STORE_URL": f"s3://{BUCKET}/race",
                                            "PARITY_WORKERS": "0"}).start()  # fmt: skip
    try:
        with srv.client() as api:
            run = new_run(api)
            same = race_puts(srv, run["id"], "step0/rank0/same.pt", bodies(distinct=False, seed=1))
            assert sorted(same) == [200] * (N - 1) + [201], same
            other = race_puts(srv, run["id"], "step0/rank0/other.pt", bodies(distinct=True, seed=2))
            assert sorted(other) == [201] + [409] * (N - 1), other
            files = api.get(f"/runs/{run['id']}/files").json()["data"]
        objects = keys(s3_env, f"race/runs/{run['id']}/")
        assert len(objects) == len(files) == 2  # the losers' objects were deleted
        stored = {sha(s3.get_object(Bucket=BUCKET, Key=k)["Body"].read()) for k in objects}
        assert stored == {f["sha256"] for f in files}
        assert not list((tmp_path / "data" / "tmp").glob("upload-*"))
    finally:
        srv.stop()


# -- the worker cache: only the blobs a task names, streamed in, bounded, dropped after a failure -----------
@dataclass
class OneWorker(InProcess):
    """The harness's services, with one worker's runner kept across tasks: its cache is what is watched."""

    runner: TaskRunner = field(init=False)

    def __post_init__(self) -> None:
        self.runner = TaskRunner(self.settings, worker="test")

    def compare(self, target: str, bench: str) -> tuple[str, list[tuple[Any, ...]]]:
        c = self.comparisons.create(ComparisonCreate(target_run=target, bench_run=bench))
        for task in c.tasks:
            self.runner.run(task_id(c.id, task.rank, task.slice))
        return self.comparisons.get(c.id).status, self.rows(c.id)

    def close(self) -> None:
        self.runner.close()
        super().close()


@pytest.fixture
def aws(s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3_env.items():
        monkeypatch.setenv(name, value)


def test_a_compare_on_s3_reads_through_a_bounded_cache_and_gives_the_file_stores_rows(
    aws: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranks = (0, 1, 2)
    npu = build_dump(tmp_path / "npu", perturb=0.5, ranks=ranks)
    gpu = build_dump(tmp_path / "gpu", ranks=ranks)
    on_files = OneWorker.create(tmp_path / "files")
    file_status, file_rows = on_files.compare(on_files.upload(npu, "npu"), on_files.upload(gpu, "gpu"))
    # What one task reads: a rank pair's files and the two dump.json sidecars written by the validation.
    sidecar = max(p.stat().st_size for p in (tmp_path / "files" / "blobs").rglob("*.columns"))
    task_bytes = 2 * sidecar + sum(p.stat().st_size for root in (npu, gpu)
                                   for p in (root / "step0" / "rank0").rglob("*") if p.is_file())  # fmt: skip
    cap = 2 * task_bytes  # about two ranks' worth, less than the whole step's 3

    on_disk: list[int] = []
    fetched: list[tuple[BlobCache, int]] = []
    download = BlobCache._download

    def measured(self: BlobCache, key: str, path: Path, size: int) -> None:
        download(self, key, path, size)
        on_disk.append(sum(p.stat().st_size for p in self.files()))
        fetched.append((self, size))

    monkeypatch.setattr(BlobCache, "_download", measured)
    on_s3 = OneWorker.create(tmp_path / "s3", store_url=f"s3://{BUCKET}/cache-{uuid.uuid4().hex[:8]}",
                             worker_cache_bytes=cap)  # fmt: skip
    try:
        s3_status, s3_rows = on_s3.compare(on_s3.upload(npu, "npu"), on_s3.upload(gpu, "gpu"))
        assert s3_status == file_status == "succeeded"
        assert s3_rows == file_rows and len(s3_rows) > 0
        assert on_disk and max(on_disk) <= cap  # streamed in as each task asked, evicted to stay under cap
        by_tasks = sum(size for cache, size in fetched if cache is on_s3.runner.cache)
        assert by_tasks > cap  # the step's files would not have fit: the finished ranks' were evicted
        assert on_s3.runner.cache.used_bytes <= cap
        assert not list((tmp_path / "s3" / "tmp").glob("task-*"))  # staging removed
    finally:
        on_s3.close()
        on_files.close()


def test_a_failed_task_leaves_the_cache_empty_and_a_blob_too_large_is_named(
    aws: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from parity.shared.compare import job

    npu, gpu = build_dump(tmp_path / "npu", perturb=0.5), build_dump(tmp_path / "gpu")
    server = OneWorker.create(tmp_path / "s3", store_url=f"s3://{BUCKET}/fail-{uuid.uuid4().hex[:8]}")
    try:
        target, bench = server.upload(npu, "npu"), server.upload(gpu, "gpu")
        server.runner.cache.clear()  # the validation's dump.json copies: a fresh worker's empty cache

        def broken(*args: Any, **kwargs: Any) -> Any:
            assert server.runner.cache.files(), "the task's blobs were fetched before the engine ran"
            raise RuntimeError("the engine failed")

        monkeypatch.setattr(job, "compare_rank", broken)
        status, _ = server.compare(target, bench)
        assert status == "failed"
        assert server.runner.cache.files() == [] and server.runner.cache.used_bytes == 0
        assert not list((tmp_path / "s3" / "tmp").glob("task-*"))
        monkeypatch.undo()

        server.runner.cache.cap_bytes = 1000  # smaller than the rank's tensors
        c = server.comparisons.create(ComparisonCreate(target_run=target, bench_run=bench, ranks=[0]))
        server.runner.run(f"{c.id}:0")
        failed = server.comparisons.get(c.id)
        assert failed.status == "failed" and "PARITY_WORKER_CACHE_BYTES=1000" in (failed.error or "")
        assert server.runner.cache.files() == []
    finally:
        server.close()
