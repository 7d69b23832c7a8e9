"""Dumps whose call traces differ (issue 24): the target fuses attention into one call, the bench computes
it explicitly. In msprobe's layout (``tests.factories``), for the alignment's tests (engine, CLI, server)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from tests.factories import DumpBuilder

Call = tuple[str, list[Any], list[Any]]
SDPA = "Functional.scaled_dot_product_attention"


def _t(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int, bench: list[Call]) -> torch.Tensor:
    """Explicit attention as the bench computes it, its calls appended to ``bench`` (counters from ``n``)."""
    kt = k.transpose(-2, -1)
    s = torch.matmul(q, kt)
    scaled = s / math.sqrt(q.shape[-1])
    p = F.softmax(scaled, dim=-1)
    o = torch.matmul(p, v)
    bench += [
        (f"Tensor.transpose.{n}.forward", [k, -2, -1], [kt]),
        (f"Torch.matmul.{2 * n}.forward", [q, kt], [s]),
        (f"Tensor.__truediv__.{n}.forward", [s, math.sqrt(q.shape[-1])], [scaled]),
        (f"Functional.softmax.{n}.forward", [scaled, -1], [p]),
        (f"Torch.matmul.{2 * n + 1}.forward", [p, v], [o]),
    ]
    return o


def fused_pair(npu_dir: Path, bench_dir: Path, *, fault: bool) -> tuple[Path, Path]:
    """Two attention blocks, each a linear, the attention and a tanh; the target fuses each attention into
    ``scaled_dot_product_attention`` (block 1's in bfloat16 when ``fault``), the bench computes it explicitly.
    Each block starts from the target's value, so the fault's inputs agree. Returns the two dump.json."""
    x = _t(2, 2, 8, 16, seed=7)
    w = _t(16, 16, seed=8) / 4
    target: list[Call] = []
    bench: list[Call] = []
    for block in range(2):
        q, k, v = x @ w, x @ w.T, x * 0.5
        for side in (target, bench):
            side.append((f"Functional.linear.{block}.forward", [x, w], [q]))
        fused = F.scaled_dot_product_attention(q, k, v)
        if fault and block == 1:
            fused = F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16()).float()
        target.append((f"{SDPA}.{block}.forward", [q, k, v], [fused]))
        explicit = _attention(q, k, v, block, bench)
        x = fused.tanh()
        target.append((f"Torch.tanh.{block}.forward", [fused], [x]))
        bench.append((f"Torch.tanh.{block}.forward", [explicit], [explicit.tanh()]))
    paths = []
    for calls, where in ((target, npu_dir), (bench, bench_dir)):
        builder = DumpBuilder("tensor")
        for name, inputs, outputs in calls:
            builder.api(name, inputs=inputs, outputs=outputs)
        paths.append(builder.write(where))
    return paths[0], paths[1]
