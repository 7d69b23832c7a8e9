"""Comparisons: a real compare job in the worker pool, its rows, reports, failures and a server SIGKILL."""

from __future__ import annotations

import io
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from parity.shared.compare.headers import CompareMode, full_header
from sqlalchemy import create_engine, text

from tests.server.conftest import (
    ServerProcess,
    build_dump,
    fresh_postgres_database,
    new_run,
    postgres_url_or_skip,
    upload_run,
    wait_comparison,
)


def two_runs(api: httpx.Client, tmp_path: Path, ranks: tuple[int, ...] = (0,)) -> tuple[dict[str, Any], ...]:
    project = f"p-{uuid.uuid4().hex[:8]}"
    target = upload_run(api, build_dump(tmp_path / "npu", perturb=0.5, ranks=ranks), project=project)
    bench = upload_run(api, build_dump(tmp_path / "gpu", ranks=ranks), project=project, device="gpu")
    return target, bench


def all_rows(api: httpx.Client, cid: str, **params: Any) -> dict[str, Any]:
    resp = api.get(f"/comparisons/{cid}/rows", params={"limit": 10000, **params})
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def test_comparison_of_two_runs(api: httpx.Client, tmp_path: Path) -> None:
    target, bench = two_runs(api, tmp_path, ranks=(0, 1))
    resp = api.post("/comparisons", json={"target_run": target["id"], "bench_run": bench["id"]})
    assert resp.status_code == 202, resp.text
    queued = resp.json()
    assert queued["status"] in ("queued", "running") and queued["step"] == 0 and queued["ranks"] is None
    assert queued["options"] == {"fuzzy_match": False, "stack_mode": False}
    done = wait_comparison(api, queued["id"])
    assert done["status"] == "succeeded", done["error"]
    assert done["progress"] == 1.0 and done["finished_at"] is not None
    summary = done["summary"]
    assert summary["ranks"] == [0, 1] and summary["mode"] == "tensor"
    assert summary["failing_rows"] > 0 and "Torch.relu.0.forward" in summary["failing_apis"]
    assert "Functional.linear.0.forward" not in summary["failing_apis"]
    top = summary["top_suspects"][0]
    assert top["api"].startswith("Torch.relu.0") and top["position"] == 1 and top["compare_rank"] in (0, 1)
    # Localization (issue 10): scores, the Excel row, the first divergence; rows sortable by score.
    assert top["score"] > 1 and top["excel_row"] == top["row_index"] + 2
    scores = [t["score"] for t in summary["top_suspects"]]
    assert scores == sorted(scores, reverse=True)
    assert summary["first_divergence"]["api"] == "Torch.relu.0.forward"
    by_score = all_rows(api, queued["id"], sort="score")
    assert by_score["data"][0]["api"] == "Torch.relu.0.forward" and by_score["data"][0]["score"] > 1
    row_scores = [r["score"] for r in by_score["data"] if r["score"] is not None]
    assert row_scores == sorted(row_scores, reverse=True)
    assert sorted((r["rank"], r["index"]) for r in by_score["data"]) == [
        (r["rank"], r["index"]) for r in all_rows(api, queued["id"])["data"]
    ]
    assert api.get(f"/comparisons/{queued['id']}/rows", params={"sort": "nope"}).status_code == 422

    rows = all_rows(api, done["id"])
    assert rows["header"] == full_header(CompareMode.TENSOR, stack=False)
    assert rows["count"] == summary["rows"] == len(rows["data"])
    assert {r["rank"] for r in rows["data"]} == {0, 1}
    assert all(len(r["cells"]) == len(rows["header"]) for r in rows["data"])
    failing = all_rows(api, done["id"], failing="true")
    assert failing["count"] == summary["failing_rows"]
    assert all(r["status"] in ("fail", "unmatched") for r in failing["data"])
    rank1 = all_rows(api, done["id"], rank=1)
    assert rank1["count"] == sum(1 for r in rows["data"] if r["rank"] == 1)
    assert [r["index"] for r in rank1["data"]] == list(range(rank1["count"]))
    relu = all_rows(api, done["id"], name="relu")
    assert relu["count"] > 0 and all("relu" in r["cells"][0] for r in relu["data"])
    assert all_rows(api, done["id"], name="relu") == relu  # the second read is served from the cached count
    page = api.get(f"/comparisons/{done['id']}/rows", params={"limit": 2, "offset": 1}).json()
    assert page["count"] == rows["count"] and page["data"] == rows["data"][1:3]
    n0 = rows["count"] - rank1["count"]  # an unfiltered page across the rank boundary
    across = api.get(f"/comparisons/{done['id']}/rows", params={"limit": 3, "offset": n0 - 1}).json()
    assert across["data"] == rows["data"][n0 - 1 : n0 + 2]
    past = api.get(f"/comparisons/{done['id']}/rows", params={"offset": rows["count"]}).json()
    assert past["data"] == [] and past["count"] == rows["count"]
    failing_page = api.get(f"/comparisons/{done['id']}/rows", params={"failing": "true", "offset": 1}).json()
    assert failing_page["data"] == failing["data"][1:101]
    assert api.get(f"/comparisons/{done['id']}/rows", params={"rank": 7}).status_code == 400

    # Reports: rank is required with two ranks, and the xlsx is the same table.
    missing_rank = api.get(f"/comparisons/{done['id']}/report.xlsx")
    assert missing_rank.status_code == 400 and "[0, 1]" in missing_rank.json()["detail"]
    xlsx = api.get(f"/comparisons/{done['id']}/report.xlsx", params={"rank": 1})
    assert xlsx.status_code == 200 and xlsx.content[:2] == b"PK"
    import openpyxl

    sheet = openpyxl.load_workbook(io.BytesIO(xlsx.content), read_only=True).worksheets[0]
    sheet_rows = list(sheet.iter_rows(values_only=True))
    assert list(sheet_rows[0]) == rows["header"] and len(sheet_rows) - 1 == rank1["count"]
    advisor = api.get(f"/comparisons/{done['id']}/advisor.txt", params={"rank": 1})
    assert advisor.status_code == 200 and "relu" in advisor.text

    listed = api.get("/comparisons", params={"run": bench["id"], "status": "succeeded"}).json()
    assert [c["id"] for c in listed["data"]] == [done["id"]] and listed["count"] == 1
    by_project = api.get("/comparisons", params={"project": target["project"]}).json()
    assert [c["id"] for c in by_project["data"]] == [done["id"]]

    # Deleting a run removes its comparisons too, when asked to.
    assert api.delete(f"/runs/{bench['id']}", params={"with_comparisons": "true"}).status_code == 204
    assert api.get(f"/comparisons/{done['id']}").status_code == 404


def test_comparison_requests_are_checked(api: httpx.Client, tmp_path: Path) -> None:
    target, bench = two_runs(api, tmp_path)
    unknown = api.post("/comparisons", json={"target_run": target["id"], "bench_run": uuid.uuid4().hex})
    assert unknown.status_code == 404 and "bench_run" in unknown.json()["detail"]
    open_run = new_run(api)
    not_complete = api.post("/comparisons", json={"target_run": open_run["id"], "bench_run": bench["id"]})
    assert not_complete.status_code == 409 and "not complete" in not_complete.json()["detail"]
    bad_step = api.post(
        "/comparisons", json={"target_run": target["id"], "bench_run": bench["id"], "step": 3}
    )
    assert bad_step.status_code == 422 and "step" in bad_step.json()["detail"]
    bad_rank = api.post(
        "/comparisons", json={"target_run": target["id"], "bench_run": bench["id"], "ranks": [5]}
    )
    assert bad_rank.status_code == 422 and "ranks" in bad_rank.json()["detail"]
    assert api.get(f"/comparisons/{uuid.uuid4().hex}").status_code == 404


def test_failing_job_records_its_error(api: httpx.Client, server: ServerProcess, tmp_path: Path) -> None:
    target, bench = two_runs(api, tmp_path)
    # The store loses the bench run's files behind the server's back: the job must fail, not the server.
    shutil.rmtree(server.data_dir / "blobs" / "runs" / bench["id"] / "blobs")
    cid = api.post("/comparisons", json={"target_run": target["id"], "bench_run": bench["id"]}).json()["id"]
    done = wait_comparison(api, cid)
    assert done["status"] == "failed" and done["summary"] is None
    assert bench["id"] in done["error"] and "missing from the store" in done["error"]
    assert api.get(f"/comparisons/{cid}/rows").status_code == 409
    assert api.get(f"/comparisons/{cid}/report.xlsx").status_code == 409
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    # The pool still runs the next job.
    target2, bench2 = two_runs(api, tmp_path / "again")
    ok = api.post("/comparisons", json={"target_run": target2["id"], "bench_run": bench2["id"]}).json()
    assert wait_comparison(api, ok["id"])["status"] == "succeeded"


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_sigkill_during_compare_then_restart(backend: str, tmp_path: Path) -> None:
    env = {"PARITY_WORKERS": "1"}
    if backend == "postgres":
        env["PARITY_DATABASE_URL"] = fresh_postgres_database(postgres_url_or_skip())
    data_dir = tmp_path / "data"
    srv = ServerProcess(data_dir, env).start()
    try:
        with srv.client() as api:
            target, bench = two_runs(api, tmp_path, ranks=(0, 1))
            body = {"target_run": target["id"], "bench_run": bench["id"]}
            reference = wait_comparison(api, api.post("/comparisons", json=body).json()["id"])
            assert reference["status"] == "succeeded", reference["error"]
            expected = all_rows(api, reference["id"])
            # The same pair with its ranks named: another request, so another job (the same one is not rerun).
            cid = api.post("/comparisons", json={**body, "ranks": [0, 1]}).json()["id"]
            deadline = time.monotonic() + 120
            while api.get(f"/comparisons/{cid}").json()["status"] == "queued":
                assert time.monotonic() < deadline, "the job never started"
                time.sleep(0.02)
            children = psutil.Process(srv.proc.pid).children(recursive=True)  # type: ignore[union-attr]
        srv.kill()
        gone, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, f"worker processes outlived the server: {alive}"
    finally:
        srv.stop()

    url = env.get("PARITY_DATABASE_URL") or f"sqlite:///{data_dir / 'parity.db'}"
    engine = create_engine(url)
    with engine.connect() as conn:
        status = conn.execute(text("SELECT status FROM comparisons WHERE id = :id"), {"id": cid}).scalar_one()
        held_at_kill = {rank for rank, task_status in conn.execute(
            text("SELECT rank, status FROM jobs WHERE kind = 'rank' AND subject = :id"), {"id": cid}
        ) if task_status == "running"}  # fmt: skip
    assert status == "running", "the compare finished before the kill; nothing was tested"

    restarted = ServerProcess(data_dir, env)
    restarted.port = srv.port  # its URL with it
    restarted.start()
    try:
        with restarted.client() as api:
            done = wait_comparison(api, cid)
            assert done["status"] == "succeeded", done["error"]
            assert done["summary"] == reference["summary"]
            assert all_rows(api, cid) == expected
            # The killed attempt's staging folder is swept at start; the new attempt removes its own.
            assert not list((data_dir / "blobs" / ".tmp").glob("*"))
    finally:
        restarted.stop()
    with engine.connect() as conn:
        attempts = conn.execute(
            text("SELECT rank, attempt FROM jobs WHERE kind = 'rank' AND subject = :id"), {"id": cid}
        ).all()
    engine.dispose()
    # One worker, two ranks: a rank held when the server died ran again (attempt 2); the other ran once. The
    # kill can also fall between the two ranks (one done, the next not claimed yet): then each ran once.
    assert len(held_at_kill) <= 1, held_at_kill
    assert sorted(attempts) == [(r, 2 if r in held_at_kill else 1) for r in (0, 1)], (attempts, held_at_kill)


def test_engine_refusal_names_runs_not_server_paths(api: httpx.Client, tmp_path: Path) -> None:
    import numpy as np

    from tests.factories import DumpBuilder

    roots = {"plain": tmp_path / "plain", "md5": tmp_path / "md5"}
    for kind, root in roots.items():  # checksums on one side only cannot be compared
        DumpBuilder("statistics", md5=kind == "md5").api(
            "Torch.relu.0.forward", inputs=[np.ones(3)], outputs=[np.ones(3)]
        ).write(root / "step0" / "rank0")
    target, bench = upload_run(api, roots["plain"]), upload_run(api, roots["md5"])
    cid = api.post("/comparisons", json={"target_run": target["id"], "bench_run": bench["id"]}).json()["id"]
    done = wait_comparison(api, cid)
    assert done["status"] == "failed"
    assert f"bench run {bench['id']}: step0/rank0/dump.json" in done["error"], done["error"]
    assert "md5 checksums" in done["error"] and str(tmp_path) not in done["error"]
    assert "/.tmp/" not in done["error"] and "job-" not in done["error"]
