"""Small CPU tensors that are not contiguous (slices, transposes, permuted heads) are copied with their
strides and reduced at the flush: every statistic is the one the tensor's own reductions give when
recorded, bit for bit (the same values walked in the same order), NaN and inf included; an expanded tensor
(elements that overlap) is reduced at once, as before."""

from __future__ import annotations

import math

import torch
from parity.client.stats import StatsBuffer, quiet


def _views() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        base = (torch.randn(2, 8, 48, generator=gen) * 3 + 0.25).to(dtype)
        q, k, _ = base.split(16, dim=-1)  # slices with gaps
        out += [q, k, q.transpose(1, 2), base.view(2, 8, 6, 8).transpose(1, 2), base[:, ::3], base.mT]
    out[0][0, 0, 0] = float("nan")
    out[1][1, 2, 3] = float("inf")
    ints = torch.arange(-40, 56).view(8, 12)
    out += [ints.t(), ints[:, 1::2], (ints > 3).t(), torch.ones(3, 1).expand(3, 5), torch.zeros(0, 4).t()]
    out.append((torch.randn(4, 6, generator=gen) + 1j * torch.randn(4, 6, generator=gen)).t())
    return out


def _own(t: torch.Tensor) -> list[object]:
    """msprobe's statistics of ``t`` itself, as the reductions at record time computed them."""
    if t.dtype is torch.bool:
        return [bool(t.any()), bool(t.all())]
    # integers and float64 in float32, as msprobe 8.3.3 computes them
    plain = t.is_floating_point() and t.dtype is not torch.float64
    x = t.abs() if t.is_complex() else (t if plain else t.float())
    mn, mx = torch.aminmax(x)
    return [float(v.double()) for v in (mx, mn, x.mean(), torch.linalg.vector_norm(x))]


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return a == b and type(a) is type(b)


def test_views_statistics_equal_their_own_reductions_bit_for_bit() -> None:
    tensors = _views()
    assert sum(not t.is_contiguous() for t in tensors) >= len(tensors) - 1
    expected = [None if t.numel() == 0 else _own(t) for t in tensors]
    buf = StatsBuffer(md5=False)
    with quiet():
        leaves = [buf.leaf(t) for t in tensors]
        assert len(buf._strided) >= len(tensors) - 3  # copied (not the expanded, empty or complex ones)
        for t in tensors:
            if 0 not in t.stride():  # not the expanded one
                t.zero_()  # after recording: dumped as recorded
        buf.resolve()
    for t, leaf, want in zip(tensors, leaves, expected, strict=True):
        if want is None:
            assert leaf["Max"] is None
            continue
        keys = ("Max", "Min") if t.dtype is torch.bool else ("Max", "Min", "Mean", "Norm")
        got = [leaf[k] for k in keys]
        assert all(_same(g, w) for g, w in zip(got, want, strict=True)), (t.dtype, t.shape, got, want)
