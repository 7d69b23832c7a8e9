"""dump.json lists entries in the order their calls completed, forward and backward interleaved: the order
the localization (``parity.shared.compare.localization``) reads as execution order."""

from __future__ import annotations

from pathlib import Path

import torch
from parity.client import PrecisionDebugger
from torch import nn

from tests.client.conftest import dump_once, load_data


def _sgd_step(tmp: Path, level: str) -> list[str]:
    PrecisionDebugger.reset()
    PrecisionDebugger(dump_path=str(tmp), level=level, task="statistics")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    PrecisionDebugger.start(model)
    loss = model(torch.randn(3, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    names = list(load_data(tmp))
    PrecisionDebugger.reset()
    return names


def test_api_entries_follow_execution_across_forward_backward_and_the_update(tmp_path: Path) -> None:
    names = _sgd_step(tmp_path, "L1")
    pos = {name: i for i, name in enumerate(names)}
    # forward in call order, then backward in reverse, then the optimizer's in-place update
    fwd = ["Functional.linear.0.forward", "Functional.relu.0.forward", "Functional.linear.1.forward"]
    bwd = ["Functional.linear.1.backward", "Functional.relu.0.backward", "Functional.linear.0.backward"]
    assert [pos[n] for n in fwd] == sorted(pos[n] for n in fwd)
    assert [pos[n] for n in bwd] == sorted(pos[n] for n in bwd)
    assert pos["Functional.linear.1.forward"] < pos["Functional.linear.1.backward"]
    updates = [i for name, i in pos.items() if name.startswith("Tensor.add_")]
    assert updates and min(updates) > pos["Functional.linear.0.backward"]


def test_a_module_backward_entry_follows_the_backward_calls_inside_it(tmp_path: Path) -> None:
    names = _sgd_step(tmp_path, "mix")
    pos = {name: i for i, name in enumerate(names)}
    # Its entry is opened when the gradient of its output arrives (before the linear's backward runs) and
    # moved when the gradient of its input leaves (after): the module completes after the call inside it.
    assert pos["Module.2.Linear.backward.0"] > pos["Functional.linear.1.backward"]
    assert pos["Module.2.Linear.forward.0"] > pos["Functional.linear.1.forward"]


def test_the_shared_dump_helper_still_records_forward_then_backward(tmp_path: Path) -> None:
    root = dump_once(tmp_path, "mlp", "L1")
    names = list(load_data(root))
    assert names.index("Functional.linear.1.forward") < names.index("Functional.linear.1.backward")
