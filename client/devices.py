"""Every device-specific call of the client, in one place, probed at run time and never assumed.

Capture runs on whatever device the user's tensors live on: CPU, CUDA, an Ascend NPU (``torch_npu``), XPU,
MPS. The rest of the client only ever asks this module: is there an accelerator, synchronise a device, make a
side stream, pin host memory, can a tensor's values be read at all. ``torch.accelerator`` (torch 2.6+)
answers where it exists; older versions fall back to the device's own module (``torch.cuda``,
``torch.npu``...). On a machine without an accelerator every call degrades to the plain CPU behaviour:
no streams, no pinning, nothing to synchronise.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "accelerator",
    "available_devices",
    "host_dtype",
    "pinned_empty",
    "side_stream",
    "stream_context",
    "synchronize",
    "to_host",
    "unreadable",
]

#: Accelerator types probed (in order) when ``torch.accelerator`` is missing.
_PROBED = ("cuda", "npu", "xpu", "mps")


def _backend(device_type: str) -> Any:
    """``torch.cuda``, ``torch.npu`` (registered by torch_npu), ... or None."""
    return getattr(torch, device_type, None)


@functools.lru_cache(maxsize=1)
def accelerator() -> torch.device | None:
    """The process's accelerator (``cuda``, ``npu``, ``xpu``, ``mps``...), or None on a CPU-only machine."""
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "is_available"):
        try:
            if acc.is_available():
                dev = acc.current_accelerator()
                return None if dev is None else torch.device(dev.type)
            return None
        except Exception:  # a broken driver is no accelerator, never a crash at import
            return None
    for name in _PROBED:
        mod = _backend(name)
        try:
            if mod is not None and mod.is_available():
                return torch.device(name)
        except Exception:
            continue
    return None


def available_devices() -> list[str]:
    """``cpu``, then the accelerator's type if one is present (what the tests are parametrized by)."""
    acc = accelerator()
    return ["cpu"] if acc is None else ["cpu", acc.type]


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a no-op on CPU and on devices that cannot be synchronised)."""
    if device.type in ("cpu", "meta"):
        return
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "synchronize"):
        acc.synchronize(device)
        return
    mod = _backend(device.type)
    if mod is not None and hasattr(mod, "synchronize"):
        mod.synchronize(device) if device.type != "mps" else mod.synchronize()


def side_stream(device: torch.device) -> Any:
    """A new stream on ``device`` for the tool's own copies, or None where there are no streams (CPU)."""
    if device.type in ("cpu", "meta"):
        return None
    try:
        return torch.Stream(device=device)
    except Exception:  # torch without the generic Stream, or a device without streams (mps)
        mod = _backend(device.type)
        stream_cls = getattr(mod, "Stream", None) if mod is not None else None
        if stream_cls is None:
            return None
        try:
            return stream_cls(device=device)
        except Exception:
            return None


def current_stream(device: torch.device) -> Any:
    """The stream the user's work on ``device`` is queued on (None on CPU)."""
    if device.type in ("cpu", "meta"):
        return None
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "current_stream"):
        return acc.current_stream(device)
    mod = _backend(device.type)
    return mod.current_stream(device) if mod is not None and hasattr(mod, "current_stream") else None


@contextlib.contextmanager
def stream_context(stream: Any) -> Iterator[None]:
    """Queue the enclosed work on ``stream`` (None: where it would go anyway)."""
    if stream is None:
        yield
        return
    device = stream.device
    cur = current_stream(device)
    acc = getattr(torch, "accelerator", None)
    setter = getattr(acc, "set_stream", None) if acc is not None else None
    if setter is None:
        mod = _backend(device.type)
        with mod.stream(stream):
            yield
        return
    setter(stream)
    try:
        yield
    finally:
        setter(cur)


def pinned_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A flat host buffer, page-locked when an accelerator can copy into it asynchronously."""
    if accelerator() is not None:
        try:
            return torch.empty(numel, dtype=dtype, pin_memory=True)
        except Exception:  # pinning can fail (limits, mps): a pageable buffer still works, only slower
            pass
    return torch.empty(numel, dtype=dtype)


def host_dtype(device: torch.device) -> torch.dtype:
    """The dtype statistics travel to the host in: float64 (exact for every float32/16 value and int32),
    float32 on devices without float64 (MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def unreadable(t: torch.Tensor) -> str | None:
    """Why ``t``'s values cannot be read (``meta``, fake, functional, no storage), or None if they can."""
    if t.is_meta:
        return "meta tensor"
    cls = type(t)
    if cls is not torch.Tensor and cls is not torch.nn.Parameter:
        name = cls.__name__
        if name == "FakeTensor":
            return "fake tensor"
        if name == "FunctionalTensor":
            return "functional tensor"
    if torch._is_functional_tensor(t):
        return "functional tensor"
    return None


def to_host(by_device: dict[torch.device, list[torch.Tensor]]) -> dict[torch.device, torch.Tensor]:
    """Each device's 1-D float64 statistics, on the host: one copy per device and one wait per device.

    Every copy is queued first (asynchronous where the device allows), then each device is waited on once,
    so several devices overlap their transfers."""
    out: dict[torch.device, torch.Tensor] = {}
    for device, parts in by_device.items():
        flat = parts[0] if len(parts) == 1 else torch.cat(parts)
        out[device] = flat if device.type == "cpu" else flat.to("cpu", non_blocking=True)
    for device in out:
        synchronize(device)
    return out
