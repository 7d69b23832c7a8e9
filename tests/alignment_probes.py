"""Issue 37's alignment probe, made here (not stored): two statistics dumps whose calls all differ, in module
scopes that alternate call by call, every tensor with the same statistics. Before the fix, ``split_by_scope``
scanned the bench's runs left for each target run and ``_provenance`` walked every earlier row of the same
value: 50,000 calls a side held a worker 3 min 50 s. ``benchmarks/bench_alignment_scale.py`` times it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["write_alternating_scopes"]

_LEAF = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4], "Max": 1.0, "Min": 0.0, "Mean": 0.5,
         "Norm": 1.0, "requires_grad": False}  # fmt: skip
_MODULES = ("Module.a.A.forward.0", "Module.b.B.forward.0")


def _side(root: Path, op: str, calls: int) -> Path:
    data: dict[str, Any] = {}
    construct: dict[str, str | None] = dict.fromkeys(_MODULES)
    for k in range(calls):
        name = f"Torch.{op}.{k}.forward"
        data[name] = {"input_args": [_LEAF], "input_kwargs": {}, "output": [_LEAF]}
        construct[name] = _MODULES[k % 2]
    root.mkdir(parents=True, exist_ok=True)
    doc = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None, "data": data}
    (root / "dump.json").write_text(json.dumps(doc))
    (root / "construct.json").write_text(json.dumps(construct))
    return root / "dump.json"


def write_alternating_scopes(root: Path, calls: int) -> tuple[Path, Path]:
    """(target, bench) dump.json paths of ``calls`` calls a side: target ``Torch.add``, bench ``Torch.mul``
    (no call pairs by name), the k-th call of each side in module a or b as k is even or odd."""
    return _side(root / "npu", "add", calls), _side(root / "bench", "mul", calls)
