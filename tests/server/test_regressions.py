"""The nightly loop over REST (issue 25): regressions judged new, worse, known or fixed with the error
before and after, runs addressed by name on every route (PATCH and DELETE too), acceptances given and
revoked with 404/422 for unknown projects and APIs, an API's history per step and mode, auto-compare of a
tensor run against a statistics baseline, and summaries that name what was saved and no server path."""

from __future__ import annotations

import re
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from parity.server.models import ApiAcceptance
from parity.server.services.baselines import task_mismatch
from parity.shared.report.regressions import WORSE_FACTOR, judge

from tests.server.conftest import ServerProcess, upload_run, wait_comparison
from tests.server.nightly import CALLS, GELU, mlp_dump
from tests.server.test_baselines import against_baseline


def regressions(api: httpx.Client, comparison_id: str) -> dict[str, Any]:
    resp = api.get(f"/comparisons/{comparison_id}/regressions")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def test_a_regression_behind_a_known_failure_is_worse_and_listed_first(
    api: httpx.Client, tmp_path: Path
) -> None:
    project = f"mlp-{uuid.uuid4().hex[:8]}"
    upload_run(api, mlp_dump(tmp_path / "base"), project=project, name="cpu-fp32")
    assert api.patch("/runs/cpu-fp32", params={}, json={"baseline": True}).status_code in (200, 409)
    # The name is unique in its project, not on the server: address it through the project's listing too.
    base = api.get("/runs", params={"project": project, "name": "cpu-fp32"}).json()["data"][0]
    resp = api.patch(f"/runs/{base['id']}", json={"baseline": True})
    assert resp.status_code == 200 and resp.json()["baseline"] is True

    nightly = mlp_dump(tmp_path / "nightly", bf16=True)
    c1 = against_baseline(api, upload_run(api, nightly, project=project, name="nightly-1")["id"])
    r1 = regressions(api, c1["id"])
    assert r1["previous_comparison"] is None and r1["worse_factor"] == WORSE_FACTOR
    assert {v["verdict"] for v in r1["data"]} == {"new"} and r1["new"] == len(CALLS)

    c2 = against_baseline(api, upload_run(api, nightly, project=project, name="nightly-2")["id"])
    r2 = regressions(api, c2["id"])
    assert r2["previous_comparison"] == c1["id"]
    assert (r2["new"], r2["worse"], r2["known"], r2["fixed"]) == (0, 0, len(CALLS), 0)
    drift = {v["api"]: v["after"] for v in r2["data"]}
    assert all(0 < e < 0.01 for e in drift.values()), drift  # bfloat16's rounding: a few 0.1% at most

    worse_dump = mlp_dump(tmp_path / "worse", bf16=True, gelu_off=0.05)
    c3 = against_baseline(api, upload_run(api, worse_dump, project=project, name="nightly-3")["id"])
    r3 = regressions(api, c3["id"])
    first = r3["data"][0]
    # The GELU that got worse comes first, with its error before and after; the linear after it, which
    # carries the error on, follows; the calls before it are known.
    assert (first["api"], first["verdict"]) == (GELU, "worse"), r3["data"]
    assert first["before"] == drift[GELU] and first["after"] > 0.04
    assert first["growth"] == first["after"] / first["before"] > WORSE_FACTOR
    assert re.search(r"error [0-9.e-]+, [0-9.]+x the [0-9.e-]+ of the previous comparison", first["reason"])
    assert all(len(n.strip("0.").replace(".", "")) <= 3 for n in re.findall(r"\d[\d.]*", first["reason"])
               if "." in n), first["reason"]  # fmt: skip
    assert [v["verdict"] for v in r3["data"]][:2] == ["worse", "worse"]
    assert r3["data"][1]["api"] == "Functional.linear.2.forward"
    assert {v["api"] for v in r3["data"] if v["verdict"] == "known"} == set(CALLS[:3])

    # Back to float32: everything failing before passes now, and is listed as fixed.
    fixed = upload_run(api, mlp_dump(tmp_path / "fixed"), project=project, name="n4")
    c4 = against_baseline(api, fixed["id"])
    r4 = regressions(api, c4["id"])
    assert r4["fixed"] == len(CALLS) and {v["verdict"] for v in r4["data"]} == {"fixed"}
    assert all(v["after"] == 0 and v["before"] > 0 for v in r4["data"]), r4["data"]

    # The summary names its suspects' place ``position`` and its files by the names they are served under,
    # and no worker's folder.
    summary = api.get(f"/comparisons/{c3['id']}/summary.json")
    assert summary.status_code == 200
    text = summary.text
    doc = summary.json()
    rank = doc["ranks"][0]
    assert rank["files"] == {"xlsx": f"report_{c3['id'][:8]}_rank0.xlsx",
                             "advisor": f"advisor_{c3['id'][:8]}_rank0.txt"}  # fmt: skip
    name = api.get(f"/comparisons/{c3['id']}/report.xlsx").headers["content-disposition"]
    assert rank["files"]["xlsx"] in name
    assert rank["npu_path"] == f"target run {c3['target_run']}: step0/rank0/dump.json"
    assert "/tmp" not in text and ".tmp" not in text and str(tmp_path) not in text
    assert all("position" in s and "rank" not in s for s in rank["suspects"])
    assert all("position" in s for s in c3["summary"]["top_suspects"])


def test_judged_against_the_level_accepted() -> None:
    note = ApiAcceptance(project="p", api="a", note="bf16", accepted_by="me", level=0.001,
                         created_at=datetime.now(timezone.utc))  # fmt: skip
    # Never failing before, but accepted at 0.001: 0.05 is worse, 0.002 known.
    worse = judge("a", 0.05, None, False, note)
    assert (worse.verdict, worse.growth, worse.accepted_level) == ("worse", 50.0, 0.001)
    assert "the level accepted" in worse.reason
    assert judge("a", 0.002, None, False, note).verdict == "known"
    # Accepted at the level it grew to: known, however far it grew from the comparison before.
    note.level = 0.05
    assert judge("a", 0.05, 0.001, True, note).verdict == "known"
    note.level = None  # accepted before levels were recorded: judged against the comparison before
    assert judge("a", 0.05, 0.001, True, note).verdict == "worse"
    assert judge("a", 0.002, 0.0001, False, None).verdict == "new"
    assert judge("a", 0.0, 0.01, True, None, failing_now=False).verdict == "fixed"


def test_labels_follow_the_error_not_a_status_flip() -> None:
    # Passing msprobe's thresholds now, but its error grew 3.57x: worse, never fixed.
    grew = judge("a", 0.0357, 0.01, True, None, failing_now=False)
    assert (grew.verdict, grew.failing) == ("worse", False)
    assert "passing msprobe's thresholds now" in grew.reason
    # Passing now by a hair, its error about what it was: known, not fixed.
    hair = judge("a", 0.009, 0.01, True, None, failing_now=False)
    assert hair.verdict == "known" and "not judged fixed" in hair.reason
    # Fixed once the error dropped below the error before (or the level accepted) by the factor.
    assert judge("a", 0.01 / WORSE_FACTOR, 0.01, True, None, failing_now=False).verdict == "fixed"
    note = ApiAcceptance(project="p", api="a", note="bf16", accepted_by="me", level=0.02,
                         created_at=datetime.now(timezone.utc))  # fmt: skip
    assert judge("a", 0.01, 0.01, True, note, failing_now=False).verdict == "known"
    assert judge("a", 0.005, 0.01, True, note, failing_now=False).verdict == "fixed"
    # No error to judge by: known, whatever the status says.
    assert judge("a", None, 0.01, True, None, failing_now=False).verdict == "known"


def test_every_run_route_takes_a_name(api: httpx.Client, tmp_path: Path) -> None:
    project = f"p-{uuid.uuid4().hex[:8]}"
    name = f"nightly 4 (x) 50% {uuid.uuid4().hex[:4]}"
    run = upload_run(api, mlp_dump(tmp_path / "d"), project=project, name=name)
    path = f"/runs/{quote(name, safe='')}"
    assert api.get(path).json()["id"] == run["id"]
    assert api.get(f"{path}/files").json()["count"] == 1
    resp = api.patch(path, json={"baseline": True, "tags": {"night": "4"}})
    assert resp.status_code == 200 and resp.json()["baseline"] is True, resp.text
    assert api.get(f"/runs/{run['id']}").json()["tags"] == {"night": "4"}
    assert api.patch("/runs/no such run", json={"baseline": True}).status_code == 404
    assert api.delete(path).status_code == 204
    assert api.get(f"/runs/{run['id']}").status_code == 404


def test_acceptances_are_revocable_and_checked(api: httpx.Client, tmp_path: Path) -> None:
    project = f"p-{uuid.uuid4().hex[:8]}"
    base = upload_run(api, mlp_dump(tmp_path / "base"), project=project, name="base")
    api.patch(f"/runs/{base['id']}", json={"baseline": True})
    c1 = against_baseline(api, upload_run(api, mlp_dump(tmp_path / "n", bf16=True), project=project)["id"])

    body = {"api": GELU, "note": "bf16 rounding"}
    assert api.post("/projects/nosuchproj/acceptances", json=body).status_code == 404
    assert api.get("/projects/nosuchproj/acceptances").status_code == 404
    assert api.delete(f"/projects/nosuchproj/acceptances/{GELU}").status_code == 404
    never = api.post(f"/projects/{project}/acceptances", json={"api": "Torch.nothing.0.forward", "note": "x"})
    assert never.status_code == 422 and "Torch.nothing.0.forward" in never.json()["detail"]

    accepted = api.post(f"/projects/{project}/acceptances", json=body)
    assert accepted.status_code == 201, accepted.text
    gelu = next(v for v in regressions(api, c1["id"])["data"] if v["api"] == GELU)
    assert gelu["verdict"] == "known" and gelu["accepted_level"] == accepted.json()["level"] == gelu["after"]

    assert api.delete(f"/projects/{project}/acceptances/{GELU}").status_code == 204
    assert api.get(f"/projects/{project}/acceptances").json()["count"] == 0
    gelu = next(v for v in regressions(api, c1["id"])["data"] if v["api"] == GELU)
    assert (gelu["verdict"], gelu["note"]) == ("new", None)
    again = api.delete(f"/projects/{project}/acceptances/{GELU}")
    assert again.status_code == 404 and "not accepted" in again.json()["detail"]


def test_history_has_one_series_per_step_and_mode(api: httpx.Client, tmp_path: Path) -> None:
    project = f"p-{uuid.uuid4().hex[:8]}"
    runs = {}
    for name, task, bf16 in (("stats-base", "statistics", False), ("stats-bf16", "statistics", True),
                             ("tensor-base", "tensor", False), ("tensor-bf16", "tensor", True)):  # fmt: skip
        dump = mlp_dump(tmp_path / name, bf16=bf16, task=task, steps=(0, 2) if task == "statistics" else (0,))
        runs[name] = upload_run(api, dump, project=project, name=name, auto_compare=False)
    for target, bench, step in (("stats-bf16", "stats-base", 0), ("stats-bf16", "stats-base", 2),
                                ("tensor-bf16", "tensor-base", 0)):  # fmt: skip
        body = {"target_run": runs[target]["id"], "bench_run": runs[bench]["id"], "step": step}
        resp = api.post("/comparisons", json=body)
        assert wait_comparison(api, resp.json()["id"])["status"] == "succeeded"

    url = f"/projects/{project}/api-history"
    every = api.get(url, params={"api": GELU}).json()
    assert every["series"] == ["step 0, statistics", "step 2, statistics", "step 0, tensor"]
    assert (every["steps"], every["modes"]) == ([0, 2], ["statistics", "tensor"])
    assert [(p["step"], p["mode"]) for p in every["data"]] == [(0, "statistics"), (2, "statistics"),
                                                               (0, "tensor")]  # fmt: skip
    one = api.get(url, params={"api": GELU, "step": 0, "mode": "statistics"}).json()
    assert [(p["step"], p["mode"]) for p in one["data"]] == [(0, "statistics")]
    assert api.get("/projects/nosuchproj/api-history", params={"api": GELU}).status_code == 404
    assert api.get(url, params={"api": "Torch.nothing.0.forward"}).status_code == 422


def test_a_tensor_run_is_compared_with_a_statistics_baseline_in_statistics_mode(
    api: httpx.Client, server: ServerProcess, tmp_path: Path
) -> None:
    project = f"p-{uuid.uuid4().hex[:8]}"
    base = upload_run(api, mlp_dump(tmp_path / "base"), project=project, name="base")
    api.patch(f"/runs/{base['id']}", json={"baseline": True})
    tensor = upload_run(api, mlp_dump(tmp_path / "t", bf16=True, task="tensor"), project=project, name="t")
    c = against_baseline(api, tensor["id"])
    assert c["status"] == "succeeded" and c["summary"]["mode"] == "statistics", c
    assert GELU in c["summary"]["failing_apis"]
    assert api.get(f"/runs/{tensor['id']}").json()["auto_compare_note"] is None
    assert base["dump_task"] == "statistics"
    assert api.get(f"/runs/{tensor['id']}").json()["dump_task"] == "tensor"

    # Statistics with md5 checksums against statistics without: skipped up front, not failed in a worker.
    md5 = upload_run(api, mlp_dump(tmp_path / "m", md5=True), project=project, name="md5")
    note = wait_note(api, md5["id"])
    assert md5["dump_task"] == "md5"
    assert note == ("not compared with baseline base: its dump is statistics with md5 checksums "
                    "(summary_mode md5), the baseline's statistics without md5 checksums: dump both with the "
                    "same summary_mode")  # fmt: skip
    assert api.get("/comparisons", params={"run": md5["id"]}).json()["count"] == 0
    page = httpx.get(f"{server.url}/runs/{md5['id']}").text
    assert 'id="baseline-unfit"' in page and "same summary_mode" in page  # the form is not prefilled either
    assert '<dd id="dump-task">md5</dd>' in page

    # A run that shares no step with the baseline: no comparison, and the run says why.
    other = upload_run(api, mlp_dump(tmp_path / "s5", steps=(5,)), project=project, name="step5")
    note = wait_note(api, other["id"])
    assert note is not None and "not compared with baseline base" in note and "no step in both" in note
    assert api.get("/comparisons", params={"run": other["id"]}).json()["count"] == 0
    page = httpx.get(f"{server.url}/runs/{other['id']}")
    assert "no step in both" in page.text and 'id="baseline-unfit"' in page.text
    assert f'value="{base["id"]}"' not in page.text  # the compare form is not prefilled with it


def wait_note(api: httpx.Client, run_id: str) -> str | None:
    """The run's ``auto_compare_note`` once set (completing a run sets it just after), or None after 30 s."""
    deadline = time.monotonic() + 30
    note = None
    while note is None and time.monotonic() < deadline:
        note = api.get(f"/runs/{run_id}").json()["auto_compare_note"]
        time.sleep(0.1)
    return note


def test_auto_compare_skips_only_the_tasks_the_engine_refuses() -> None:
    comparable = (("tensor", "statistics"), ("md5", "tensor"), ("md5", "md5"), (None, "md5"),
                  ("mixed", "statistics"))  # fmt: skip
    assert [task_mismatch(t, b) for t, b in comparable] == [None] * 5
    assert "same summary_mode" in (task_mismatch("statistics", "md5") or "")
    assert task_mismatch("overflow_check", "statistics") == (
        "its dump is task overflow_check, the baseline's statistics without md5 checksums: dumps of these "
        "tasks cannot be compared")  # fmt: skip
    assert "cannot be compared" in (task_mismatch("overflow_check", "overflow_check") or "")


def test_a_legacy_name_holding_a_slash_is_addressed_escaped(tmp_path: Path) -> None:
    """Names are checked at creation now; a run stored before under ``nightly 4 / x`` is still read,
    patched and deleted by its name, escaped (``%2F``), on the routes that take a run."""
    from fastapi.testclient import TestClient
    from parity.server.main import create_app
    from parity.server.models import Run
    from parity.server.settings import Settings

    with TestClient(create_app(Settings(data_dir=tmp_path / "data", workers=0))) as client:
        with client.app.state.run_service.db.write() as session:  # type: ignore[attr-defined]
            session.add(Run(id=uuid.uuid4().hex, name="nightly 4 / x", project="p", device="cpu", tags={},
                            meta={}, status="complete"))  # fmt: skip
        path = "/api/v1/runs/" + quote("nightly 4 / x", safe="")
        assert client.get(path).json()["name"] == "nightly 4 / x"
        assert client.patch(path, json={"baseline": True}).json()["baseline"] is True
        assert client.get(f"/runs/{quote('nightly 4 / x', safe='')}").status_code == 200  # its page
        assert client.delete(path).status_code == 204
        assert client.get(path).status_code == 404
