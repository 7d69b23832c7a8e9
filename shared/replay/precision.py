"""Which coarser floating format a call's recorded values fit exactly: the trace a kernel leaves when it
computes in float16 or bfloat16 and writes its result back as float32.

Its distance from the float64 replay need not show it: a float16 matmul on a TF32 target sits at the level
every TF32 matmul does. Its values do: a float32 result that went through float16 holds float16 values only
(each element survives a round trip through float16), which a float32 accumulation almost never gives
(a random float32 value fits float16 with chance 2**-13). The replay reports the format a side's output
fits (``held``) when its inputs do not fit it and its output has at least MIN_ELEMENTS elements that are
not zero; the verdict blames it only where the other side's output does not fit it (a rounding op, an
integer-valued result, fits on both sides).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

__all__ = ["MIN_ELEMENTS", "held_format"]

#: Elements (not zero) an output needs before "all of them fit float16" means anything.
MIN_ELEMENTS = 16
_FORMATS = (torch.bfloat16, torch.float16)  # the coarser first: a bfloat16 value in range fits float16 too


def _floating(tensors: Iterable[object]) -> list[torch.Tensor]:
    return [t for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point()
            and t.dtype in (torch.float32, torch.float64)]  # fmt: skip


def _fits(tensors: Sequence[torch.Tensor], fmt: torch.dtype) -> bool:
    for t in tensors:
        finite = t.detach()[torch.isfinite(t.detach())]
        if not torch.equal(finite.to(fmt).to(finite.dtype), finite):
            return False
    return True


def _flat(values: Iterable[object]) -> list[object]:
    out: list[object] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.extend(_flat(v))
        else:
            out.append(v)
    return out


def held_format(outputs: Sequence[object], inputs: Sequence[object]) -> str | None:
    """The coarser format (``float16``, ``bfloat16``) every float32/float64 output value fits while the
    inputs' values do not; None when there is none, or too few non-zero elements to tell."""
    outs = _floating(_flat(outputs))
    if sum(int(torch.count_nonzero(t)) for t in outs) < MIN_ELEMENTS:
        return None
    ins = _floating(_flat(inputs))
    for fmt in _FORMATS:
        if _fits(outs, fmt) and not (ins and _fits(ins, fmt)):
            return str(fmt).replace("torch.", "")
    return None
