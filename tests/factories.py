"""Builders for msprobe-layout dumps in tests, independent of Parity's own writer.

They write what msprobe writes (dump-format.md §3-§4) from plain arrays, so the reader, the engine and the
reports are tested against the format itself rather than against Parity's writer.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch


def _as_tensor(value: np.ndarray | torch.Tensor) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))


def tensor_leaf(
    value: np.ndarray | torch.Tensor,
    *,
    data_name: str | None = None,
    requires_grad: bool = False,
    md5: bool = False,
) -> dict[str, Any]:
    """The dump.json record of one tensor, with msprobe's statistics (computed in float64 here)."""
    t = _as_tensor(value)
    leaf: dict[str, Any] = {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape)}
    if t.numel() == 0:
        leaf.update(Max=None, Min=None, Mean=None, Norm=None)
    elif t.dtype == torch.bool:
        leaf.update(Max=bool(t.any()), Min=bool(t.all()), Mean=None, Norm=None)
    else:
        d = t.double()
        leaf.update(Max=d.max().item(), Min=d.min().item(), Mean=d.mean().item(), Norm=d.norm().item())
    leaf["requires_grad"] = requires_grad
    if data_name is not None:
        leaf["data_name"] = data_name
    if md5:
        leaf["md5"] = f"{zlib.crc32(t.contiguous().view(torch.uint8).numpy().tobytes()) & 0xFFFFFFFF:08x}"
    return leaf


def scalar_leaf(value: bool | int | float | str) -> dict[str, Any]:
    """The record of a Python scalar argument."""
    return {"type": type(value).__name__, "value": value}


class DumpBuilder:
    """Accumulates entries for one ``rank`` directory and writes it in the msprobe layout.

    ``task="tensor"`` saves every tensor as ``dump_tensor_data/{entry}.{category}.{index}.pt`` and sets
    ``data_name``; ``task="statistics"`` records statistics only (``md5=True`` adds CRC-32 checksums).
    """

    def __init__(self, task: str = "tensor", level: str = "L1", *, md5: bool = False) -> None:
        self.task = task
        self.level = level
        self.md5 = md5
        self.data: dict[str, Any] = {}
        self.tensors: dict[str, torch.Tensor] = {}
        self.stack: dict[str, Any] | None = None
        self.construct: dict[str, Any] | None = None

    def _leaf(self, value: Any, file_stem: str) -> Any:
        if value is None:
            return None
        if isinstance(value, (np.ndarray, torch.Tensor)):
            data_name = None
            if self.task == "tensor":
                data_name = f"{file_stem}.pt"
                self.tensors[data_name] = _as_tensor(value)
            return tensor_leaf(value, data_name=data_name, md5=self.md5)
        if isinstance(value, (list, tuple)):
            return [self._leaf(v, f"{file_stem}.{i}") for i, v in enumerate(value)]
        if isinstance(value, Mapping):
            return {k: self._leaf(v, f"{file_stem}.{k}") for k, v in value.items()}
        return scalar_leaf(value)

    def api(
        self,
        name: str,
        inputs: Sequence[Any] = (),
        outputs: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> DumpBuilder:
        """Add a forward entry (``input_args``/``input_kwargs``/``output``) or, for a ``.backward`` name,
        a backward entry (``input``/``output``)."""
        if name.endswith(".backward") or ".backward." in name:
            self.data[name] = {
                "input": [self._leaf(v, f"{name}.input.{i}") for i, v in enumerate(inputs)],
                "output": [self._leaf(v, f"{name}.output.{i}") for i, v in enumerate(outputs)],
            }
        else:
            self.data[name] = {
                "input_args": [self._leaf(v, f"{name}.input.{i}") for i, v in enumerate(inputs)],
                "input_kwargs": {k: self._leaf(v, f"{name}.kwargs.{k}") for k, v in (kwargs or {}).items()},
                "output": [self._leaf(v, f"{name}.output.{i}") for i, v in enumerate(outputs)],
            }
        return self

    def parameters_grad(self, entry: str, grads: Mapping[str, Any]) -> DumpBuilder:
        """A parameter-gradient entry as msprobe writes it: ``{param: [leaf]}``, files ``{entry}.{param}.pt``.

        ``entry`` is ``Module.fc.Linear.parameters_grad`` (msprobe 8.3.3) or ``...parameters_grad.0`` (older).
        """
        self.data[entry] = {name: [self._leaf(value, f"{entry}.{name}")] for name, value in grads.items()}
        return self

    def write(self, rank_dir: Path) -> Path:
        """Write dump.json (and tensors, stack.json, construct.json when set); returns dump.json's path."""
        rank_dir.mkdir(parents=True, exist_ok=True)
        tensor_dir = rank_dir / "dump_tensor_data"
        if self.tensors:
            tensor_dir.mkdir(exist_ok=True)
            for file_name, tensor in self.tensors.items():
                torch.save(tensor.clone().contiguous(), tensor_dir / file_name)
        doc = {
            "task": self.task,
            "level": self.level,
            "framework": "pytorch",
            "dump_data_dir": str(tensor_dir) if self.tensors else None,
            "data": self.data,
        }
        dump_json = rank_dir / "dump.json"
        dump_json.write_text(json.dumps(doc, indent=1))  # allow_nan: bare NaN/Infinity, as msprobe
        if self.stack is not None:
            (rank_dir / "stack.json").write_text(json.dumps(self.stack, indent=1))
        if self.construct is not None:
            (rank_dir / "construct.json").write_text(json.dumps(self.construct, indent=1))
        return dump_json


def stats_leaf(
    max_: Any,
    min_: Any,
    mean: Any,
    norm: Any,
    *,
    dtype: str = "torch.float32",
    shape: Sequence[int] = (4,),
    requires_grad: bool | None = False,
    md5: str | None = None,
) -> dict[str, Any]:
    """A tensor record with the statistics given verbatim (NaN/inf/None allowed), for statistics mode."""
    leaf: dict[str, Any] = {"type": "torch.Tensor", "dtype": dtype, "shape": list(shape),
                            "Max": max_, "Min": min_, "Mean": mean, "Norm": norm}  # fmt: skip
    if requires_grad is not None:
        leaf["requires_grad"] = requires_grad
    if md5 is not None:
        leaf["md5"] = md5
    return leaf


def write_raw_dump(rank_dir: Path, data: Mapping[str, Any], *, task: str = "statistics") -> Path:
    """Write a dump.json with hand-made entries (``{entry name: {"input_args": [...], ...}}``); returns it."""
    rank_dir.mkdir(parents=True, exist_ok=True)
    doc = {"task": task, "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": dict(data)}
    dump_json = rank_dir / "dump.json"
    dump_json.write_text(json.dumps(doc, indent=1))  # allow_nan: bare NaN/Infinity, as msprobe
    return dump_json
