"""Uninitialised memory is not data (issue 34): a MoE layer that gathers its experts' outputs into a
``torch.empty_like`` buffer (``buf[idx] = expert(h[idx])``) compares clean between two seeded identical runs,
whatever the allocator left in the buffer, and a fault in an expert is still named.

Each case dumps one training step with Parity's client, with different garbage left in the allocator before
each run, and compares the two dumps with the engine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.facts import F_UNINITIALISED
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import CompareResult, RowStatus
from parity.shared.compare.uninitialised import MSG_UNINITIALISED
from torch import nn

from tests.shared.test_precision_choices import _dump


class Moe(nn.Module):
    """A linear, a top-1 router and four experts whose outputs fill an ``empty_like`` buffer."""

    def __init__(self, faulty: int | None = None) -> None:
        super().__init__()
        self.inp, self.router, self.out = nn.Linear(32, 32), nn.Linear(32, 4), nn.Linear(32, 8)
        self.experts = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))
        self.faulty = faulty

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        top = self.router(h).softmax(-1).argmax(-1)
        buf = torch.empty_like(h)
        for e, expert in enumerate(self.experts):
            idx = (top == e).nonzero().squeeze(-1)
            y = expert(h[idx])
            buf[idx] = y * 1.5 if e == self.faulty else y
        return self.out(buf)


def _run(root: Path, garbage: float, faulty: int | None = None, task: str = "tensor") -> Path:
    junk = [torch.full((16, 32), garbage) for _ in range(4)]  # freed memory the buffer may reuse
    del junk
    torch.manual_seed(0)
    return _dump(root, Moe(faulty), task=task)


def _compare(tmp_path: Path, faulty: int | None = None, task: str = "tensor") -> CompareResult:
    bench = _run(tmp_path / "bench", 1e6, task=task)
    target = _run(tmp_path / "target", -7.0, faulty, task=task)
    return compare_dumps(target, bench, CompareOptions())


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_two_identical_runs_filling_an_empty_like_buffer_compare_clean(tmp_path: Path, task: str) -> None:
    result = _compare(tmp_path, task=task)
    assert result.facts is not None
    flagged = np.flatnonzero(result.facts.has(F_UNINITIALISED)).tolist()
    names = [result.facts.names[i] for i in flagged]
    assert any(n.startswith("Torch.empty_like.0.forward.output") for n in names), names
    assert any(n.startswith("Tensor.__setitem__.0.forward.input.0") for n in names), names
    assert all(result.rows[i].status is RowStatus.UNCOMPARABLE for i in flagged)
    assert all(MSG_UNINITIALISED in str(result.rows[i].cells) for i in flagged)
    failing = [r.cells[0] for r in result.rows if r.status in (RowStatus.FAIL, RowStatus.WARNING)]
    assert failing == []
    assert result.suspects == []


def test_the_calls_that_fill_the_buffer_are_judged_on_what_they_write(tmp_path: Path) -> None:
    """An expert whose output is scaled before it is written (a call only the target makes): the values
    written differ and are named where they are made; the empty buffer is never the suspect."""
    result = _compare(tmp_path, faulty=1)
    assert result.suspects
    assert all("empty_like" not in s.api for s in result.suspects)
    assert result.suspects[0].api == "Tensor.__mul__.0.forward"


class OutArgument(nn.Module):
    """A call that writes its result into an ``empty`` tensor through ``out=``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        dest = torch.empty(16, 8)
        torch.mul(h.detach(), 2.0, out=dest)
        return dest + h


def test_an_out_argument_before_its_write_is_not_data(tmp_path: Path) -> None:
    for side, garbage in (("bench", 1e6), ("target", -7.0)):
        junk = [torch.full((16, 8), garbage) for _ in range(4)]
        del junk
        torch.manual_seed(0)
        _dump(tmp_path / side, OutArgument())
    target, bench = (next((tmp_path / side).glob("step0/*/dump.json")) for side in ("target", "bench"))
    result = compare_dumps(target, bench, CompareOptions())
    assert result.facts is not None
    flagged = {result.facts.names[i] for i in np.flatnonzero(result.facts.has(F_UNINITIALISED)).tolist()}
    assert "Torch.mul.0.forward.kwargs.out" in flagged, flagged
    assert "Torch.mul.0.forward.output.0" not in flagged
    assert [r.cells[0] for r in result.rows if r.status in (RowStatus.FAIL, RowStatus.WARNING)] == []
    assert result.suspects == []
