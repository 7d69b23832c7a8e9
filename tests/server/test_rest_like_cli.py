"""The REST API reads like the CLI: run names wherever ids, a status filter on rows, substring search, one tag
syntax, names unique in a project, a request asked again is not queued again (a failed one is retried),
deletes that would remove comparisons need a flag, the summary JSON downloadable (SQLite and PostgreSQL)."""

from __future__ import annotations

import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from tests.factories import stats_leaf, write_raw_dump
from tests.server.conftest import ServerProcess, new_run, put, upload_run, wait_comparison, wait_run


def _entry(out: tuple[float, float, float, float], requires_grad: bool = False) -> dict[str, Any]:
    return {"input_args": [stats_leaf(1.0, 0.0, 0.5, 2.0)], "input_kwargs": {},
            "output": [stats_leaf(*out, requires_grad=requires_grad)]}  # fmt: skip


SAME = (1.0, 0.0, 0.5, 2.0)
#: Row statuses of the comparison of the two dumps below, by NPU name (every status but bench-only).
EXPECTED = {
    "Torch.relu.0.forward.input.0": "pass", "Torch.relu.0.forward.output.0": "pass",
    "Torch.mul.0.forward.input.0": "pass", "Torch.mul.0.forward.output.0": "warning",  # requires_grad differs
    "Torch.add.0.forward.input.0": "pass", "Torch.add.0.forward.output.0": "fail",
    # Sub_x has no partner: a gap at the end of the target (#24), whose input crosses the gap's boundary
    # and is paired with the bench tensor it came from; its output stays unmatched.
    "Torch.Sub_x.0.forward.input.0": "pass", "Torch.Sub_x.0.forward.output.0": "unmatched",
}  # fmt: skip


def stats_dumps(tmp_path: Path) -> tuple[Path, Path]:
    """A target and a bench statistics dump whose comparison has pass, warning, fail and unmatched rows."""
    target = tmp_path / "npu"
    write_raw_dump(target / "step0" / "rank0", {
        "Torch.relu.0.forward": _entry(SAME),
        "Torch.mul.0.forward": _entry(SAME, requires_grad=True),
        "Torch.add.0.forward": _entry((9.0, -5.0, 3.5, 20.0)),
        "Torch.Sub_x.0.forward": _entry(SAME),
    })  # fmt: skip
    bench = tmp_path / "gpu"
    write_raw_dump(bench / "step0" / "rank0", {
        "Torch.relu.0.forward": _entry(SAME),
        "Torch.mul.0.forward": _entry(SAME),
        "Torch.add.0.forward": _entry(SAME),
    })  # fmt: skip
    return target, bench


def named_pair(api: httpx.Client, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any], str]:
    """Two complete runs with unique names in a project of their own."""
    project, suffix = f"p-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:8]
    target_dir, bench_dir = stats_dumps(tmp_path)
    target = upload_run(api, target_dir, name=f"npu-{suffix}", project=project)
    bench = upload_run(api, bench_dir, name=f"gpu-{suffix}", project=project, device="gpu")
    return target, bench, project


def compare(api: httpx.Client, body: dict[str, Any], code: int = 202) -> dict[str, Any]:
    resp = api.post("/comparisons", json=body)
    assert resp.status_code == code, resp.text
    return dict(resp.json())


def rows(api: httpx.Client, cid: str, **params: Any) -> dict[str, str]:
    resp = api.get(f"/comparisons/{cid}/rows", params={"limit": 1000, **params})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["count"] == len(body["data"])
    return {r["cells"][0]: r["status"] for r in body["data"]}


def test_a_run_name_works_wherever_an_id_does(api: httpx.Client, tmp_path: Path) -> None:
    name, project = f"by-name-{uuid.uuid4().hex[:8]}", f"p-{uuid.uuid4().hex[:8]}"
    run = new_run(api, name=name, project=project)
    dump = write_raw_dump(tmp_path / "step0" / "rank0", {"Torch.relu.0.forward": _entry(SAME)}).read_bytes()
    assert put(api, name, "step0/rank0/dump.json", dump).status_code == 201
    assert api.get(f"/runs/{name}").json()["id"] == run["id"]
    assert [f["path"] for f in api.get(f"/runs/{name}/files").json()["data"]] == ["step0/rank0/dump.json"]
    done = api.post(f"/runs/{name}/complete")
    assert done.status_code == 202 and done.json()["id"] == run["id"]
    assert done.json()["status"] == "validating"
    assert wait_run(api, name)["id"] == run["id"]

    # The same name in another project: a name alone is now ambiguous, an id never is.
    other = new_run(api, name=name, project=f"{project}-b")
    for resp in (api.get(f"/runs/{name}"), api.delete(f"/runs/{name}"), api.get(f"/runs/{name}/files")):
        assert resp.status_code == 409, resp.text
        detail = resp.json()["detail"]
        assert "ambiguous" in detail and run["id"] in detail and other["id"] in detail
    assert api.get(f"/runs/{run['id']}").json()["name"] == name  # nothing was deleted
    missing = api.get(f"/runs/no-such-run-{uuid.uuid4().hex[:6]}")
    assert missing.status_code == 404 and "no run has this id or name" in missing.json()["detail"]


def test_comparisons_take_run_names(api: httpx.Client, tmp_path: Path) -> None:
    target, bench, project = named_pair(api, tmp_path)
    queued = compare(api, {"target_run": target["name"], "bench_run": bench["name"]})
    assert (queued["target_run"], queued["bench_run"]) == (target["id"], bench["id"])
    for ref in (target["name"], bench["name"], target["id"]):
        listed = api.get("/comparisons", params={"run": ref}).json()
        assert [c["id"] for c in listed["data"]] == [queued["id"]], ref

    # A second run of the target's name elsewhere: names need their project now.
    twin = new_run(api, name=target["name"], project=f"{project}-twin")
    ambiguous = api.post("/comparisons", json={"target_run": target["name"], "bench_run": bench["id"]})
    assert ambiguous.status_code == 409 and "target_run" in ambiguous.json()["detail"]
    assert target["id"] in ambiguous.json()["detail"] and twin["id"] in ambiguous.json()["detail"]
    assert api.get("/comparisons", params={"run": target["name"]}).status_code == 409
    in_project = api.get("/comparisons", params={"run": target["name"], "project": project}).json()
    assert [c["id"] for c in in_project["data"]] == [queued["id"]]
    again = api.post("/comparisons", json={"target_run": target["name"], "bench_run": bench["name"],
                                          "project": project})  # fmt: skip
    assert again.status_code in (200, 202) and again.json()["id"] == queued["id"]
    unknown = api.post("/comparisons", json={"target_run": target["id"], "bench_run": "nobody"})
    assert unknown.status_code == 404 and "bench_run" in unknown.json()["detail"]


def test_a_run_name_is_taken_once_per_project(api: httpx.Client) -> None:
    name, project = f"once-{uuid.uuid4().hex[:8]}", f"p-{uuid.uuid4().hex[:8]}"
    first = new_run(api, name=name, project=project)
    second = api.post("/runs", json={"name": name, "project": project, "device": "gpu"})
    assert second.status_code == 409 and first["id"] in second.json()["detail"]
    assert new_run(api, name=name, project=f"{project}-other")["project"] == f"{project}-other"

    # Racing creations of one new name: exactly one wins, on both backends.
    racing = f"race-{uuid.uuid4().hex[:8]}"
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: api.post("/runs", json={"name": racing, "device": "npu"}).status_code,
                              range(8)))  # fmt: skip
    assert sorted(codes) == [201] + [409] * 7
    assert api.get("/runs", params={"name": racing}).json()["count"] == 1


def test_rows_filter_by_status_failing_and_name(api: httpx.Client, tmp_path: Path) -> None:
    target, bench, _ = named_pair(api, tmp_path)
    done = wait_comparison(api, compare(api, {"target_run": target["id"], "bench_run": bench["id"]})["id"])
    assert done["status"] == "succeeded", done["error"]
    cid = done["id"]
    assert rows(api, cid) == EXPECTED

    def having(*statuses: str) -> dict[str, str]:
        return {k: v for k, v in EXPECTED.items() if v in statuses}

    assert rows(api, cid, status="fail,warning") == having("fail", "warning")
    assert rows(api, cid, status=["fail", "unmatched"]) == having("fail", "unmatched")
    # failing=true: the red and the yellow rows, as the xlsx shows them, and the unmatched ones.
    assert rows(api, cid, failing="true") == having("fail", "warning", "unmatched")
    assert rows(api, cid, failing="false") == having("pass")
    assert rows(api, cid, failing="true", status="warning,pass") == having("warning")
    bad = api.get(f"/comparisons/{cid}/rows", params={"status": "fail,red"})
    assert bad.status_code == 400 and "status=red" in bad.json()["detail"]
    # Substring search ignores case and takes "_" and "%" literally, on both backends.
    assert rows(api, cid, name="SUB_X") == {k: v for k, v in EXPECTED.items() if "Sub_x" in k}
    assert rows(api, cid, name="m_l") == {} and rows(api, cid, name="%") == {}
    assert rows(api, cid, name="MUL.0", failing="true") == {"Torch.mul.0.forward.output.0": "warning"}
    page = api.get(f"/comparisons/{cid}/rows", params={"status": "pass", "limit": 2, "offset": 1}).json()
    assert page["count"] == 5 and [r["status"] for r in page["data"]] == ["pass", "pass"]


def test_asking_again_returns_the_comparison_and_retries_a_failed_one(
    api: httpx.Client, server: ServerProcess, tmp_path: Path
) -> None:
    target, bench, _ = named_pair(api, tmp_path)
    body = {"target_run": target["id"], "bench_run": bench["id"]}
    # The bench run's files vanish behind the server's back: the job fails.
    blobs = server.data_dir / "blobs" / "runs" / bench["id"] / "blobs"
    shutil.move(blobs, tmp_path / "kept-blobs")
    failed = wait_comparison(api, compare(api, body)["id"])
    assert failed["status"] == "failed" and failed["error"]

    shutil.move(tmp_path / "kept-blobs", blobs)
    retried = compare(api, body)  # 202: queued again, under the same id
    assert retried["id"] == failed["id"] and retried["status"] in ("queued", "running")
    assert retried["error"] is None and retried["finished_at"] is None
    done = wait_comparison(api, retried["id"])
    assert done["status"] == "succeeded", done["error"]
    assert compare(api, body, code=200)["id"] == done["id"]  # succeeded: returned as it is
    listed = api.get("/comparisons", params={"run": target["id"]}).json()
    assert [c["id"] for c in listed["data"]] == [done["id"]]
    # Other options are another comparison.
    other = compare(api, {**body, "options": {"fuzzy_match": True}})
    assert other["id"] != done["id"]


def test_deleting_a_run_that_comparisons_use_needs_the_flag(api: httpx.Client, tmp_path: Path) -> None:
    target, bench, _ = named_pair(api, tmp_path)
    cid = compare(api, {"target_run": target["id"], "bench_run": bench["id"]})["id"]
    wait_comparison(api, cid)
    refused = api.delete(f"/runs/{target['name']}")
    assert refused.status_code == 409
    assert cid in refused.json()["detail"] and "with_comparisons=true" in refused.json()["detail"]
    assert api.get(f"/runs/{target['id']}").status_code == 200
    assert api.get(f"/comparisons/{cid}").status_code == 200

    assert api.delete(f"/runs/{target['name']}", params={"with_comparisons": "true"}).status_code == 204
    assert api.get(f"/runs/{target['id']}").status_code == 404
    assert api.get(f"/comparisons/{cid}").status_code == 404

    # A comparison deleted on its own frees its runs; the runs stay.
    other, bench2, _ = named_pair(api, tmp_path / "second")
    cid2 = compare(api, {"target_run": other["id"], "bench_run": bench2["id"]})["id"]
    wait_comparison(api, cid2)
    assert api.delete(f"/comparisons/{cid2}").status_code == 204
    assert api.get(f"/comparisons/{cid2}").status_code == 404
    assert api.get(f"/runs/{other['id']}").status_code == 200
    assert api.delete(f"/runs/{other['id']}").status_code == 204
    assert api.delete(f"/comparisons/{cid2}").status_code == 404


def test_the_summary_json_downloads(api: httpx.Client, tmp_path: Path) -> None:
    target, bench, _ = named_pair(api, tmp_path)
    cid = compare(api, {"target_run": target["id"], "bench_run": bench["id"]})["id"]
    done = wait_comparison(api, cid)
    resp = api.get(f"/comparisons/{cid}/summary.json")
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    assert resp.headers["content-disposition"] == f'attachment; filename="compare_summary_{cid[:8]}.json"'
    doc = resp.json()
    assert doc["kind"] == "multi-rank" and doc["compared_ranks"] == [0]
    assert doc["mode"] == done["summary"]["mode"] == "statistics"
    counts = {s: list(EXPECTED.values()).count(s) for s in ("pass", "warning", "fail", "unmatched")}
    assert {k: v for k, v in doc["status_counts"].items() if v} == counts
    # The reports by the names they are downloaded under, the dumps by run and path: no server path.
    assert doc["ranks"][0]["rank"] == 0 and doc["ranks"][0]["files"] == {
        "xlsx": f"report_{cid[:8]}_rank0.xlsx", "advisor": f"advisor_{cid[:8]}_rank0.txt"}
    assert doc["ranks"][0]["npu_path"] == f"target run {target['id']}: step0/rank0/dump.json"
    assert ".tmp" not in resp.text and "task-" not in resp.text
    assert api.get(f"/comparisons/{uuid.uuid4().hex}/summary.json").status_code == 404
