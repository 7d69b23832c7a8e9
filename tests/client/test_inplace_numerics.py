"""In-place ops keep working and keep their backward data; statistics mode leaves the numbers untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from parity.client import PrecisionDebugger
from torch import nn

from tests.client.conftest import load_data, model_and_input, train_step


class InplaceNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h.add_(torch.ones_like(h))  # overwrites linear's output in place
        return self.fc2(self.act(h))


def test_inplace_ops_record_pre_mutation_inputs_and_every_backward(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = InplaceNet(), torch.randn(3, 4)
    PrecisionDebugger(dump_path=str(tmp_path), level="mix")
    PrecisionDebugger.start(model)
    train_step(model, x)  # no "view modified inplace" autograd error
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    data = load_data(tmp_path)
    relu_in = data["Functional.relu.0.forward"]["input_args"][0]
    relu_out = data["Functional.relu.0.forward"]["output"][0]
    assert relu_in["Min"] < 0 <= relu_out["Min"], "inputs must be recorded before the op mutates them"
    add_in, add_out = (
        data["Tensor.add_.0.forward"]["input_args"][0],
        data["Tensor.add_.0.forward"]["output"][0],
    )
    assert add_out["Min"] == pytest.approx(add_in["Min"] + 1)
    assert data["Functional.linear.0.forward"]["output"][0]["Min"] == pytest.approx(add_in["Min"])
    for name in ("Tensor.add_.0.backward", "Functional.relu.0.backward", "Module.act.ReLU.backward.0",
                 "Functional.linear.0.backward", "Module.fc1.Linear.backward.0"):  # fmt: skip
        entry = data[name]
        assert entry["input"] and entry["input"][0] is not None, name
    # the overwritten linear output still reports its own gradient (the relu mask applied), not relu's input
    fc1_grad = data["Module.fc1.Linear.backward.0"]["input"][0]
    assert fc1_grad["shape"] == [3, 6]


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("kind", ["transformer", "cnn", "lstm"])
def test_numerics_bit_for_bit(tmp_path: Path, kind: str, level: str) -> None:
    def run(instrumented: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model, x = model_and_input(kind)
        torch.manual_seed(1)
        losses = []
        for _ in range(2):
            if instrumented:
                PrecisionDebugger.start(model)
            losses.append(train_step(model, x).detach())
            if instrumented:
                PrecisionDebugger.stop()
                PrecisionDebugger.step()
        return torch.stack(losses), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain_loss, plain_grads = run(False)
    PrecisionDebugger(dump_path=str(tmp_path), level=level)
    loss, grads = run(True)
    assert torch.equal(loss, plain_loss)
    assert len(grads) == len(plain_grads)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True))
    PrecisionDebugger.drain()
    assert json.loads((tmp_path / "step1" / "rank0" / "dump.json").read_text())["data"]
