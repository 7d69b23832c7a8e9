"""Masked values are not precision (issue 34): an attention score tensor masked with float32's minimum is
compared over its unmasked elements, its statistics are written without overflowing, its softmax replays in
float64, and on a pair that differs only by rounding noise upstream its softmax is no suspect.

The engine cases dump one training step of a small causal attention twice with Parity's client: the bench
as written, the target with its projections' weights moved by a few float32 ulps (noise, no fault)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from parity.client.stats import StatsBuffer, quiet
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.headers import full_header
from parity.shared.compare.localization import localize
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import CompareResult
from parity.shared.metrics.tensor import compare_arrays, compare_raw
from parity.shared.replay.engine import replay_calls
from parity.shared.tensor_io import RawTensor
from torch import nn

from tests.shared.test_precision_choices import _dump

MIN32 = float(torch.finfo(torch.float32).min)
SOFTMAX = "Functional.softmax.0.forward"


class CausalAttention(nn.Module):
    """One head of causal self-attention over 8 positions, the mask added as float32's minimum (as
    Hugging Face's eager attention does)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(32, 32) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.view(2, 8, 32)
        scores = torch.matmul(self.q(h), self.k(h).transpose(-1, -2)) * 32**-0.5
        mask = torch.full((8, 8), MIN32).triu(1)
        p = F.softmax(scores + mask, dim=-1)
        return self.o(torch.matmul(p, self.v(h))).view(16, 32)[:, :8]


def _pair(tmp_path: Path, task: str) -> tuple[Path, Path]:
    torch.manual_seed(0)
    bench = _dump(tmp_path / "bench", CausalAttention(), task=task)
    torch.manual_seed(0)
    model = CausalAttention()
    noise = torch.Generator().manual_seed(3)
    with torch.no_grad():  # rounding noise: each weight a few float32 ulps off
        for lin in (model.q, model.k, model.v):
            lin.weight.mul_(1 + 2e-7 * torch.randn(lin.weight.shape, generator=noise))
    return _dump(tmp_path / "target", model, task=task), bench


def _softmax_input_error(result: CompareResult) -> float:
    judged = localize(result.rows, result.states, result.facts, result.mode).judged
    return float(judged.input_err[judged.columns.apis.index(SOFTMAX)])


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_a_masked_softmax_on_a_noise_only_pair_is_no_suspect(tmp_path: Path, task: str) -> None:
    """The mask's -3.4e38 does not swamp the scores' relative error (it was "inputs agree to 2.5e-41", and
    the softmax the first suspect)."""
    target, bench = _pair(tmp_path, task)
    result = compare_dumps(target, bench, CompareOptions())
    assert all(s.api != SOFTMAX for s in result.suspects), [(s.api, s.reason) for s in result.suspects]
    error = _softmax_input_error(result)
    assert error == 0.0 or error > 1e-12, error  # the scores' own noise, never 1e-41
    if task == "tensor":
        header = full_header(result.mode, stack=result.stack_mode)
        row = next(r for r in result.rows if r.cells[0] == f"{SOFTMAX}.input.0")
        assert row.cells[header.index("Err_message")].startswith("56 of 128 elements are a mask")
        assert error > 1e-9


def test_masked_statistics_are_written_without_overflow(tmp_path: Path) -> None:
    """float32's Mean of a masked tensor is -inf and its Norm inf; accumulated in float64 both are finite."""
    scores = torch.randn(4, 8).masked_fill(torch.ones(4, 8, dtype=torch.bool).triu(1), MIN32)
    buf = StatsBuffer(md5=False)
    with quiet():
        leaf = buf.leaf(scores)
        buf.resolve()
    assert leaf["Min"] == MIN32 and math.isfinite(leaf["Mean"]) and math.isfinite(leaf["Norm"])
    assert leaf["Mean"] == pytest.approx(scores.double().mean().item(), rel=1e-12)
    json.dumps(leaf, allow_nan=False)  # strict JSON: no Infinity written


def test_a_masked_softmax_replays_in_float64(tmp_path: Path) -> None:
    """The float64 replay takes the masked scores (its recorded Mean no longer -inf), and takes them too from
    a dump whose float32 Mean overflowed (msprobe's): that Mean is what the file gives in its own dtype."""
    target, bench = _pair(tmp_path, "tensor")
    (verdict,) = replay_calls(target, bench, [SOFTMAX])
    assert "overwritten" not in verdict.text and verdict.verdict.value != "refused", verdict.text
    for side in (target, bench):  # as a dump that sums in float32 writes it
        doc = json.loads(side.read_text())
        doc["data"][SOFTMAX]["input_args"][0]["Mean"] = -math.inf
        side.write_text(json.dumps(doc))
    (verdict,) = replay_calls(target, bench, [SOFTMAX])
    assert "overwritten" not in verdict.text and verdict.verdict.value != "refused", verdict.text


def test_the_metrics_of_a_masked_pair_are_those_of_its_unmasked_elements() -> None:
    rng = np.random.default_rng(0)
    bench = rng.standard_normal((8, 8)).astype(np.float32)
    target = bench + np.float32(0.05) * rng.standard_normal((8, 8)).astype(np.float32)
    hidden = np.triu(np.ones((8, 8), dtype=bool), 1)
    bench[hidden] = target[hidden] = MIN32
    whole = compare_arrays(target, bench)
    masked = compare_raw(RawTensor(target), RawTensor(bench), fill=0.5 * -MIN32)
    plain = compare_arrays(target[~hidden], bench[~hidden])
    assert whole.cosine == 1.0 and whole.one_thousandth > 0.4  # the mask agrees with itself
    assert masked.cosine == plain.cosine < 1.0
    assert masked.one_thousandth == plain.one_thousandth == 0.0
    assert masked.max_abs_err == plain.max_abs_err
    assert masked.messages[-1] == "28 of 64 elements are a mask (equal fill values): left out of the metrics."
