"""A module's output-gradient hook and the next module's input-gradient hook on the same tensor are one hook
calling both callbacks: the dump is the one separate hooks give, byte for byte, whatever else hooks that
tensor in between (a no-op API call at mix hooks its output, which is that same tensor)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from parity.client import PrecisionDebugger
from parity.client import recorder as recorder_module
from torch import nn

from tests.client.conftest import dump_once


class Chain(nn.Module):
    """Modules whose outputs feed the next one, a no-op call between two of them, an in-place module, and a
    tensor that two modules take."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.act = nn.ReLU(inplace=True)
        self.c = nn.Linear(6, 6)
        self.d = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h = h.float()  # fp32 already: returns h itself (mix hooks it as the identity)
        h = self.act(self.b(h))
        return self.d(self.c(h)) + self.d(h)


def _dump(tmp: Path, level: str) -> Path:
    PrecisionDebugger.reset()
    PrecisionDebugger(dump_path=str(tmp), level=level, task="statistics")
    torch.manual_seed(0)
    model, x = Chain(), torch.randn(4, 6, requires_grad=True)
    for _ in range(2):
        PrecisionDebugger.start(model)
        model(x).pow(2).mean().backward()
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
    PrecisionDebugger.reset()
    return tmp


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.json"))}


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_joined_hooks_dump_what_separate_hooks_dump(tmp_path: Path, level: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    runs = []
    for name in ("joined", "separate"):  # one call site: the stacks are the same too
        if name == "separate":  # never the tool's last hook: every callback its own hook, as before
            monkeypatch.setattr(recorder_module, "last_hook_key", lambda t: object())
        runs.append([_files(_dump(tmp_path / name, level)),
                     _files(dump_once(tmp_path / f"{name}_tf", "transformer", level))])  # fmt: skip
    joined, separate = runs
    assert joined == separate
    data = joined[0]["step0/rank0/dump.json"].decode()
    assert '"Module.b.Linear.backward.0"' in data and '"Module.a.Linear.backward.0"' in data
