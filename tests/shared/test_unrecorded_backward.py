"""A call whose backward only the bench records (a custom autograd Function with a wrong hand-written
backward) is named by the gradients across that backward; an optimizer's second moment whose Norm
statistic underflowed is no "identical" input (issue 34)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from parity.shared.compare.call_errors import _tensor_errors

from tests.shared.test_localization import _facts
from tests.shared.test_precision_choices import _compare


def _gelu_on_hand_written_backward(dtype: torch.dtype) -> Any:
    """GELU as a custom Function: the model's own forward, a hand-written backward that computes in
    ``dtype`` (bfloat16: the port's bug; float32: right, a recorded forward and an unrecorded backward)."""

    class HandWritten(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x)
            return F.gelu(x)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            (x,) = ctx.saved_tensors
            with torch.enable_grad():
                low = x.detach().to(dtype).requires_grad_()
                (g,) = torch.autograd.grad(F.gelu(low), low, grad.to(dtype))
            return g.to(x.dtype)

    return HandWritten.apply


def test_a_wrong_hand_written_backward_names_its_forward_call(tmp_path: Path) -> None:
    result = _compare(tmp_path, {"act": _gelu_on_hand_written_backward(torch.bfloat16)})
    top = result.suspects[0]
    # msprobe-exact capture records the hand-written backward's own calls (its bf16 cast), which are then the
    # answer; where they are not recorded, the forward call is judged across the bench-only backward gap
    assert top.api in {"Tensor.detach.0.forward", "Tensor.to.0.forward", "Functional.gelu.0.forward"}, top
    if top.api == "Functional.gelu.0.forward":
        assert "its backward Functional.gelu.0.backward is recorded on the bench only" in top.reason


def test_a_right_hand_written_backward_names_nothing(tmp_path: Path) -> None:
    result = _compare(tmp_path, {"act": _gelu_on_hand_written_backward(torch.float32)})
    assert [s.api for s in result.suspects if "gelu" in s.api] == []


def test_an_underflowed_norm_is_no_identical_pair() -> None:
    """An AdamW second moment of values near 1e-27 (Tensor.sqrt's input): the client's float32 Norm is 0
    and MaxAbsErr, rounded to 12 decimals, is 0 too; the float64 distance says the sides are far apart."""
    tiny = ("Tensor.sqrt.0.forward", (6.3e-27, 0.0, 4.5e-28, 0.0), (3.7e-27, 0.0, 4.4e-28, 0.0), (32,))
    facts = _facts([tiny, ("Tensor.sqrt.1.forward", (1.0, 0.0, 0.5, 2.0), (1.0, 0.0, 0.5, 2.0), (32,))])
    metrics = facts.metrics_array()
    metrics[:] = [[1.0, 4.1e-27, 0.0, 0.4, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]]
    err = _tensor_errors(facts, np.zeros(2))
    assert err[0] > 0.5  # 4.1e-27 against the largest value, 6.3e-27
    assert err[1] == 0.0
