"""Baselines and regressions over REST, on a real server (SQLite and PostgreSQL): ``PATCH /runs/{id}``,
the comparison queued against the baseline on complete (and the opt-out), failing APIs judged new or known,
accept-with-note, an API's history and the environment difference of two runs."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.server.conftest import build_dump, upload_run, wait_comparison


def against_baseline(api: httpx.Client, run_id: str, timeout: float = 60) -> dict[str, Any]:
    """The comparison the server queued on its own when ``run_id`` completed, once it finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = api.get("/comparisons", params={"run": run_id}).json()["data"]
        if found:
            assert len(found) == 1, found
            assert found[0]["against_baseline"] is True
            return wait_comparison(api, found[0]["id"])
        time.sleep(0.1)
    raise AssertionError(f"no comparison was queued for run {run_id}")


def test_patch_edits_name_tags_and_the_one_baseline(api: httpx.Client, tmp_path: Path) -> None:
    project = f"p-{uuid.uuid4().hex[:8]}"
    dump = build_dump(tmp_path / "d")
    a = upload_run(api, dump, project=project, tags={"old": "1"})
    b = upload_run(api, dump, project=project)
    resp = api.patch(f"/runs/{a['id']}", json={"name": "renamed", "tags": {"hw": "npu"}, "baseline": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["name"], body["tags"], body["baseline"]) == ("renamed", {"hw": "npu"}, True)
    listed = api.get("/runs", params={"project": project, "tag": "hw=npu"}).json()["data"]
    assert [r["id"] for r in listed] == [a["id"]]
    assert api.get("/runs", params={"project": project, "tag": "old=1"}).json()["count"] == 0

    assert api.patch(f"/runs/{b['id']}", json={"baseline": True}).json()["baseline"] is True
    assert api.get(f"/runs/{a['id']}").json()["baseline"] is False  # one baseline per project

    assert api.patch("/runs/nope", json={"name": "x"}).status_code == 404
    bad = api.patch(f"/runs/{a['id']}", json={"owner": "me"})
    assert bad.status_code == 422 and "owner" in bad.json()["detail"]
    assert api.patch(f"/runs/{a['id']}", json={"name": ""}).status_code == 422
    # null fields change nothing (schemathesis found a 500 here).
    same = api.patch(f"/runs/{a['id']}", json={"name": None, "tags": None, "baseline": None})
    assert same.status_code == 200 and same.json()["tags"] == {"hw": "npu"}, same.text
    # Names stay unique in a project: a rename onto a taken name is refused, naming the run that has it.
    taken = api.patch(f"/runs/{a['id']}", json={"name": b["name"]})
    assert taken.status_code == 409 and b["id"] in taken.json()["detail"], taken.text
    assert api.patch(f"/runs/{a['id']}", json={"name": "renamed"}).status_code == 200  # its own name: fine


def test_runs_completing_in_a_project_with_a_baseline_are_compared_to_it(
    api: httpx.Client, tmp_path: Path
) -> None:
    project = f"p-{uuid.uuid4().hex[:8]}"
    good, bad = build_dump(tmp_path / "good"), build_dump(tmp_path / "bad", perturb=0.5)
    base = upload_run(api, good, project=project, name="base",
                      metadata={"torch_version": "2.12.0", "packages": {"numpy": "2.1.0"}})  # fmt: skip
    assert api.patch(f"/runs/{base['id']}", json={"baseline": True}).status_code == 200

    first = upload_run(api, bad, project=project, name="first",
                       metadata={"torch_version": "2.13.0", "packages": {"numpy": "2.2.0"}})  # fmt: skip
    c1 = against_baseline(api, first["id"])
    assert c1["status"] == "succeeded" and c1["bench_run"] == base["id"]
    r1 = api.get(f"/comparisons/{c1['id']}/regressions").json()
    assert r1["against_baseline"] and r1["previous_comparison"] is None
    assert r1["new"] >= 1 and r1["known"] == 0
    assert "Torch.relu.0.forward" in [v["api"] for v in r1["data"] if v["verdict"] == "new"]

    second = upload_run(api, bad, project=project, name="second")
    c2 = against_baseline(api, second["id"])
    r2 = api.get(f"/comparisons/{c2['id']}/regressions").json()
    assert r2["previous_comparison"] == c1["id"]
    assert r2["new"] == 0 and {v["verdict"] for v in r2["data"]} == {"known"}
    assert all(v["failed_before"] for v in r2["data"])

    # Accepted with a note: known from then on, even where it never failed before.
    accepted = api.post(f"/projects/{project}/acceptances",
                        json={"api": "Torch.relu.0.forward", "note": "bf16 rounding, expected"})  # fmt: skip
    assert accepted.status_code == 201, accepted.text
    r1 = api.get(f"/comparisons/{c1['id']}/regressions").json()
    relu = next(v for v in r1["data"] if v["api"] == "Torch.relu.0.forward")
    assert (relu["verdict"], relu["note"]) == ("known", "bf16 rounding, expected")
    assert relu["accepted_by"] == "anonymous"
    assert api.get(f"/projects/{project}/acceptances").json()["count"] == 1

    history = api.get(f"/projects/{project}/api-history", params={"api": "Torch.relu.0.forward"}).json()
    assert [p["comparison_id"] for p in history["data"]] == [c1["id"], c2["id"]]
    assert all(p["status"] == "fail" and p["max_rel_err"] > 0.01 for p in history["data"])

    env = api.get(f"/comparisons/{c1['id']}/environment").json()
    changed = {c["key"]: (c["target"], c["bench"]) for c in env["changed"]}
    assert changed["torch_version"] == ("2.13.0", "2.12.0")
    assert env["packages_changed"] == [{"key": "numpy", "target": "2.2.0", "bench": "2.1.0"}]

    calls = api.get(f"/comparisons/{c1['id']}/calls").json()
    assert [c["api"] for c in calls["data"]] == ["Functional.linear.0.forward", "Torch.relu.0.forward",
                                                 "Torch.sum.0.forward"]  # fmt: skip
    assert calls["first_divergence"] == "Torch.relu.0.forward"
    assert sum(calls["counts"].values()) == c1["summary"]["rows"]

    # Opted out at creation: completes without a comparison; the baseline itself is never compared to itself.
    quiet = upload_run(api, bad, project=project, name="quiet", auto_compare=False)
    time.sleep(0.5)
    assert api.get("/comparisons", params={"run": quiet["id"]}).json()["count"] == 0
    assert api.get("/comparisons", params={"run": base["id"]}).json()["count"] == 2
