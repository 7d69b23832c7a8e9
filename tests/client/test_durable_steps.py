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


def test_a_step_cut_short_by_an_exception_is_written_and_marked_incomplete(tmp_path: Path) -> None:
    """Issue 36: an exception between forward and backward left a step of forward entries only, uploaded as
    a normal step. It is written at exit as it is (nothing recorded is lost) and marked incomplete; the
    whole step before it is not."""
    script = textwrap.dedent(f"""
        import torch
        from torch import nn
        from parity.client import PrecisionDebugger
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        PrecisionDebugger(dump_path={str(tmp_path)!r}, task="statistics", level="L1")
        for step in range(2):
            PrecisionDebugger.start()
            loss = model(torch.randn(4, 8)).pow(2).mean()
            if step == 1:
                raise RuntimeError("CUDA out of memory (simulated)")
            loss.backward()
            PrecisionDebugger.stop()
            PrecisionDebugger.step()
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=120, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 1 and "CUDA out of memory (simulated)" in done.stderr
    assert "parity: step 1 rank 0 is incomplete, raised RuntimeError: CUDA out of memory" in done.stderr
    whole, cut = tmp_path / "step0" / "rank0", tmp_path / "step1" / "rank0"
    from parity.shared.incomplete import INCOMPLETE_FILE, incomplete_reason

    assert incomplete_reason(whole) is None and not (whole / INCOMPLETE_FILE).exists()
    reason = incomplete_reason(cut)
    assert reason == "the process raised RuntimeError: CUDA out of memory (simulated) before step()"
    data = json.loads((cut / "dump.json").read_text())["data"]
    assert "Functional.linear.0.forward" in data and not [k for k in data if k.endswith(".backward")]


def test_a_killed_step_is_reported_at_upload(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A SIGKILL mid-step leaves its tensor files and no dump.json: ``parity upload`` says so, naming it."""
    script = textwrap.dedent(f"""
        import os, signal, torch
        from parity.client import PrecisionDebugger
        PrecisionDebugger(dump_path={str(tmp_path)!r}, task="tensor", level="L1")
        for step in range(2):
            PrecisionDebugger.start()
            torch.exp(torch.ones(64))
            if step == 1:
                PrecisionDebugger.drain()  # its tensor files are on disk
                os.kill(os.getpid(), signal.SIGKILL)
            PrecisionDebugger.stop()
            PrecisionDebugger.step()
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=120, check=False)
    assert done.returncode == -9
    from parity.client.upload import collect_files

    killed = tmp_path / "step1" / "rank0"
    assert not (killed / "dump.json").exists() and list(killed.rglob("*.pt"))
    with caplog.at_level("WARNING"):
        collect_files(tmp_path)
    (message,) = [r.getMessage() for r in caplog.records if "no dump.json" in r.getMessage()]
    assert message.startswith(f"{killed}: step 1 rank 0: ") and "the process died or was killed" in message
