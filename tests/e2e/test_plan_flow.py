"""Statistics first, then only the suspects in tensor mode, against a real ``parity server``: a statistics
run pair with a faulty gelu in the target, their comparison, ``parity plan``, a tensor re-dump of both sides
with the plan (one from the written config.json, one fetching the plan itself), and the tensor comparison
whose top suspect and float64 replay confirm the fault."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from parity.client.rest import ParityClient
from parity.shared.contract import RunPublic

from parity.cli import main
from parity.demo import ServerProcess
from tests.replay_dumps import GELU, dump_model, wrong_forward_gelu

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
PROJECT = "plan-e2e"


def _complete(api: ParityClient, name: str, timeout: float = 60.0) -> RunPublic:
    """Run ``name`` once its uploader marked it complete and the server validated it."""
    deadline = time.monotonic() + timeout
    while True:
        runs = api.find_runs(name=name, project=PROJECT)
        if runs and runs[0].status in ("complete", "invalid"):
            assert runs[0].status == "complete", runs[0].error
            return runs[0]
        assert time.monotonic() < deadline, f"run {name} not complete after {timeout:g} s"
        time.sleep(0.2)


def _compare(api: ParityClient, target: RunPublic, bench: RunPublic) -> str:
    info = api.wait_for_comparison(api.create_comparison(target.id, bench.id).id, timeout=120)
    assert info.status == "succeeded", info.error
    return info.id


def test_statistics_then_suspects_in_tensor_mode(
    server: ServerProcess, api: ParityClient, tmp_path: Path, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    upload = {"server": server.url, "project": PROJECT}
    names = {k: f"{k}-{unique}" for k in ("stats-gpu", "stats-npu", "plan-gpu", "plan-npu")}
    # 1. the statistics run pair and its comparison
    dump_model(tmp_path / "stats-gpu", task="statistics", level="L1", run_name=names["stats-gpu"], **upload)
    stats_npu = dump_model(tmp_path / "stats-npu", gelu=wrong_forward_gelu(), task="statistics", level="L1",
                           run_name=names["stats-npu"], **upload)  # fmt: skip
    stats_id = _compare(api, _complete(api, names["stats-npu"]), _complete(api, names["stats-gpu"]))
    assert api.get_comparison(stats_id).summary.mode == "statistics"  # type: ignore[union-attr]

    # 2. the plan, by the server
    config = tmp_path / "plan.json"
    assert main(["plan", stats_id, "-o", str(config), "--server", server.url]) == 0
    plan = json.loads(config.read_text())
    assert plan["task"] == "tensor" and plan["step"] == [0] and plan["rank"] == [] and plan["level"] == "L1"
    assert plan["planned_by"] == stats_id and plan["tensor"]["parity_statistics_for_all"] is True
    listed = plan["tensor"]["list"]
    assert listed[:2] == [GELU, "Functional.gelu.0.backward"]
    assert "Functional.layer_norm.0.forward" in listed  # gelu's producer: a neighbour
    assert f"wrote {config}" in capsys.readouterr().out

    # 3. the tensor re-dump of both sides: the bench from the written file, the target fetching the plan
    plan_gpu = dump_model(tmp_path / "plan-gpu", config_path=str(config), run_name=names["plan-gpu"],
                          **upload)  # fmt: skip
    user_config = tmp_path / "user.json"
    user_config.write_text(json.dumps({"task": "statistics", "level": "L1", "dump_path": "./elsewhere"}))
    plan_npu = dump_model(tmp_path / "plan-npu", gelu=wrong_forward_gelu(), config_path=str(user_config),
                          plan=stats_id, run_name=names["plan-npu"], **upload)  # fmt: skip
    for dump_json in (plan_gpu, plan_npu):
        doc = json.loads(dump_json.read_text())
        assert doc["task"] == "tensor"
        # every call keeps its statistics entry, named as in the statistics run; files for listed calls only
        assert list(doc["data"]) == list(json.loads(stats_npu.read_text())["data"])
        files = {p.name for p in (dump_json.parent / "dump_tensor_data").iterdir()}
        assert files and all(any(f.startswith(f"{e}.") for e in listed) for f in files)
        assert any(f.startswith(f"{GELU}.") for f in files)
    target, bench = _complete(api, names["plan-npu"]), _complete(api, names["plan-gpu"])
    assert target.planned_by == bench.planned_by == stats_id

    # 4. the tensor comparison: the top suspect is the faulty gelu, and the replay blames the target
    tensor_id = _compare(api, target, bench)
    summary = api.get_comparison(tensor_id).summary
    assert summary is not None and summary.mode == "tensor"
    assert summary.top_suspects[0].api == GELU
    assert {v.entry: v.verdict for v in summary.replay}[GELU] == "target"
    # a call without tensor files is judged from its statistics, not reported missing
    rows = api.comparison_rows(tensor_id, name="Functional.linear.0.forward.output.0").data
    assert rows and rows[0].status == "pass"
    assert any("Statistics only" in str(cell) for cell in rows[0].cells)

    # 5. the pages show the chain: statistics runs -> comparison -> tensor re-dump -> tensor comparison
    page = httpx.get(f"{server.url}/comparisons/{tensor_id}", timeout=30).text
    chain = page[page.index('id="plan-chain"'):]
    for text in (names["stats-npu"], names["stats-gpu"], stats_id[:8], names["plan-npu"], names["plan-gpu"],
                 tensor_id[:8], "float64 replay: target"):  # fmt: skip
        assert text in chain, text
    run_page = httpx.get(f"{server.url}/runs/{target.id}", timeout=30).text
    assert 'id="planned-by"' in run_page and stats_id[:8] in run_page


def test_plan_of_an_unknown_comparison_is_one_error(server: ServerProcess, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = tmp_path / "plan.json"
    assert main(["plan", "0123456789abcdef", "-o", str(out), "--server", server.url]) == 2
    err = capsys.readouterr().err
    assert "0123456789abcdef" in err and "not found" in err and err.count("\n") == 1
    assert not out.exists()


