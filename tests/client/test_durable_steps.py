"""``async_dump`` false (the default, as msprobe): ``step()`` returns once the step is on disk, whole."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _leaves(value: object) -> list[dict[str, object]]:
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    if isinstance(value, dict):
        if "data_name" in value:
            return [value]
        return [leaf for v in value.values() for leaf in _leaves(v)]
    return []


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_process_that_exits_right_after_step_leaves_a_complete_step(tmp_path: Path, task: str) -> None:
    # os._exit skips atexit and every thread: only what step() itself waited for is there
    script = textwrap.dedent(f"""
        import os, torch
        from torch import nn
        from parity.client import PrecisionDebugger
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        PrecisionDebugger(dump_path={str(tmp_path)!r}, task={task!r}, level="mix")
        PrecisionDebugger.start(model)
        model(torch.randn(4, 8)).pow(2).mean().backward()
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=REPO, timeout=120)
    rank_dir = tmp_path / "step0" / "rank0"
    names = sorted(p.name for p in rank_dir.iterdir())
    assert names == sorted(["dump.json", "stack.json", "construct.json"]
                           + (["dump_tensor_data"] if task == "tensor" else []))  # fmt: skip
    doc = json.loads((rank_dir / "dump.json").read_text())
    data = doc["data"]
    assert "Module.0.Linear.backward.0" in data and "Functional.linear.0.backward" in data
    assert json.loads((rank_dir / "construct.json").read_text())
    assert json.loads((rank_dir / "stack.json").read_text())
    if task == "tensor":
        leaves = _leaves(data)
        files = sorted(p.name for p in (rank_dir / "dump_tensor_data").iterdir())
        assert files == sorted({str(leaf["data_name"]) for leaf in leaves})  # no temporary file left
        for leaf in leaves:
            t = torch.load(rank_dir / "dump_tensor_data" / str(leaf["data_name"]), weights_only=True)
            assert list(t.shape) == leaf["shape"]
