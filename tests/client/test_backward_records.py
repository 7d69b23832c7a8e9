"""Each API call's backward entry holds the gradients of that call's own outputs and inputs (issue 9).

The reference is the same model run without Parity, its gradients taken with plain tensor hooks. Tensor
task, so the saved gradients are compared exactly, not through statistics.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from parity.client import PrecisionDebugger
from torch import nn
from torch.nn import functional as F

from tests.client.conftest import load_data

Grads = dict[str, torch.Tensor]


def _dump(tmp: Path, step: Callable[[Grads | None], None]) -> tuple[dict[str, Any], Path]:
    PrecisionDebugger(dump_path=str(tmp), level="L1", task="tensor")
    PrecisionDebugger.start()
    step(None)
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    data = load_data(tmp)
    return data, tmp / "step0" / "rank0" / "dump_tensor_data"


def _saved(tensor_dir: Path, leaf: dict[str, Any]) -> torch.Tensor:
    return torch.load(tensor_dir / leaf["data_name"], weights_only=True)


def _keep(grads: Grads | None, name: str, t: torch.Tensor) -> None:
    """Reference run only: record ``t``'s gradient with a plain tensor hook."""
    if grads is not None:
        t.register_hook(lambda g: grads.__setitem__(name, g.detach().clone()))


def _every_forward_has_its_backward(data: dict[str, Any]) -> None:
    for name, entry in data.items():
        if name.endswith(".forward") and any(
            isinstance(o, dict) and o.get("requires_grad") for o in entry.get("output", [])
        ):
            assert name[: -len("forward")] + "backward" in data, name


def test_noop_float_records_its_own_output_gradient(tmp_path: Path) -> None:
    """The issue's first reproduction: ``float()`` on fp32 returns its input; its backward entry is the
    gradient of that output ([16, 10]), not a copy of the preceding linear's three gradients."""
    torch.manual_seed(0)
    fc, x, y = nn.Linear(64, 10), torch.randn(16, 64), torch.randint(0, 10, (16,))

    def step(grads: Grads | None) -> None:
        out = fc(x)
        logits = out.float()
        _keep(grads, "logits", logits)
        F.cross_entropy(logits, y).backward()

    ref: Grads = {}
    step(ref)
    fc.zero_grad()
    data, tensors = _dump(tmp_path, step)
    entry = data["Tensor.float.0.backward"]
    assert [leaf["shape"] for leaf in entry["input"]] == [[16, 10]]
    assert [leaf["shape"] for leaf in entry["output"]] == [[16, 10]]
    torch.testing.assert_close(_saved(tensors, entry["input"][0]), ref["logits"], rtol=0, atol=0)
    torch.testing.assert_close(_saved(tensors, entry["output"][0]), ref["logits"], rtol=0, atol=0)
    linear = data["Functional.linear.0.backward"]
    assert [leaf["shape"] if leaf else None for leaf in linear["output"]] == [[10], None, [64, 10]]
    _every_forward_has_its_backward(data)


def test_five_linears_changed_in_place_keep_every_backward(tmp_path: Path) -> None:
    """The issue's second reproduction: ``F.linear`` of a 3-D input returns a view; changing it in place
    dropped that call's backward entry. Now every call N has its backward N, holding the gradient of the
    output as the call produced it (before the in-place update)."""
    torch.manual_seed(0)
    layers = [nn.Linear(8, 8) for _ in range(5)]
    x = torch.randn(2, 4, 8)

    def step(grads: Grads | None) -> None:
        h = x
        for i, layer in enumerate(layers):
            h = F.linear(h, layer.weight, layer.bias)
            assert h._base is not None  # a view: what the in-place updates below rebase
            _keep(grads, f"base{i}", h._base)  # the base's node stays in the graph: its hook fires
            if i == 1:
                h.mul_(2)
            elif i == 2:
                h += 1
            elif i == 3:
                h.relu_()
        h.sum().backward()

    ref: Grads = {}
    step(ref)
    for layer in layers:
        layer.zero_grad()
    data, tensors = _dump(tmp_path, step)
    backward = [n for n in data if n.startswith("Functional.linear.") and n.endswith(".backward")]
    assert sorted(backward) == [f"Functional.linear.{i}.backward" for i in range(5)]
    for i in range(5):
        entry = data[f"Functional.linear.{i}.backward"]
        g_out = _saved(tensors, entry["input"][0])
        torch.testing.assert_close(g_out, ref[f"base{i}"].view(2, 4, 8), rtol=0, atol=0)
        torch.testing.assert_close(_saved(tensors, entry["output"][0]), ref[f"base{i}"], rtol=0, atol=0)
    _every_forward_has_its_backward(data)


def test_noop_views_and_outputs_used_twice(tmp_path: Path) -> None:
    """``contiguous()`` of a contiguous tensor and ``to()`` of the same dtype, an output used twice, a view
    changed in place: each entry is its own call's gradient."""
    torch.manual_seed(0)
    fc, x = nn.Linear(6, 10), torch.randn(4, 6)

    def step(grads: Grads | None) -> None:
        h = fc(x)
        a = h.contiguous()
        b = a.to(torch.float32)
        _keep(grads, "b", b)
        c = b * 2 + b
        _keep(grads, "c", c)
        v = c.view(4, 2, 5)
        v.mul_(3)
        v.sum().backward()

    ref: Grads = {}
    step(ref)
    fc.zero_grad()
    data, tensors = _dump(tmp_path, step)

    def grads(name: str, side: str) -> list[torch.Tensor]:
        return [_saved(tensors, leaf) for leaf in data[name][side]]

    for noop in ("Tensor.contiguous.0.backward", "Tensor.to.0.backward"):
        assert len(grads(noop, "input")) == len(grads(noop, "output")) == 1
        torch.testing.assert_close(grads(noop, "input")[0], ref["b"], rtol=0, atol=0)
        torch.testing.assert_close(grads(noop, "output")[0], ref["b"], rtol=0, atol=0)
    torch.testing.assert_close(grads("Tensor.__add__.0.backward", "input")[0], ref["c"], rtol=0, atol=0)
    view = "Tensor.view.0.backward"
    torch.testing.assert_close(grads(view, "input")[0], ref["c"].view(4, 2, 5), rtol=0, atol=0)
    torch.testing.assert_close(grads(view, "output")[0], ref["c"], rtol=0, atol=0)
    _every_forward_has_its_backward(data)


class _LinearThenInplaceReLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 2)
        self.grads: Grads | None = None  # the reference run's tensor hooks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)  # a view of a 2-D result: the in-place ReLU rebases it
        _keep(self.grads, "fc1", h._base)
        return self.fc2(self.act(h))


def _reference_then_l0_dump(model: nn.Module, x: torch.Tensor, tmp_path: Path
                            ) -> tuple[Grads, dict[str, Any], Path]:  # fmt: skip
    """The gradients plain tensor hooks see (``model.grads``), then the same step dumped at L0 in tensor
    mode: the reference, the dump's entries and its tensor folder."""
    ref: Grads = {}
    model.grads = ref
    model(x).sum().backward()
    model.grads = None
    model.zero_grad()
    PrecisionDebugger(dump_path=str(tmp_path), level="L0", task="tensor")
    PrecisionDebugger.start(model)
    model(x).sum().backward()
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    return ref, load_data(tmp_path), tmp_path / "step0" / "rank0" / "dump_tensor_data"


def test_module_output_view_changed_in_place_keeps_its_backward(tmp_path: Path) -> None:
    """The module analogue (L0, no API recorded): ``nn.Linear`` of a 3-D input followed by
    ``nn.ReLU(inplace=True)`` lost ``Module.fc1.Linear.backward.0``."""
    torch.manual_seed(0)
    model, x = _LinearThenInplaceReLU(), torch.randn(2, 4, 8)
    ref, data, tensors = _reference_then_l0_dump(model, x, tmp_path)
    for name in ("Module.fc1.Linear", "Module.act.ReLU", "Module.fc2.Linear"):
        assert f"{name}.backward.0" in data, name
    g = _saved(tensors, data["Module.fc1.Linear.backward.0"]["input"][0])
    torch.testing.assert_close(g, ref["fc1"].view(2, 4, 8), rtol=0, atol=0)


class _Pair(nn.Module):
    """Two grad-requiring inputs (the multi-grad hook) around a one-input module (a tensor's own hook)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.fc(a) * b


class _TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pair = _Pair()
        self.grads: Grads | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x * 2, x + 1
        _keep(self.grads, "a", a)
        _keep(self.grads, "b", b)
        out = self.pair(a, b)
        _keep(self.grads, "out", out)
        return out * out  # the module's output used twice: its gradient is the sum


def test_module_backward_of_one_and_of_two_inputs(tmp_path: Path) -> None:
    """A module's backward ``input`` is its output's gradient and ``output`` its inputs' gradients, whether
    it has one grad-requiring tensor (its own hook) or several (a multi-grad hook): equal to plain hooks."""
    torch.manual_seed(0)
    model, x = _TwoInputs(), torch.randn(3, 4, requires_grad=True)
    ref, data, tensors = _reference_then_l0_dump(model, x, tmp_path)
    pair = data["Module.pair._Pair.backward.0"]
    assert len(pair["input"]) == 1 and len(pair["output"]) == 2
    torch.testing.assert_close(_saved(tensors, pair["input"][0]), ref["out"], rtol=0, atol=0)
    torch.testing.assert_close(_saved(tensors, pair["output"][0]), ref["a"], rtol=0, atol=0)
    torch.testing.assert_close(_saved(tensors, pair["output"][1]), ref["b"], rtol=0, atol=0)
    fc = data["Module.pair.fc.Linear.backward.0"]
    assert len(fc["input"]) == 1 and len(fc["output"]) == 1
    torch.testing.assert_close(_saved(tensors, fc["output"][0]), ref["a"], rtol=0, atol=0)
