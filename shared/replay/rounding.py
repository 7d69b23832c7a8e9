"""How far a correct kernel's output may sit from the exact (float64) result: the replay's rounding allowance,
from the compare's one expected-error model (``parity.shared.compare.expected_error``)::

    allowance = REPLAY_SAFETY * u * (1 + ROUNDING_SCALE * sqrt(K))

``u`` is the unit roundoff of the coarsest floating dtype the call wrote (float32: 6.0e-8, float16: 4.9e-4,
bfloat16: 3.9e-3), and ``K`` the length of the call's longest reduction, read from the replayed arguments and
output shapes (:func:`reduction_length`). The distance the allowance bounds is norm-wise:
``||recorded - replay|| / ||replay||``. (An elementwise call counts as a 2-term reduction: a few ulps of a
transcendental function.)

Measured on the replay tests' model (float32, CPU; ``tests/replay_dumps.py``): correct calls, forward and
backward, sit at 0 to 2.2e-7 from their replay against allowances of 4.3e-6 to 9.3e-6; the injected 1e-2
faults (a forward and a backward gelu) at 8.7e-3 and 1.2e-2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from parity.shared.compare.expected_error import replay_allowance, unit_roundoff

__all__ = ["reduction_length", "rounding_allowance"]

_MATMUL_SECOND = frozenset(("addmm", "addbmm", "baddbmm", "addmv", "addr"))  # the operand after ``input``
_MATMUL = frozenset(("matmul", "mm", "bmm", "mv", "dot", "vdot", "inner", "linear", "bilinear", "__matmul__",
                     "__rmatmul__", "tensordot", *_MATMUL_SECOND))  # fmt: skip
_CONV = frozenset(("conv1d", "conv2d", "conv3d"))
_CONV_T = frozenset(("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"))
_BY_DIM = frozenset(("softmax", "log_softmax", "softmin", "cumsum", "cumprod", "logcumsumexp", "logsumexp",
                     "sum", "mean", "prod", "std", "var", "std_mean", "var_mean", "norm", "vector_norm",
                     "normalize", "cosine_similarity", "nansum", "nanmean"))  # fmt: skip
_RNN = frozenset(("lstm", "gru", "rnn_tanh", "rnn_relu"))


def rounding_allowance(dtype: torch.dtype, k: int) -> float:
    """The norm-wise relative distance from float64 that rounding in ``dtype`` over ``k`` terms explains."""
    return replay_allowance(unit_roundoff(str(dtype)), k)


def _tensors(values: Sequence[Any]) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(_tensors(v))
    return found


def _dims(value: Any, ndim: int) -> list[int] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value % ndim] if ndim else []
    if isinstance(value, (list, tuple)) and all(isinstance(d, int) for d in value):
        return [d % ndim for d in value] if ndim else []
    return None


def _numel(t: torch.Tensor) -> int:
    return int(t.numel())


def _forward_length(api: str, args: Sequence[Any], kwargs: Mapping[str, Any],
                    outputs: Sequence[torch.Tensor]) -> int:  # fmt: skip
    tensors = _tensors([*args, *kwargs.values()])
    if not tensors:
        return 1
    first = tensors[0]
    if api in _MATMUL:
        operand = tensors[1] if api in _MATMUL_SECOND and len(tensors) > 1 else first
        return int(operand.shape[-1]) if operand.dim() else 1
    if api == "einsum" and len(tensors) > 1:  # the contracted size: what the operands span beyond the output
        out = max((_numel(o) for o in outputs), default=1)
        return max(1, math.prod(_numel(t) for t in tensors) // max(out, 1))
    if api in _CONV and len(tensors) > 1:
        return max(1, math.prod(tensors[1].shape[1:]))
    if api in _CONV_T and len(tensors) > 1:
        w = tensors[1]
        return max(1, int(w.shape[0]) * math.prod(w.shape[2:]))
    if api in ("layer_norm", "rms_norm"):
        shape = kwargs.get("normalized_shape", args[1] if len(args) > 1 else None)
        if isinstance(shape, int):
            return shape
        if isinstance(shape, (list, tuple)) and all(isinstance(d, int) for d in shape):
            return max(1, math.prod(shape))
        return int(first.shape[-1]) if first.dim() else 1
    if api == "group_norm":
        groups = kwargs.get("num_groups", args[1] if len(args) > 1 else 1)
        n = int(first.shape[0]) if first.dim() else 1
        return max(1, _numel(first) // max(1, n * (groups if isinstance(groups, int) else 1)))
    if api in ("batch_norm", "instance_norm"):
        channels = int(first.shape[1]) if first.dim() > 1 else 1
        return max(1, _numel(first) // channels)
    if api == "scaled_dot_product_attention" and len(tensors) > 1:
        return int(first.shape[-1]) + int(tensors[1].shape[-2] if tensors[1].dim() > 1 else 1)
    if api in _RNN:  # each step reduces over input and hidden size; errors carry along the sequence
        hidden = tensors[1].shape[-1] if len(tensors) > 1 and tensors[1].dim() else 1
        steps = first.shape[0] if first.dim() > 2 else 1
        return max(1, (int(first.shape[-1]) + int(hidden)) * int(steps))
    if api in _BY_DIM:
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        dims = _dims(dim, first.dim())
        if dims:
            return max(1, math.prod(int(first.shape[d]) for d in dims))
    # anything else: what a reduction folds, the largest input over the largest output (1 for elementwise)
    out = max((_numel(o) for o in outputs), default=1)
    return max(1, max(_numel(t) for t in tensors) // max(out, 1))


def reduction_length(
    api: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    outputs: Sequence[torch.Tensor],
    grads_of_outputs: Sequence[torch.Tensor] = (),
) -> int:
    """K: the longest reduction of the call, from its recorded arguments and output shapes.

    Matmul-class calls: the contracted dimension; convolutions C_in x kh x kw; norms the normalized size;
    softmax and dim-reductions the reduced dims; sdpa head dim + key length; RNNs (input + hidden) x steps;
    other calls the largest input over the largest output (1 for elementwise). A backward also folds the
    rows of its output gradients (a weight gradient sums over the batch), so it takes the larger of the two.
    """
    k = _forward_length(api, args, kwargs, outputs)
    for g in grads_of_outputs:
        if g.dim():
            k = max(k, _numel(g) // max(1, int(g.shape[-1])))
    return k
