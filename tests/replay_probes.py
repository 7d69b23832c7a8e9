"""Crafted dumps that try to make the float64 replay spend without bound (issue 37): each is a few KB on
disk, its tensors stored expanded (a stride-0 view of one element: ``torch.save`` keeps the tiny storage),
and each asks for minutes of CPU, gigabytes of memory or a native crash.

``write_probe(name, rank_dir)`` writes one as a rank directory and returns ``(dump.json, entry)``; the
regression tests replay each and the benchmark (``benchmarks/bench_replay_budget.py``) times them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from tests.factories import scalar_leaf, tensor_leaf


def expanded(*shape: int, value: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A tensor of ``shape`` whose file holds one element."""
    return torch.full((1,) * len(shape), value, dtype=dtype).expand(*shape)


class ProbeDump:
    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.tensors: dict[str, torch.Tensor] = {}

    def leaf(self, value: Any, stem: str, *, requires_grad: bool = False) -> Any:
        if value is None:
            return None
        if isinstance(value, torch.Tensor):
            name = f"{stem}.pt"
            self.tensors[name] = value
            return tensor_leaf(value, data_name=name, requires_grad=requires_grad)
        if isinstance(value, (list, tuple)):
            return [self.leaf(v, f"{stem}.{i}", requires_grad=requires_grad) for i, v in enumerate(value)]
        return scalar_leaf(value)

    def forward(self, entry: str, args: list[Any], kwargs: dict[str, Any] | None = None,
                output: Any = None, *, requires_grad: bool = False) -> None:  # fmt: skip
        self.data[entry] = {
            "input_args": [self.leaf(a, f"{entry}.input.{i}", requires_grad=requires_grad)
                           for i, a in enumerate(args)],  # fmt: skip
            "input_kwargs": {k: self.leaf(v, f"{entry}.kwargs.{k}") for k, v in (kwargs or {}).items()},
            "output": [self.leaf(output if output is not None else torch.zeros(1), f"{entry}.output.0")],
        }

    def backward(self, entry: str, grads_out: list[Any], grads_in: list[Any]) -> None:
        self.data[entry] = {
            "input": [self.leaf(g, f"{entry}.input.{i}") for i, g in enumerate(grads_out)],
            "output": [self.leaf(g, f"{entry}.output.{i}") for i, g in enumerate(grads_in)],
        }

    def write(self, rank_dir: Path) -> Path:
        tensor_dir = rank_dir / "dump_tensor_data"
        tensor_dir.mkdir(parents=True, exist_ok=True)
        for name, tensor in self.tensors.items():
            torch.save(tensor, tensor_dir / name)  # expanded stays expanded: the file holds its one element
        doc = {"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": str(tensor_dir),
               "data": self.data}  # fmt: skip
        (rank_dir / "dump.json").write_text(json.dumps(doc))
        return rank_dir / "dump.json"


def _max_pool(p: ProbeDump) -> str:
    p.forward("Functional.max_pool1d.0.forward", [expanded(1, 1, 2**20), 2**19, 1])  # stride 1
    return "Functional.max_pool1d.0.forward"


def _cdist(p: ProbeDump) -> str:
    p.forward("Torch.cdist.0.forward", [expanded(8192, 512), expanded(8192, 512)], {"p": 3.0})
    return "Torch.cdist.0.forward"


def _nuclear_norm(p: ProbeDump) -> str:
    p.forward("Torch.norm.0.forward", [expanded(1, 2048, 2048)], {"p": "nuc", "dim": [1, 2]})
    return "Torch.norm.0.forward"


def _bilinear(p: ProbeDump) -> str:
    args = [expanded(4096, 256), expanded(4096, 256), expanded(256, 256, 256)]
    p.forward("Functional.bilinear.0.forward", args)
    return "Functional.bilinear.0.forward"


def _einsum(p: ProbeDump) -> str:
    n = 20_000  # (a b),(b c) -> (a c): a 20,000 x 20,000 float64 intermediate, 3.2 GB, for a 20,000 output
    p.forward("Torch.einsum.0.forward", ["ab,bc,cd->ad", expanded(n, 1), expanded(1, n), expanded(n, 1)])
    return "Torch.einsum.0.forward"


def _masked_index(p: ProbeDump) -> str:
    mask = torch.tensor([True, False])
    p.forward("Tensor.__getitem__.0.forward", [expanded(2, 8, 4096), [mask, expanded(2**20, dtype=torch.long,
                                                                             value=0)]])  # fmt: skip
    return "Tensor.__getitem__.0.forward"


def _unbind(p: ProbeDump) -> str:
    p.forward("Torch.unbind.0.forward", [expanded(2**20)])
    return "Torch.unbind.0.forward"


def _empty_gradient(call: str, args: Callable[[], list[Any]], grads_in: int) -> Callable[[ProbeDump], str]:
    """A backward entry whose recorded gradient is ``torch.empty(0)``: native kernels read past it."""

    def build(p: ProbeDump) -> str:
        p.forward(f"{call}.forward", args(), requires_grad=True)
        p.backward(f"{call}.backward", [torch.empty(0)], [torch.zeros(1)] * grads_in)
        return f"{call}.backward"

    return build


def _norm_args(width: int) -> Callable[[], list[Any]]:
    return lambda: [torch.randn(4, width, generator=torch.Generator().manual_seed(0)), [width]]


PROBES: dict[str, Callable[[ProbeDump], str]] = {
    "max_pool1d": _max_pool,
    "cdist_p3": _cdist,
    "nuclear_norm": _nuclear_norm,
    "bilinear": _bilinear,
    "einsum": _einsum,
    "masked_index": _masked_index,
    "unbind": _unbind,
    "layer_norm_empty_grad": _empty_gradient("Functional.layer_norm.0", _norm_args(8), 1),
    "batch_norm_empty_grad": _empty_gradient(
        "Functional.batch_norm.0",
        lambda: [torch.randn(4, 3, generator=torch.Generator().manual_seed(0)), None, None,
                 torch.ones(3), torch.zeros(3), True],  # fmt: skip
        3,
    ),
    "cdist_empty_grad": _empty_gradient(
        "Torch.cdist.1", lambda: [torch.randn(5, 3, generator=torch.Generator().manual_seed(0)),
                                torch.randn(6, 3, generator=torch.Generator().manual_seed(1))], 2,
    ),  # fmt: skip
}


def write_probe(name: str, rank_dir: Path) -> tuple[Path, str]:
    """The crafted dump ``name`` (a key of :data:`PROBES`) as ``rank_dir``: its dump.json and the entry."""
    probe = ProbeDump()
    entry = PROBES[name](probe)
    return probe.write(rank_dir), entry


def write_probes(rank_dir: Path, names: Iterable[str] = PROBES) -> tuple[Path, dict[str, str]]:
    """Several probes in one dump (their entry names differ): its dump.json and each probe's entry."""
    probe = ProbeDump()
    entries = {name: PROBES[name](probe) for name in names}
    return probe.write(rank_dir), entries
