"""Tensor leaves of dump.json (dump-format.md §4.3) with statistics that stay on the device until a flush.

Each tensor costs three small reductions (``aminmax``, ``mean``, ``vector_norm``) whose 0-d results are kept,
grouped by dtype; :meth:`StatsBuffer.resolve` stacks each group once and moves it to the host with one
``tolist()``, then fills the ``Max``/``Min``/``Mean``/``Norm`` slots of the leaf dicts in place (the slots
exist from the start, so the key order of the file is msprobe's). Never one ``.item()`` per tensor.
Callers run this with torch-function handling disabled and grad off (see ``quiet()``), so the tool's own
reductions are neither recorded nor part of any autograd graph.

The output of one call is usually the input of the next, and at mix a module's inputs and outputs are its
APIs' tensors: a small cache keyed by tensor identity *and* ``_version`` (bumped by every in-place update)
lets those leaves share one set of statistics instead of recomputing them.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["StatsBuffer", "crc32_hex", "quiet"]

_DTYPE_STR: dict[torch.dtype, str] = {}
_FP8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
_SKIP_DTYPES = {getattr(torch, n) for n in _FP8
                if hasattr(torch, n)}  # fmt: skip


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Run the tool's own torch calls unseen by any torch-function mode (ours included) and without grad."""
    with torch._C.DisableTorchFunction(), torch.no_grad():
        yield


def crc32_hex(t: torch.Tensor) -> str:
    """msprobe's ``md5`` field: CRC-32 of the contiguous raw bytes as 8 lowercase hex digits (bf16 raw)."""
    flat = t.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    data = flat.contiguous().view(torch.uint8).numpy()
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"  # type: ignore[arg-type]  # zero-copy buffer


def _type_name(t: torch.Tensor) -> str:
    cls = type(t)
    if cls is torch.Tensor or cls is torch.nn.Parameter:
        return "torch.Tensor"
    return f"{cls.__module__}.{cls.__name__}"


class StatsBuffer:
    """Builds tensor leaves now and fills their statistics at :meth:`resolve`."""

    #: Resolve early past this many pending tensors, so a long step does not pile up device memory.
    MAX_PENDING = 20000

    #: How many recent tensors the identity cache remembers (it holds references, so keep it small).
    CACHE_SIZE = 64

    def __init__(self, *, md5: bool) -> None:
        self.md5 = md5
        # dtype -> flat list of 0-d stat tensors (4 per float tensor, 2 per bool tensor), and per tensor the
        # leaves that share those statistics
        self._values: dict[torch.dtype, list[torch.Tensor]] = {}
        self._leaves: dict[torch.dtype, list[list[dict[str, Any]]]] = {}
        # id(tensor) -> (tensor, version, the leaves it feeds, md5); holding the tensor keeps its id unique
        self._cache: dict[int, tuple[torch.Tensor, int, list[dict[str, Any]], str | None]] = {}
        self.pending = 0

    def leaf(self, t: torch.Tensor, data_name: str | None = None) -> dict[str, Any]:
        """The leaf dict of ``t``; statistics are queued, filled by the next :meth:`resolve`."""
        dtype = t.dtype
        dstr = _DTYPE_STR.get(dtype)
        if dstr is None:
            dstr = _DTYPE_STR[dtype] = str(dtype)
        leaf: dict[str, Any] = {
            "type": _type_name(t), "dtype": dstr, "shape": list(t.shape),
            "Max": None, "Min": None, "Mean": None, "Norm": None, "requires_grad": t.requires_grad,
        }  # fmt: skip
        if data_name is not None:
            leaf["data_name"] = data_name
        if t.is_meta or t.numel() == 0 or dtype in _SKIP_DTYPES or t.layout is not torch.strided:
            if self.md5 and not t.is_meta and t.layout is torch.strided:
                leaf["md5"] = crc32_hex(t)
            return leaf
        version = t._version
        hit = self._cache.get(id(t))
        if hit is not None and hit[0] is t and hit[1] == version:
            hit[2].append(leaf)
            if hit[3] is not None:
                leaf["md5"] = hit[3]
            return leaf
        x = t  # no detach(): callers run under quiet() (no grad), so it would only cost a dispatch
        if dtype is torch.bool:
            vals = [x.any(), x.all()]
        else:
            if x.is_complex():
                x = x.abs()
            elif not x.is_floating_point():
                x = x.double()  # integer stats in float64: exact for any int32, and mean() needs a float
            mn, mx = torch.aminmax(x)
            vals = [mx, mn, x.mean(), torch.linalg.vector_norm(x)]
        key = vals[0].dtype
        self._values.setdefault(key, []).extend(vals)
        sharing = [leaf]
        self._leaves.setdefault(key, []).append(sharing)
        digest = None
        if self.md5:
            digest = leaf["md5"] = crc32_hex(t)
        if len(self._cache) >= self.CACHE_SIZE:
            del self._cache[next(iter(self._cache))]
        self._cache[id(t)] = (t, version, sharing, digest)
        self.pending += 1
        if self.pending >= self.MAX_PENDING:
            self.resolve()
        return leaf

    def forget(self) -> None:
        """Drop the identity cache: for writes that do not bump ``_version`` (collectives write in C++)."""
        self._cache.clear()

    def resolve(self) -> None:
        """Move every pending statistic to the host (one stack + tolist per dtype) and fill the leaves."""
        for dtype, values in self._values.items():
            leaves = self._leaves[dtype]
            host = torch.stack(values).tolist()
            if dtype is torch.bool:
                for i, sharing in enumerate(leaves):
                    mx, mn = bool(host[2 * i]), bool(host[2 * i + 1])
                    for leaf in sharing:
                        leaf["Max"], leaf["Min"] = mx, mn
            else:
                for i, sharing in enumerate(leaves):
                    j = 4 * i
                    for leaf in sharing:
                        leaf["Max"], leaf["Min"], leaf["Mean"], leaf["Norm"] = host[j : j + 4]
        self._values.clear()
        self._leaves.clear()
        self._cache.clear()
        self.pending = 0
