"""``parity plan``'s config.json against msprobe 8.3.3 itself: msprobe runs it unchanged (task tensor, its
``list``, Parity's own field ignored) and dumps the listed calls in tensor mode; Parity's client runs the same
file and keeps every call's statistics, with tensor files for the listed calls only."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.interop.conftest import TIMEOUT, TRAIN

pytestmark = pytest.mark.slow


def _plan(tmp_path: Path, dump: Callable[..., Path]) -> dict[str, object]:
    """``parity plan`` of a compare summary naming two suspects of the model (its relu and its layer norm
    module), with their neighbours read from Parity's statistics dump of it."""
    statistics_dump = dump("parity", "statistics")
    summary = tmp_path / "compare_summary.json"
    summary.write_text(json.dumps({
        "format_version": 1, "kind": "single-rank", "rank": 0, "mode": "statistics",
        "npu_path": str(statistics_dump), "bench_path": str(statistics_dump),
        "suspects": [{"api": "Functional.relu.0.forward", "score": 2.0},
                     {"api": "Module.norm.LayerNorm.backward.0", "score": 1.0}],
        "first_divergence": None,
    }))  # fmt: skip
    config = tmp_path / "plan.json"
    cmd = [sys.executable, "-m", "parity", "plan", str(summary), "-o", str(config), "--neighbours", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    plan: dict[str, object] = json.loads(config.read_text())
    return plan


def _run(python: Path, plan: dict[str, object], out: Path) -> Path:
    """The model's step under ``python``'s tool with ``plan`` as config.json (only dump_path set)."""
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({**plan, "dump_path": str(out)}))
    done = subprocess.run([str(python), str(TRAIN), "msprobe" if "msprobe" in str(python) else "parity",
                           "config", str(out)], capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    (dump_json,) = out.glob("step0/rank*/dump.json")
    return dump_json


def test_msprobe_runs_the_plan_unchanged(msprobe_bin: Path, dump: Callable[..., Path],
                                         tmp_path: Path) -> None:  # fmt: skip
    plan = _plan(tmp_path, dump)
    section = plan["tensor"]
    assert plan["task"] == "tensor" and isinstance(section, dict) and section["parity_statistics_for_all"]
    listed: list[str] = section["list"]
    assert listed and plan["level"] == "mix" and plan["rank"] == [] and plan["step"] == [0]

    theirs = _run(msprobe_bin / "python", plan, tmp_path / "msprobe")
    doc = json.loads(theirs.read_text())
    assert doc["task"] == "tensor"
    # msprobe's meaning of ``list``: the listed entries only (and the parameter gradients of listed
    # modules), each with its tensor files
    grads = {f"{e.split('.forward.')[0]}.parameters_grad" for e in listed if e.startswith("Module.")}
    assert doc["data"] and set(doc["data"]) <= set(listed) | grads
    assert set(doc["data"]) & {"Functional.relu.0.forward", "Module.norm.LayerNorm.backward.0"}
    files = {p.name for p in (theirs.parent / "dump_tensor_data").iterdir()}
    assert files and all(any(f.startswith(f"{e}.") for e in (*listed, *grads)) for f in files)

    ours = _run(Path(sys.executable), plan, tmp_path / "parity")
    statistics_run = json.loads(dump("parity", "statistics").read_text())["data"]
    mine = json.loads(ours.read_text())["data"]
    assert list(mine) == list(statistics_run)  # Parity's own field: statistics for every call
    my_files = {p.name for p in (ours.parent / "dump_tensor_data").iterdir()}
    assert my_files and all(any(f.startswith(f"{e}.") for e in listed) for f in my_files)
    # the listed calls' files are the ones msprobe wrote for them, name for name
    assert {f for f in files if any(f.startswith(f"{e}.") for e in listed)} == my_files
