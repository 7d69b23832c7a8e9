"""Which recorded calls the float64 replay may run, and the callable each one names.

A dump is untrusted input, so its API names are never evaluated or imported: each name is looked up in a
fixed allow-list below, per msprobe prefix (``Torch``, ``Functional``, ``Tensor``, ``VF``), and the callable
is taken with ``getattr`` from one of a few namespaces imported here (``torch``, ``torch.nn.functional``,
``torch.Tensor``, ``torch.linalg``, ``torch.special``, ``torch._VF``). A name outside the list is refused with
its reason: a custom op (another prefix: ``NPU``, ``MindSpeed``, ``Distributed``, a user prefix), randomness
(dropout that is on, ``rand*``, ``bernoulli``...), or an API not on the list.

The list holds the calls that compute: matmul and convolution, norms, softmax, activations, reductions,
losses, elementwise maths, and the shape operations that go with them. Calls that only create or repeat data
from size arguments (``zeros``, ``repeat``, ``expand``, ``pad``, ``interpolate``...) are left out: they add
no rounding worth judging, and their size arguments would let a crafted dump make a replay allocate without
bound.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own spelling

__all__ = ["ALLOWED", "REPLAY_PREFIXES", "ReplayRefusal", "is_random", "resolve"]


class ReplayRefusal(Exception):
    """A call that cannot be replayed; the message says why (shown to the user as the verdict)."""


#: The namespaces callables are taken from: fixed here, never named by the dump.
_NAMESPACES: dict[str, ModuleType | type] = {
    "torch": torch,
    "functional": F,
    "tensor": torch.Tensor,
    "linalg": torch.linalg,
    "special": torch.special,
    "vf": torch._VF,  # type: ignore[attr-defined]
}

_ELEMENTWISE = (
    "abs acos acosh add addcdiv addcmul asin asinh atan atan2 atanh ceil clamp clamp_max clamp_min clip cos "
    "cosh deg2rad div divide erf erfc erfinv exp exp2 expm1 floor floor_divide fmod frac hypot lerp lgamma "
    "log log10 log1p log2 logaddexp logit maximum minimum mul multiply nan_to_num neg negative pow rad2deg "
    "reciprocal relu remainder round rsqrt sigmoid sign sin sinh sqrt square sub subtract tan tanh "
    "true_divide trunc where masked_fill selu celu threshold hardshrink xlogy sinc digamma polygamma"
).split()
_MATMUL = "matmul mm bmm addmm addbmm baddbmm addmv mv dot vdot inner einsum tensordot addr".split()
_REDUCTIONS = (
    "sum mean prod std var std_mean var_mean norm amax amin max min logsumexp cumsum cumprod logcumsumexp "
    "softmax log_softmax cosine_similarity dist cdist trace median nansum nanmean"
).split()
_SHAPES = (
    "cat concat concatenate stack chunk split unbind narrow select squeeze unsqueeze transpose permute "
    "reshape flatten t flip roll gather index_select diagonal diag tril triu movedim swapaxes clone "
    "take_along_dim"
).split()
_TORCH_NN = (
    "conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d layer_norm group_norm "
    "batch_norm instance_norm rms_norm embedding prelu"
).split()
_FUNCTIONAL = (
    "linear bilinear conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d layer_norm "
    "group_norm batch_norm instance_norm rms_norm local_response_norm normalize softmax log_softmax softmin "
    "softplus softsign gelu relu relu6 leaky_relu elu selu celu silu mish sigmoid tanh hardtanh hardswish "
    "hardsigmoid logsigmoid tanhshrink softshrink hardshrink threshold glu prelu embedding cross_entropy "
    "nll_loss mse_loss l1_loss smooth_l1_loss huber_loss binary_cross_entropy "
    "binary_cross_entropy_with_logits kl_div poisson_nll_loss gaussian_nll_loss cosine_similarity "
    "pairwise_distance scaled_dot_product_attention max_pool1d max_pool2d max_pool3d avg_pool1d avg_pool2d "
    "avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d "
    "adaptive_max_pool2d adaptive_max_pool3d lp_pool1d lp_pool2d pixel_shuffle pixel_unshuffle "
    "dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout rrelu"
).split()
_TENSOR_ONLY = (
    "__add__ __radd__ __iadd__ __sub__ __rsub__ __isub__ __mul__ __rmul__ __imul__ __truediv__ "
    "__rtruediv__ __itruediv__ __matmul__ __rmatmul__ __pow__ __rpow__ __neg__ __getitem__ "
    "add_ sub_ mul_ div_ addcmul_ addcdiv_ lerp_ clamp_ relu_ sigmoid_ tanh_ exp_ sqrt_ pow_ neg_ "
    "masked_fill_ contiguous view view_as float double half bfloat16 type_as softmax log_softmax"
).split()
_TORCH_RANDOM = (
    "dropout alpha_dropout feature_dropout feature_alpha_dropout rrelu"
).split()
_VF = "lstm gru rnn_tanh rnn_relu".split()

#: The allow-list: msprobe prefix -> API name -> (namespace, attribute). Built once from the lists above.
ALLOWED: Mapping[str, Mapping[str, tuple[str, str]]] = {
    "Torch": {
        **{n: ("torch", n) for n in (*_ELEMENTWISE, *_MATMUL, *_REDUCTIONS, *_SHAPES, *_TORCH_NN,
                                      *_TORCH_RANDOM)},  # fmt: skip
        # msprobe keeps the last path segment only: torch.linalg.vector_norm is Torch.vector_norm
        "vector_norm": ("linalg", "vector_norm"), "matrix_norm": ("linalg", "matrix_norm"),
        "log_ndtr": ("special", "log_ndtr"), "ndtr": ("special", "ndtr"),
    },
    "Functional": {n: ("functional", n) for n in _FUNCTIONAL},
    "Tensor": {n: ("tensor", n) for n in (*_ELEMENTWISE, *_MATMUL, *_REDUCTIONS, *_SHAPES, *_TENSOR_ONLY)},
    "VF": {n: ("vf", n) for n in _VF},
}
REPLAY_PREFIXES = frozenset(ALLOWED)

#: Calls whose output is random whatever their arguments.
_ALWAYS_RANDOM = frozenset((
    "bernoulli bernoulli_ rand randn randint randperm rand_like randn_like randint_like normal normal_ "
    "poisson multinomial uniform_ random_ exponential_ geometric_ cauchy_ log_normal_ native_dropout "
    "gumbel_softmax fractional_max_pool2d fractional_max_pool3d"
).split())


@dataclass(frozen=True, slots=True)
class _RandomWhen:
    """Where a call's randomness switch is: its probability argument and its training flag."""

    p_at: int | None
    p_name: str | None
    train_at: int | None
    train_name: str | None
    train_default: bool


_DROPOUT_TRAINING = _RandomWhen(1, "p", 2, "training", True)
_DROPOUT_EVAL = _RandomWhen(1, "p", 2, "training", False)
_TORCH_DROPOUT = _RandomWhen(1, "p", 2, "train", True)
_RANDOM_UNLESS_OFF: dict[tuple[str, str], _RandomWhen] = {
    ("Functional", "dropout"): _DROPOUT_TRAINING,
    ("Functional", "dropout1d"): _DROPOUT_TRAINING,
    ("Functional", "dropout2d"): _DROPOUT_TRAINING,
    ("Functional", "dropout3d"): _DROPOUT_TRAINING,
    ("Functional", "alpha_dropout"): _DROPOUT_EVAL,
    ("Functional", "feature_alpha_dropout"): _DROPOUT_EVAL,
    ("Functional", "rrelu"): _RandomWhen(None, None, 3, "training", False),
    ("Functional", "scaled_dot_product_attention"): _RandomWhen(4, "dropout_p", None, None, True),
    ("Torch", "dropout"): _TORCH_DROPOUT,
    ("Torch", "alpha_dropout"): _TORCH_DROPOUT,
    ("Torch", "feature_dropout"): _TORCH_DROPOUT,
    ("Torch", "feature_alpha_dropout"): _TORCH_DROPOUT,
    ("Torch", "rrelu"): _RandomWhen(None, None, 3, "training", False),
    **{("VF", n): _RandomWhen(5, "dropout", 6, "train", True) for n in _VF},
}


def _argument(args: Sequence[Any], kwargs: Mapping[str, Any], at: int | None, name: str | None,
              default: Any) -> Any:  # fmt: skip
    if name is not None and name in kwargs:
        return kwargs[name]
    if at is not None and at < len(args):
        return args[at]
    return default


def is_random(prefix: str, api: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    """Why the call's output is random (so no replay can reproduce it), or None when it is deterministic.

    Dropout-like calls are deterministic when their probability is 0 or they run outside training."""
    if api in _ALWAYS_RANDOM:
        return f"{prefix}.{api} draws random numbers"
    when = _RANDOM_UNLESS_OFF.get((prefix, api))
    if when is None:
        return None
    p = _argument(args, kwargs, when.p_at, when.p_name, 0.5) if when.p_name is not None else 1.0
    training = _argument(args, kwargs, when.train_at, when.train_name, when.train_default)
    if training is None:
        training = when.train_default
    if (isinstance(p, (int, float)) and p == 0) or training is False:
        return None
    return f"{prefix}.{api} draws random numbers (p={p}, training={training})"


def resolve(prefix: str, api: str) -> Callable[..., Any]:
    """The callable a recorded ``prefix.api`` names, from the allow-list only; raises :class:`ReplayRefusal`
    saying why otherwise (a custom op, or an API that is not on the list)."""
    table = ALLOWED.get(prefix)
    if table is None:
        raise ReplayRefusal(f"custom op: {prefix}.{api} is not a torch API (prefix {prefix!r}), no CPU "
                            "float64 reference exists for it")  # fmt: skip
    spot = table.get(api)
    if spot is None:
        raise ReplayRefusal(f"unknown API: {prefix}.{api} is not on the replay allow-list")
    namespace, attribute = spot
    func = getattr(_NAMESPACES[namespace], attribute, None)
    if func is None:  # an older torch without it
        raise ReplayRefusal(f"unknown API: this torch ({torch.__version__}) has no {prefix}.{api}")
    return func  # type: ignore[no-any-return]
