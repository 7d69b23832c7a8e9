"""A recorded call's arguments and outputs turned back into values: tensors from ``dump_tensor_data`` (loaded
weights-only, never unpickled), scalars, slices, sizes and dtypes from their dump.json leaves (dump-format.md
§4.3).

Each tensor's file is checked against its own dump.json record before it is used: the shape must match, and
so must the statistics (Max, Min, Mean) the recorder took when the call ran. A file whose values differ from
them was written after something changed the tensor in place, so it is not what the call saw, and a replay
from it would blame the kernel for the overwrite.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from parity.shared.errors import DumpError
from parity.shared.replay.apis import ReplayRefusal
from parity.shared.tensor_io import DEFAULT_LIMITS, TensorLimits, load_torch_tensor

__all__ = ["RecordedCall", "is_tensor_leaf", "tensor_file_names"]

_SCALAR_TYPES = frozenset(("bool", "int", "float", "str"))
_NUMPY_SCALARS = frozenset("float16 float32 float64 int8 int16 int32 int64 uint8 bool_".split())
_DTYPES: dict[str, torch.dtype] = {
    str(d): d for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16,
                        torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128)
}  # fmt: skip
_MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format, "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d, "preserve_format": torch.preserve_format,
}  # fmt: skip
_MAX_DEPTH = 64


def is_tensor_leaf(record: Any) -> bool:
    """A dump.json tensor record (``torch.Tensor``, a Parameter, a DTensor's local shard...)."""
    return isinstance(record, dict) and isinstance(record.get("type"), str) and "dtype" in record and (
        "shape" in record
    )


def tensor_file_names(record: Any, out: list[str]) -> list[str]:
    """Every ``data_name`` under a recorded value (the files a replay of it reads)."""
    if isinstance(record, dict):
        if is_tensor_leaf(record):
            if isinstance(record.get("data_name"), str):
                out.append(record["data_name"])
        else:
            for v in record.values():
                tensor_file_names(v, out)
    elif isinstance(record, list):
        for v in record:
            tensor_file_names(v, out)
    return out


def _stat_close(recorded: Any, actual: float, tolerance: float) -> bool:
    if not isinstance(recorded, (int, float)) or isinstance(recorded, bool):
        return True  # null, a placeholder or bool statistics: nothing to check against
    if math.isnan(recorded) or math.isnan(actual):
        return math.isnan(recorded) == math.isnan(actual)
    if math.isinf(recorded) or math.isinf(actual):
        return recorded == actual
    return abs(recorded - actual) <= tolerance


def _overflowed_mean(recorded: Any, t: torch.Tensor) -> bool:
    """A recorded infinite Mean that the tensor's own dtype also gives: a sum of masked values (float32's
    minimum) past that dtype's range, as a dump that accumulates in the tensor's dtype writes it (msprobe);
    the tensor is what the call saw."""
    if not (isinstance(recorded, float) and math.isinf(recorded) and t.is_floating_point()):
        return False
    with torch.no_grad():
        return float(t.mean()) == recorded


class RecordedCall:
    """Decodes the records of one side's dump (its ``dump_tensor_data`` directory) into values.

    ``float64``: floating tensors and floating dtype arguments become float64 (the replay's precision);
    otherwise tensors keep their recorded dtype (the recorded outputs, judged as they are).
    """

    def __init__(self, tensor_dir: Path, where: str, *, max_elements: int,
                 limits: TensorLimits = DEFAULT_LIMITS) -> None:  # fmt: skip
        self.tensor_dir = tensor_dir
        self.limits = limits
        self.where = where  # "target" / "bench": named in refusals
        self.max_elements = max_elements
        self.loaded_elements = 0

    def tensor(self, record: dict[str, Any], what: str) -> torch.Tensor:
        """The tensor a record names, checked against its record (shape, statistics)."""
        name = record.get("data_name")
        if not isinstance(name, str) or not name:
            raise ReplayRefusal(f"{self.where} {what}: no tensor file recorded (a statistics dump, or "
                                "filtered by data_mode)")  # fmt: skip
        if "/" in name or "\\" in name or name in (".", "..") or "\x00" in name:
            raise ReplayRefusal(f"{self.where} {what}: tensor file name {name!r} is not a plain file name")
        path = self.tensor_dir / name
        if not path.is_file():
            raise ReplayRefusal(f"{self.where} {what}: missing tensor file {name}")
        try:
            t: torch.Tensor = load_torch_tensor(path, limits=self.limits)
        except DumpError as exc:
            raise ReplayRefusal(f"{self.where} {what}: {exc.problem} ({name})") from None
        self.loaded_elements += int(t.numel())
        if self.loaded_elements > self.max_elements:
            raise ReplayRefusal(f"{self.where}: the call's tensors hold more than {self.max_elements} "
                                "elements, too large to replay here")  # fmt: skip
        shape = record.get("shape")
        if isinstance(shape, list) and list(t.shape) != shape:
            raise ReplayRefusal(f"{self.where} {what}: {name} holds shape {list(t.shape)}, dump.json records "
                                f"{shape}")  # fmt: skip
        self._check_statistics(record, t, what, name)
        return t

    def _check_statistics(self, record: dict[str, Any], t: torch.Tensor, what: str, name: str) -> None:
        """Max and Min are elements of the tensor, so they match exactly (JSON keeps 17 digits); the Mean was
        summed in float64 (Parity) or the tensor's own dtype (msprobe), so it may be off by that dtype's
        rounding of the magnitudes, or infinite where a masked tensor's sum overflowed it."""
        if t.numel() == 0 or t.dtype == torch.bool or t.is_complex():
            return
        with torch.no_grad():
            d = t.double()
            high, low, mean = float(d.max()), float(d.min()), float(d.mean())
        scale = max(abs(high), abs(low)) if math.isfinite(high) and math.isfinite(low) else 0.0
        eps = torch.finfo(t.dtype).eps if t.is_floating_point() else 0.0
        checks = (("Max", high, 1e-6 * abs(high) if math.isfinite(high) else 0.0),
                  ("Min", low, 1e-6 * abs(low) if math.isfinite(low) else 0.0),
                  ("Mean", mean, max(1e-4, 64 * eps) * scale))  # fmt: skip
        for key, actual, tolerance in checks:
            if key == "Mean" and _overflowed_mean(record.get(key), t):
                continue
            if not _stat_close(record.get(key), actual, tolerance):
                raise ReplayRefusal(
                    f"{self.where} {what} overwritten in place: {name} holds {key} {actual:.6g}, dump.json "
                    f"recorded {record.get(key)!r} when the call ran; the file is not what the call saw"
                )

    def value(self, record: Any, what: str, *, float64: bool, grad: bool = False, depth: int = 0) -> Any:
        """One recorded argument as the value the call received (tensors loaded). ``grad``: a floating
        tensor recorded with ``requires_grad`` takes part in autograd (a copy: in-place calls may alter
        it)."""
        if depth > _MAX_DEPTH:
            raise ReplayRefusal(f"{self.where} {what}: nested too deeply")
        if record is None:
            return None
        if isinstance(record, list):
            return [self.value(v, f"{what}.{i}", float64=float64, grad=grad, depth=depth + 1)
                    for i, v in enumerate(record)]  # fmt: skip
        if not isinstance(record, dict):
            raise ReplayRefusal(f"{self.where} {what}: unexpected record {type(record).__name__}")
        if is_tensor_leaf(record):
            t = self.tensor(record, what)
            if float64 and t.is_floating_point():
                t = t.to(torch.float64, copy=True)  # a copy: the file may be memory-mapped
                return t.requires_grad_().clone() if grad and record.get("requires_grad") is True else t
            if float64 and t.is_complex():
                return t.to(torch.complex128, copy=True)
            return t
        kind = record.get("type")
        if not isinstance(kind, str):
            if not record:
                raise ReplayRefusal(f"{self.where} {what}: recorded without its value ({{}}: a positional "
                                    "dtype or device, which msprobe's format does not keep)")  # fmt: skip
            return {k: self.value(v, f"{what}.{k}", float64=float64, grad=grad, depth=depth + 1)
                    for k, v in record.items()}  # fmt: skip
        return self._scalar(kind, record, what, float64=float64)

    def _scalar(self, kind: str, record: dict[str, Any], what: str, *, float64: bool) -> Any:
        value = record.get("value")
        if kind in _SCALAR_TYPES or kind in _NUMPY_SCALARS:
            return value
        if kind == "slice" and isinstance(value, list) and len(value) == 3:
            return slice(*value)
        if kind == "ellipsis":
            return Ellipsis
        if kind == "torch.Size" and isinstance(value, list):
            return torch.Size(value)
        if kind == "torch.dtype" and isinstance(value, str) and value in _DTYPES:
            dtype = _DTYPES[value]
            return torch.float64 if float64 and dtype.is_floating_point else dtype
        if kind == "torch.device":
            return torch.device("cpu")  # the replay runs on the CPU whatever device recorded it
        if kind == "torch.memory_format" and record.get("format") in _MEMORY_FORMATS:
            return _MEMORY_FORMATS[record["format"]]
        raise ReplayRefusal(f"{self.where} {what}: a {kind} argument cannot be rebuilt from its record")

    def arguments(self, entry: dict[str, Any], *, float64: bool, grad: bool = False
                  ) -> tuple[list[Any], dict[str, Any]]:  # fmt: skip
        """The call's positional and keyword arguments, as recorded (``out=`` dropped: the replay writes its
        own result)."""
        if "input_args" not in entry and "input_kwargs" not in entry:
            raise ReplayRefusal(f"{self.where}: the call's inputs were not recorded (data_mode)")
        raw_args = entry.get("input_args") or []
        raw_kwargs = entry.get("input_kwargs") or {}
        if not isinstance(raw_args, list) or not isinstance(raw_kwargs, dict):
            raise ReplayRefusal(f"{self.where}: input_args must be a list and input_kwargs an object")
        args = [self.value(v, f"input.{i}", float64=float64, grad=grad) for i, v in enumerate(raw_args)]
        kwargs = {k: self.value(v, f"kwargs.{k}", float64=float64, grad=grad)
                  for k, v in raw_kwargs.items() if k != "out"}  # fmt: skip
        return args, kwargs

    def tensors_of(self, records: Any, what: str, *, float64: bool) -> list[torch.Tensor | None]:
        """A recorded list (an output, a backward's gradients), flattened to its tensors in order; None where
        the record holds no tensor."""
        if not isinstance(records, list):
            raise ReplayRefusal(f"{self.where} {what}: not recorded")
        flat: list[torch.Tensor | None] = []
        for i, record in enumerate(records):
            if isinstance(record, list):
                flat.extend(self.tensors_of(record, f"{what}.{i}", float64=float64))
            elif is_tensor_leaf(record):
                flat.append(self.value(record, f"{what}.{i}", float64=float64))
            else:
                flat.append(None)
        return flat
