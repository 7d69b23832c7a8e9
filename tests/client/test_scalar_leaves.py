"""CPU scalars (0-d tensors: AdamW's step counts, losses, clamp bounds) are read when recorded instead of
staged: their leaves hold exactly the numbers the staged path gives (the float64 value as all four
statistics, any/all for a bool), in the same key order, md5 included."""

from __future__ import annotations

import math

import pytest
import torch
from parity.client.stats import StatsBuffer, crc32_hex, quiet

VALUES = [0.0, -0.0, 1.5, -7.25, 3.0e38, 1e-40, float("nan"), float("inf"), float("-inf")]
INTS = [0, -1, 7, 2**31 - 1, -(2**31), 2**53 + 1, 2**62 + 3, -(2**63)]


def _scalars() -> list[torch.Tensor]:
    out = [torch.tensor(v, dtype=dt) for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16)
           for v in VALUES]  # fmt: skip
    out += [torch.tensor(v, dtype=torch.int64) for v in INTS]
    out += [torch.tensor(v, dtype=dt) for dt in (torch.int32, torch.int16, torch.int8) for v in (0, -5, 100)]
    out += [torch.tensor(200, dtype=torch.uint8), torch.tensor(True), torch.tensor(False)]
    out.append(torch.tensor(2.5, requires_grad=True) * 2)  # a loss: part of a graph
    return out


def _staged_numbers(t: torch.Tensor) -> list[object]:
    """What the staged path fills: the copy's value moved to the host in float64 (bool: any, all)."""
    x = t.detach().clone() if t.is_floating_point() or t.dtype is torch.bool else t.detach().double()
    v = torch.stack([x]).to(torch.float64).tolist()[0]
    return [bool(v), bool(v)] if t.dtype is torch.bool else [v, v, v, v]


@pytest.mark.parametrize("md5", [False, True])
def test_cpu_scalars_read_when_recorded_equal_the_staged_numbers(md5: bool) -> None:
    tensors = _scalars()
    expected = [_staged_numbers(t) for t in tensors]
    buf = StatsBuffer(md5=md5)
    with quiet():
        leaves = [buf.leaf(t) for t in tensors]
        digests = [crc32_hex(t) for t in tensors]
        for t in tensors:
            if not t.requires_grad and t.grad_fn is None:
                t.fill_(0)  # after recording: the dump keeps the value as it was
        buf.resolve()
    assert buf.pending == 0  # nothing was staged for them
    for t, leaf, want, digest in zip(tensors, leaves, expected, digests, strict=True):
        keys = ["type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad"]
        keys += ["md5"] if md5 else []
        assert list(leaf) == keys
        assert leaf["shape"] == [] and leaf["requires_grad"] is t.requires_grad
        stat_keys = ("Max", "Min") if t.dtype is torch.bool else ("Max", "Min", "Mean", "Norm")
        got = [leaf[k] for k in stat_keys]
        assert [type(g) for g in got] == [type(w) for w in want], t.dtype
        same = [(isinstance(g, float) and math.isnan(g) and math.isnan(w)) or  # type: ignore[arg-type]
                (g == w and math.copysign(1, g) == math.copysign(1, w))  # type: ignore[arg-type]
                for g, w in zip(got, want, strict=True)]  # fmt: skip
        assert all(same), (t.dtype, got, want)
        if t.dtype is torch.bool:
            assert leaf["Mean"] is None and leaf["Norm"] is None
        if md5:
            assert leaf["md5"] == digest


def test_scalars_that_are_not_plain_numbers_keep_the_staged_path() -> None:
    """A complex scalar is staged (its statistics are of its absolute value), as before."""
    buf = StatsBuffer(md5=False)
    with quiet():
        leaf = buf.leaf(torch.tensor(3 + 4j))
        assert buf.pending == 1
        buf.resolve()
    assert leaf["Max"] == leaf["Min"] == leaf["Mean"] == leaf["Norm"] == 5.0
