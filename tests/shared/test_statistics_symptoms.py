"""Causes, not symptoms, in statistics mode (issue 34): parameter gradients, the loss and the optimizer's
updates follow from the calls before them; the call whose inputs' statistics agree and whose outputs' do
not ranks above them.

A team lead's nightly: one training step (forward, loss, backward, SGD) of a small MLP, dumped twice in
statistics mode with Parity's client, the target computing one linear in bfloat16."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from parity.shared.compare.choices import Choices
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.localization import CALL_TIER, CAUSE_TIER, SYMPTOM_TIER, _statistics_tiers
from parity.shared.compare.options import CompareOptions
from torch import nn

from tests.shared.test_precision_choices import _dump


class Mlp(nn.Module):
    """Four linears with GELUs between; ``bf16`` computes the second linear in bfloat16 (cast in, out)."""

    def __init__(self, *, bf16: bool = False) -> None:
        super().__init__()
        self.layers: list[nn.Linear] = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))  # type: ignore[assignment]
        self.bf16 = bf16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            if self.bf16 and i == 1:
                h = F.linear(x.bfloat16(), layer.weight.bfloat16(), layer.bias.bfloat16()).float()
            else:
                h = layer(x)
            x = F.gelu(h)
        return x


def test_one_linear_under_bfloat16_is_named_before_its_symptoms(tmp_path: Path) -> None:
    torch.manual_seed(0)
    bench = _dump(tmp_path / "bench", Mlp(), task="statistics")
    torch.manual_seed(0)
    target = _dump(tmp_path / "target", Mlp(bf16=True), task="statistics")
    result = compare_dumps(target, bench, CompareOptions(replay_top=0))
    assert result.suspects, "the bfloat16 linear names no call at all"
    first = result.suspects[0].api
    # the linear itself, or the casts that feed it (the port's choice)
    assert first.startswith(("Functional.linear.", "Tensor.bfloat16.", "Tensor.float.")), (
        [s.api for s in result.suspects])
    assert result.first_divergence is not None
    assert result.first_divergence.api.startswith(("Functional.linear.", "Tensor.bfloat16.", "Tensor.float."))


def test_parameter_gradients_the_loss_and_the_updates_rank_after_the_cause() -> None:
    """The tiers statistics mode ranks by: the call whose inputs agree (or that asked for another precision)
    first, then other calls, then the symptoms, whatever their scores."""
    apis = ["Functional.linear.0.forward", "Functional.gelu.0.forward", "Functional.mse_loss.0.forward",
            "Functional.mse_loss.0.backward", "Functional.gelu.0.backward", "Functional.linear.0.backward",
            "Module.fc.Linear.parameters_grad.0", "Tensor.mul_.0.forward", "Tensor.addcdiv_.0.forward",
            "Tensor.sqrt.0.forward", "Torch._foreach_add_.0.forward"]
    directions = [a.rsplit(".", 1)[-1] if a.endswith(("forward", "backward")) else None for a in apis]
    classes = ["matmul", "elementwise", "loss", "loss", "elementwise", "matmul", "elementwise", "elementwise",
               "elementwise", "elementwise", "elementwise"]
    n = len(apis)
    i_err = np.array([0.0, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 0.0, 0.0, 1e-3, 1e-3, 1e-3])
    o_err = np.full(n, 1e-3)
    o_err[0] = 2e-3
    zeros, no = np.zeros(n), np.zeros(n, dtype=bool)
    choices = Choices(zeros, zeros, zeros, zeros, no, no, no, [None] * n, [None] * n)
    tiers = _statistics_tiers(apis, directions, classes, i_err, o_err, choices).tolist()
    assert tiers[0] == CAUSE_TIER  # inputs identical, output off
    assert tiers[1] == CALL_TIER and tiers[4] == CALL_TIER and tiers[5] == CALL_TIER
    assert tiers[2:4] == [SYMPTOM_TIER] * 2  # the loss
    assert tiers[6:] == [SYMPTOM_TIER] * 5  # a parameter gradient (no inputs: "identical") and the updates
