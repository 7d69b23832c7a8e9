"""The S3 store against moto's standalone S3 server: uploads, validation, a compare job, deletion."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.server.conftest import (
    ServerProcess,
    build_dump,
    free_port,
    new_run,
    put,
    sha,
    upload_run,
    wait_comparison,
)

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
