"""Step boundaries, late backward hooks, the exit flush and the uploader hand-off."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from parity.client import PrecisionDebugger

from tests.client.conftest import load_data, model_and_input, train_step


class FakeUploader:
    instances: list[FakeUploader] = []

    def __init__(self, server: str, **kwargs: Any) -> None:
        self.server, self.kwargs = server, kwargs
        self.submitted: list[tuple[int, int, Path, bool]] = []
        self.closed = False
        FakeUploader.instances.append(self)

    def submit_rank_dir(self, step: int, rank: int, rank_dir: Path) -> None:
        self.submitted.append((step, rank, rank_dir, (rank_dir / "dump.json").is_file()))

    def close(self, timeout: float | None = None) -> None:
        self.closed = True


@pytest.fixture
def fake_uploader(monkeypatch: pytest.MonkeyPatch) -> type[FakeUploader]:
    import parity.client.uploader as uploader

    FakeUploader.instances = []
    monkeypatch.setattr(uploader, "BackgroundUploader", FakeUploader)
    return FakeUploader


def test_each_flushed_step_is_handed_to_the_uploader(
    tmp_path: Path, fake_uploader: type[FakeUploader]
) -> None:
    PrecisionDebugger(dump_path=str(tmp_path), level="L1", server="http://parity:8000", run_name="r",
                      project="p", tags={"k": "v"}, token="t")  # fmt: skip
    model, x = model_and_input("mlp")
    for _ in range(2):
        PrecisionDebugger.start()
        train_step(model, x)
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
    PrecisionDebugger.reset()
    (up,) = fake_uploader.instances
    assert up.server == "http://parity:8000"
    assert {k: up.kwargs[k] for k in ("run_name", "project", "tags", "token")} == {
        "run_name": "r", "project": "p", "tags": {"k": "v"}, "token": "t"}  # fmt: skip
    assert up.submitted == [(0, 0, tmp_path / "step0/rank0", True), (1, 0, tmp_path / "step1/rank0", True)]
    assert up.closed


def test_uploader_errors_never_reach_the_training_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import parity.client.uploader as uploader

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("server exploded")

    monkeypatch.setattr(uploader, "BackgroundUploader", broken)
    PrecisionDebugger(dump_path=str(tmp_path), level="L1", server="http://parity:8000")
    PrecisionDebugger.start()
    torch.exp(torch.ones(2))
    PrecisionDebugger.stop()
    PrecisionDebugger.step()  # must not raise
    assert "Torch.exp.0.forward" in load_data(tmp_path)


def test_backward_after_stop_is_flushed_at_step(tmp_path: Path) -> None:
    PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    x = torch.randn(3, requires_grad=True)
    PrecisionDebugger.start()
    y = torch.sin(x).sum()
    PrecisionDebugger.stop()
    assert "Torch.sin.0.backward" not in load_data(tmp_path)
    y.backward()  # API backward hooks still fire after stop (§1.3)
    PrecisionDebugger.step()
    assert "Torch.sin.0.backward" in load_data(tmp_path)


def test_start_stop_twice_in_one_step_continues_counters(tmp_path: Path) -> None:
    PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    x = torch.ones(2)
    for _ in range(2):
        PrecisionDebugger.start()
        torch.exp(x)
        PrecisionDebugger.stop()
    torch.exp(x)  # not running: not recorded, no number consumed
    PrecisionDebugger.start()
    torch.exp(x)
    PrecisionDebugger.step()
    assert list(load_data(tmp_path)) == ["Torch.exp.0.forward", "Torch.exp.1.forward", "Torch.exp.2.forward"]


def test_exit_flushes_a_run_that_never_stopped(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import torch
        from parity.client import PrecisionDebugger
        PrecisionDebugger(dump_path={str(tmp_path)!r}, level="L1")
        PrecisionDebugger.start()
        torch.exp(torch.ones(3))
    """)
    subprocess.run(
        [sys.executable, "-c", script], check=True, cwd=Path(__file__).resolve().parents[2], timeout=120
    )
    assert "Torch.exp.0.forward" in load_data(tmp_path)
    from parity.shared.incomplete import incomplete_reason

    assert incomplete_reason(tmp_path / "step0" / "rank0") == (
        "the process ended while the step was recording (neither stop() nor step() was called)")


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_forked_child_records_nothing(tmp_path: Path) -> None:
    import os

    PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    PrecisionDebugger.start()
    pid = os.fork()
    if pid == 0:  # the child: a DataLoader worker would run transforms here
        rec = PrecisionDebugger._instance.recorder  # type: ignore[union-attr]
        torch.exp(torch.ones(2))
        os._exit(0 if rec is not None and not rec.data else 1)
    _, status = os.waitpid(pid, 0)
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    assert os.waitstatus_to_exitcode(status) == 0
