"""Capture rules that make a dump match msprobe's on real training code (the msprobe side of each is in
tests/interop/test_msprobe_capture.py): reflected operators, replaced torch functions, recomputation inside
the backward, uninitialised memory, and everything put back at ``stop()``."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from parity.client import PrecisionDebugger
from torch import nn
from torch.autograd.function import BackwardCFunction
from torch.utils.checkpoint import checkpoint

from tests.client.conftest import load_data


def _record(tmp_path: Path, level: str, run: object, model: nn.Module | None = None) -> dict[str, object]:
    PrecisionDebugger(dump_path=str(tmp_path), level=level)
    PrecisionDebugger.start(model)
    run()  # type: ignore[operator]
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    return load_data(tmp_path)


def test_reflected_operators_are_named_by_their_reflected_dunder(tmp_path: Path) -> None:
    x, i = torch.randn(3), torch.tensor([1, 2, 3])
    rmul = torch.Tensor.__rmul__
    data = _record(tmp_path, "L1", lambda: (0.5 * x, 1 + x, 1 & i, 1 | i, 1 ^ i, x * 2, x + 1, i & 1))
    assert list(data) == [f"Tensor.{op}.0.forward" for op in ("__rmul__", "__radd__", "__rand__", "__ror__",
                                                                "__rxor__", "__mul__", "__add__", "__and__")]
    shown = data["Tensor.__rmul__.0.forward"]["input_args"]  # type: ignore[index]
    assert shown[1] == {"type": "float", "value": 0.5}
    assert torch.Tensor.__rmul__ is rmul and "__rmul__" not in torch.Tensor.__dict__  # put back at stop()


def test_a_replaced_torch_function_is_named_by_its_attribute(tmp_path: Path) -> None:
    original = F.softmax

    def port_softmax(input: torch.Tensor, dim: int | None = None, **_: object) -> torch.Tensor:
        e = (input - input.amax(dim=dim, keepdim=True)).exp()
        return e / e.sum(dim=dim, keepdim=True)

    F.softmax = port_softmax  # type: ignore[assignment]
    try:
        x = torch.randn(2, 5, requires_grad=True)
        data = _record(tmp_path, "L1", lambda: F.softmax(x, dim=-1).sum().backward())
        assert F.softmax is port_softmax  # the user's function is back after stop()
    finally:
        F.softmax = original
    assert list(data)[:2] == ["Functional.softmax.0.forward", "Tensor.sum.0.forward"]
    assert "Functional.softmax.0.backward" in data
    assert not any(n.startswith(("Tensor.amax", "Tensor.exp", "Tensor.__sub__")) for n in data)


def test_a_reentrant_checkpoint_records_the_recomputed_forward_and_its_backward(tmp_path: Path) -> None:
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)

    def train() -> None:
        checkpoint(lambda t: torch.relu(lin(t)), x, use_reentrant=True).sum().backward()

    data = _record(tmp_path, "L1", train)
    assert [n for n, e in data.items() if e.get("is_recompute")] == [  # type: ignore[union-attr]
        "Functional.linear.1.forward", "Torch.relu.1.forward"]
    assert {"Torch.relu.1.backward", "Functional.linear.1.backward"} <= set(data)
    assert "is_recompute" not in data["Functional.linear.0.forward"]  # type: ignore[operator]
    assert BackwardCFunction.apply.__module__ == "torch.autograd.function"  # put back at stop()


def test_uninitialised_memory_keeps_dtype_and_shape_only(tmp_path: Path) -> None:
    data = _record(tmp_path, "L1", lambda: torch.empty(3, 2).fill_(1.0))
    (leaf,) = data["Torch.empty.0.forward"]["output"]  # type: ignore[index]
    assert leaf["shape"] == [3, 2] and leaf["Max"] is None and "uninitialised memory" in leaf["note"]
    assert data["Tensor.fill_.0.forward"]["output"][0]["Max"] == 1.0  # type: ignore[index]
