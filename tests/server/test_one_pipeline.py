"""One pipeline for a whole comparison: the server plans ranks with the CLI's planner and stores and serves
the summary ``merge_summary`` writes, so ``parity compare`` on two step directories and the server on the same
two runs give the same summary, field by field, the ranks found on one side only included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from parity.shared.compare.job import run_compare
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.spec import CompareSpec

from tests.server.conftest import ServerProcess, build_dump, upload_run, wait_comparison


def _same(cli: Any, server: Any, where: str) -> None:
    """Equal field by field, naming the first field that differs."""
    if isinstance(cli, dict) and isinstance(server, dict):
        assert sorted(cli) == sorted(server), f"{where}: keys {sorted(cli)} != {sorted(server)}"
        for key in cli:
            _same(cli[key], server[key], f"{where}.{key}")
    elif isinstance(cli, list) and isinstance(server, list):
        assert len(cli) == len(server), f"{where}: {len(cli)} items != {len(server)}"
        for i, (a, b) in enumerate(zip(cli, server, strict=True)):
            _same(a, b, f"{where}[{i}]")
    else:
        assert cli == server, f"{where}: {cli!r} != {server!r}"


def test_cli_and_server_summaries_of_one_pair_are_equal(server: ServerProcess, api: httpx.Client,
                                                        tmp_path: Path) -> None:  # fmt: skip
    # rank 2 is in the target run only, rank 3 in the bench run only
    npu = build_dump(tmp_path / "npu", perturb=0.5, ranks=(0, 1, 2))
    bench = build_dump(tmp_path / "gpu", ranks=(0, 1, 3))
    target, bench_run = upload_run(api, npu), upload_run(api, bench, device="gpu")
    queued = api.post("/comparisons", json={"target_run": target["id"], "bench_run": bench_run["id"]})
    assert queued.status_code == 202, queued.text
    assert [t["rank"] for t in queued.json()["tasks"]] == [0, 1]  # the one-side ranks get no task
    done = wait_comparison(api, queued.json()["id"])
    assert done["status"] == "succeeded", done
    text = api.get(f"/comparisons/{done['id']}/summary.json").text
    assert str(server.data_dir) not in text  # no worker's staging folder in what the server serves
    served = json.loads(text)

    outputs = run_compare(CompareSpec(npu / "step0", bench / "step0", is_print_compare_log=False),
                          tmp_path / "out", CompareOptions(), timestamp="20261204000000")  # fmt: skip
    assert outputs.summary is not None
    cli_text = outputs.summary.read_text()
    # the sides are named by their paths in the CLI, by run and step on the server; the rest is equal
    sides = ((npu / "step0", f"target run {target['id']}: step0"),
             (bench / "step0", f"bench run {bench_run['id']}: step0"))
    for path, name in sides:
        cli_text = cli_text.replace(str(path), name)
    cli = json.loads(cli_text)
    assert cli.pop("timestamp") == "20261204000000"
    # files: msprobe's names with the CLI's timestamp, the server's stored names (same kinds on both)
    for doc in (cli, served):
        for rank in doc["ranks"]:
            rank["files"] = sorted(k for k, v in rank["files"].items() if v)
    _same(cli, served, "summary")
    assert served["npu_only_ranks"] == [2] and served["bench_only_ranks"] == [3]
    assert served["compared_ranks"] == [0, 1] and served["top_suspects"]
    assert served["ranks"][1]["npu_path"] == f"target run {target['id']}: step0/rank1/dump.json"
    # the REST body's summary is the same document's headline
    summary = done["summary"]
    assert summary["ranks"] == served["compared_ranks"] and summary["rows"] == served["rows"]
    assert summary["npu_only_ranks"] == [2] and summary["bench_only_ranks"] == [3]
    assert [s["api"] for s in summary["top_suspects"]] == [s["api"] for s in served["top_suspects"]]
