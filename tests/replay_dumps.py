"""Real dumps for the float64 replay tests: a tiny model dumped by Parity's client in tensor mode, with a
fault injected into one call of the target (its forward, or its backward), as a kernel bug would.

The model holds what a replay meets: matmul-class calls (linear), a norm, an activation, an in-place update
(``add_``), dropout that is on (random) and off (``training=False``), a softmax, and the loss's backward.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from parity.client import PrecisionDebugger
from torch import nn
from torch.nn import functional as F

RANK = Path("step0") / "rank0"
GELU = "Functional.gelu.0.forward"


class ReplayNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.ln, self.fc2 = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.ln(self.fc1(x)))
        h.add_(1.0)  # in place: recorded with its input as it was before the update
        h = F.dropout(h, 0.25)  # random: never replayable
        h = F.dropout(h, 0.5, training=False)  # off: replayable
        return torch.softmax(self.fc2(h), dim=-1)


def _as_functional(name: str, impl: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``impl`` seen (and named) by the client as the one call ``F.<name>``."""

    def wrapper(*args: Any, **kwargs: Any) -> torch.Tensor:
        tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
        if torch.overrides.has_torch_function(tensors):
            return torch.overrides.handle_torch_function(wrapper, tensors, *args, **kwargs)
        return impl(*args, **kwargs)

    wrapper.__module__ = "torch.nn.functional"
    wrapper.__name__ = wrapper.__qualname__ = name
    return wrapper


def _noise(shape: torch.Size) -> torch.Tensor:
    return 1e-2 * torch.randn(shape, generator=torch.Generator().manual_seed(0))


def wrong_forward_gelu() -> Callable[..., torch.Tensor]:
    """A gelu kernel whose output is 1e-2 off."""
    orig = F.gelu
    return _as_functional("gelu", lambda x, *a, **k: orig(x, *a, **k) * (1 + _noise(x.shape)))


class _WrongGeluGrad(torch.autograd.Function):
    """gelu with an exact forward and a backward 1e-2 off: one node, one input, as the real kernel's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.ops.aten.gelu(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        exact = torch.ops.aten.gelu_backward(grad, x)
        return exact * (1 + _noise(x.shape))


def wrong_backward_gelu() -> Callable[..., torch.Tensor]:
    """A gelu kernel whose forward is right and whose backward is 1e-2 off."""
    return _as_functional("gelu", lambda x, *a, **k: _WrongGeluGrad.apply(x))


def dump_model(root: Path, *, gelu: Callable[..., torch.Tensor] | None = None,
               input_noise: float = 0.0, **debugger: Any) -> Path:  # fmt: skip
    """One training step of :class:`ReplayNet` dumped at L1 in tensor mode; returns the rank's dump.json.

    ``gelu`` replaces ``F.gelu`` for this dump (a faulty kernel); ``input_noise`` perturbs the input (another
    device's upstream rounding: every call's inputs differ, no kernel is wrong). ``debugger``: the
    ``PrecisionDebugger`` arguments instead of task tensor at L1 (``dump_path`` is always ``root``)."""
    torch.manual_seed(0)
    model = ReplayNet()
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    if input_noise:
        x = x + input_noise * torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    original = F.gelu
    # torch names callables from an index built on first use: build it with the real gelu, or a wrapper
    # installed first would take the name ``Functional.gelu`` for good
    torch.overrides.resolve_name(original)
    if gelu is not None:
        F.gelu = gelu
    PrecisionDebugger.reset()
    try:
        PrecisionDebugger(dump_path=str(root), **(debugger or {"task": "tensor", "level": "L1"}))
        PrecisionDebugger.start()
        torch.manual_seed(3)  # the same dropout mask on every side
        model(x).pow(2).mean().backward()
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
    finally:
        F.gelu = original
        PrecisionDebugger.reset()
    return root / RANK / "dump.json"


def copy_dump(dump_json: Path, dest: Path) -> Path:
    """A private copy of a rank directory (to damage it), returning the copy's dump.json."""
    shutil.copytree(dump_json.parent, dest)
    return dest / "dump.json"


def entry(dump_json: Path, name: str) -> dict[str, Any]:
    return json.loads(dump_json.read_text())["data"][name]  # type: ignore[no-any-return]


def write_compare_json(path: Path, target: Path, bench: Path) -> Path:
    path.write_text(json.dumps({"npu_path": str(target), "bench_path": str(bench)}))
    return path
