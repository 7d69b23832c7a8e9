"""Small pieces of training code that capture used to record differently from msprobe 8.3.3:
``python capture_cases.py TOOL OUT``, run with msprobe's interpreter (``TOOL=msprobe``) and Parity's. Each
case is one step of one run at mix (step N is ``CASES[N]``), so each tool starts once.

- ``reflected``: Python's reflected operators (``0.5 * x`` is ``Tensor.__rmul__``, ``1.0 + x``
  ``Tensor.__radd__``), beside the forward ones;
- ``patched``: ``F.softmax`` replaced by a Python function (as NPU adapters and fused-kernel libraries do):
  one ``Functional.softmax`` entry, the calls inside it not recorded;
- ``checkpoint``: a reentrant activation checkpoint (``use_reentrant=True``) at mix: the recomputed forward
  (``is_recompute``) and its backward;
- ``dtypes``: integer and float64 tensors, whose statistics msprobe computes in float32;
- ``nonfinite``: a call whose output holds the same ``-inf`` on both sides (T5's relative position buckets);
- ``modulegrad``: an input used by two modules and by a third whose output does not depend on it (a rotary
  embedding reads only its input's dtype): each module's backward ``output`` is the gradient through it,
  and the third has no backward entry.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

CASES = ("reflected", "patched", "checkpoint", "dtypes", "nonfinite", "modulegrad")


def fused_softmax(input: torch.Tensor, dim: int | None = None, _stacklevel: int = 3,
                  dtype: torch.dtype | None = None) -> torch.Tensor:  # fmt: skip
    """A replacement softmax, as a port writes one (several torch calls of its own)."""
    shifted = input - input.amax(dim=dim, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)


class Rotary(nn.Module):
    """Like ``LlamaRotaryEmbedding``: its output depends on its input's dtype only."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv", torch.linspace(0.1, 1.0, 4))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.inv.to(h.dtype).cos()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)
        self.a, self.b, self.rot = nn.Linear(4, 4), nn.Linear(4, 4), Rotary()

    def fan(self, h: torch.Tensor) -> torch.Tensor:
        """``h`` consumed by ``a`` and ``b`` (its gradient the sum of both) and read by ``rot``."""
        return (self.a(h) + self.b(h) * self.rot(h)).sum()

    def inner(self, t: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(t))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(checkpoint(self.inner, x, use_reentrant=True))


def run_case(case: str, debugger: object, model: Block) -> None:
    """One case's step; its inputs are made before ``start()`` (msprobe records only the APIs of its list,
    Parity every one: ``detach``, ``torch.tensor`` would be Parity's entries only)."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, requires_grad=True)
    y, i = torch.randn(3) + 2, torch.tensor([1, 2, 3])
    w = torch.randn(4, 4, dtype=torch.float64)
    relative = torch.tensor([[0, 1, 2, 5], [1, 0, 1, 3]])
    debugger.start(model)  # type: ignore[attr-defined]
    if case == "reflected":
        _ = (0.5 * y, 1.0 + y, 2 - y, 2**y, 2 % y, 1 | i, 1 ^ i, y * 0.5, y + 1.0)
    elif case == "patched":
        torch.relu(F.softmax(x, dim=-1)).sum().backward()
    elif case == "checkpoint":
        model(x).sum().backward()
    elif case == "dtypes":
        positions = torch.arange(1, 12)
        _ = torch.matmul(w, w.t()).sum(), (positions * 3).sum(), positions.float().mean()
    elif case == "nonfinite":
        _ = torch.log(relative.float() / 2) * 3
    elif case == "modulegrad":
        model.fan(x).backward()
    debugger.stop()  # type: ignore[attr-defined]
    debugger.step()  # type: ignore[attr-defined]


def main(tool: str, out: Path) -> None:
    if tool == "msprobe":
        from msprobe.pytorch import PrecisionDebugger
    else:
        from parity.client import PrecisionDebugger
    F.softmax = fused_softmax  # type: ignore[assignment]  # before the debugger, as an adapter does
    out.mkdir(parents=True, exist_ok=True)
    config = {"task": "statistics", "dump_path": str(out), "rank": [], "step": [], "level": "mix",
              "async_dump": False, "statistics": {"scope": [], "list": [], "data_mode": ["all"],
                                                  "summary_mode": "statistics"}}  # fmt: skip
    (out / "config.json").write_text(json.dumps(config))
    debugger = PrecisionDebugger(config_path=str(out / "config.json"))
    torch.manual_seed(0)
    model = Block()
    for case in CASES:
        run_case(case, debugger, model)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
