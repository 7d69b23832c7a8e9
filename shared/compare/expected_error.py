"""The rounding a correct kernel may add to one call: its dtype's unit roundoff times the length of its
reductions, read from the shapes and arguments the dump recorded.

Two devices (or two libraries on one device) compute the same reduction in another order or precision: a
sum of K terms rounds differently by about ``u * sqrt(K)`` of its size (``u`` the unit roundoff of the call's
least precise floating dtype; random-walk growth, the rounding errors of a sum having random signs). An
elementwise op rounds once: ``u`` (two correct kernels agree to an ulp, most often exactly). So a reduction's
expected error from rounding alone is

    ``u * (1 + ROUNDING_SCALE * sqrt(K))``

where K is, per API (forward; a backward reduces over the other axes of the same products too, so it takes
the largest of them):

* matmul, mm, bmm, linear: the inner dimension (backward: also the rows and the output features);
* conv: ``C_in / groups * kh * kw`` (backward: also ``C_out * kh * kw`` and ``N * H_out * W_out``);
* layer_norm, rms_norm: the normalized size; batch_norm: ``numel / C``; group_norm: ``numel / (N * groups)``;
* softmax, log_softmax: the size of ``dim``; sum, mean, var, std, norm, logsumexp: the reduced elements;
* scaled_dot_product_attention: the head dimension and the key sequence (backward: the query sequence too);
* cross_entropy, nll_loss: the classes and the batch the loss averages;
* lstm, gru: input plus hidden size, times the sequence the recurrence runs over;
* embedding's backward: the indices (repeated tokens' gradients are summed); pooling: the window.

Localization adds this to what a call's inputs carry (``localization.py``), with a background per API class
learned from the pair (a device whose every matmul-class call differs by ~1e-3 is one systematic finding).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from parity.shared.compare.facts import unit_roundoff
from parity.shared.dump.naming import parse_entry

__all__ = [
    "API_CLASSES",
    "ROUNDING_SCALE",
    "Recorded",
    "api_class",
    "expected_rounding",
    "REPLAY_SAFETY",
    "op_of",
    "reduction_length",
    "replay_allowance",
    "rounding_bound",
    "unit_roundoff",
]

#: Allowance over ``u * (1 + sqrt(K))``: the difference of two correct kernels (both round) with moderate
#: conditioning (normalization and softmax amplify a relative error a few times).
ROUNDING_SCALE = 4.0
#: The float64 replay (``parity.shared.replay``) judges one kernel against the exact result with this model
#: times REPLAY_SAFETY: a few ulps of transcendental functions, another accumulation order (a GPU's tree or
#: split-K) and the error of the distance itself. 8 keeps the replay's earlier allowance for long
#: reductions (16 sqrt(K) eps = 32 sqrt(K) u), under which the replay tests' correct calls sit 10x inside.
REPLAY_SAFETY = 8.0

#: The API class of each reduction op (a background is learned per class: a device whose matmuls run in
#: TF32 differs in every matmul-class call, and only in those). Everything else is ``elementwise``.
API_CLASSES: dict[str, str] = {
    **dict.fromkeys(("linear", "matmul", "mm", "bmm", "addmm", "addmv", "mv", "baddbmm", "addbmm", "einsum",
                     "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                     "conv_transpose3d", "scaled_dot_product_attention", "lstm", "gru", "rnn_tanh",
                     "rnn_relu", "bilinear", "dot", "inner", "tensordot"), "matmul"),
    **dict.fromkeys(("layer_norm", "batch_norm", "group_norm", "instance_norm", "rms_norm",
                     "local_response_norm", "normalize"), "norm"),
    **dict.fromkeys(("softmax", "log_softmax", "softmin", "logsumexp"), "softmax"),
    **dict.fromkeys(("sum", "mean", "var", "std", "norm", "nansum", "nanmean", "cumsum", "prod",
                     "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
                     "adaptive_avg_pool3d", "embedding", "embedding_bag"), "reduce"),
    **dict.fromkeys(("cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "kl_div",
                     "binary_cross_entropy", "binary_cross_entropy_with_logits", "huber_loss"), "loss"),
}  # fmt: skip
#: Module classes (``Module.fc.Linear.forward.0``) that are one API of the table above.
_MODULE_OPS = {
    "Linear": "linear", "Conv1d": "conv1d", "Conv2d": "conv2d", "Conv3d": "conv3d", "LayerNorm": "layer_norm",
    "BatchNorm1d": "batch_norm", "BatchNorm2d": "batch_norm", "BatchNorm3d": "batch_norm",
    "GroupNorm": "group_norm", "RMSNorm": "rms_norm", "Softmax": "softmax", "LogSoftmax": "log_softmax",
    "LSTM": "lstm", "GRU": "gru", "Embedding": "embedding", "CrossEntropyLoss": "cross_entropy",
}  # fmt: skip
_COUNT = re.compile(r"^\d+$")


def op_of(api: str) -> str:
    """The op an entry calls: ``Functional.linear.0.forward`` → ``linear``, ``Tensor.__matmul__.1.forward`` →
    ``matmul``, ``Module.fc.Linear.forward.0`` → ``linear`` (a module of another class: its class name)."""
    parsed = parse_entry(api)
    if parsed is None:
        return api
    return _MODULE_OPS.get(parsed.op, parsed.op) if parsed.kind != "api" else parsed.op


def api_class(op: str) -> str:
    """The class of ``op`` (``matmul``, ``norm``, ``softmax``, ``reduce``, ``loss``; else ``elementwise``)."""
    return API_CLASSES.get(op, "elementwise")


@dataclass(frozen=True, slots=True)
class Recorded:
    """One recorded argument or output of a call: its shape (None: not a tensor) and, for a scalar argument,
    its value (``normalized_shape``'s 64, ``dim``'s -1)."""

    shape: tuple[int, ...] | None
    value: float | None = None


def _shape(args: Mapping[str, Recorded], *keys: str) -> tuple[int, ...] | None:
    for key in keys:
        found = args.get(key)
        if found is not None and found.shape is not None:
            return found.shape
    return None


def _ints(args: Mapping[str, Recorded], *keys: str) -> list[int]:
    """A scalar or list argument's integer values, under the first of ``keys`` recorded (``input.1``,
    its elements ``input.1.0``, ``input.1.1``, ..., or ``input.dim``)."""
    for key in keys:
        found = args.get(key)
        if found is not None and found.value is not None and found.shape in (None, ()):
            return [int(found.value)]
        elements = [args[k] for k in sorted((k for k in args if k.startswith(key + ".")), key=_index)]
        values = [int(e.value) for e in elements if e.value is not None and e.shape in (None, ())]
        if values:
            return values
    return []


def _index(key: str) -> int:
    last = key.rsplit(".", 1)[-1]
    return int(last) if _COUNT.match(last) else 0


def _prod(dims: Sequence[int]) -> int:
    return math.prod(dims) if dims else 1


def _axis(shape: tuple[int, ...], dim: int) -> int:
    return shape[dim] if -len(shape) <= dim < len(shape) else 1


def reduction_length(op: str, direction: str | None, args: Mapping[str, Recorded]) -> int:
    """The length of the longest sum the call computes (1 for an elementwise op), from its forward's recorded
    arguments and outputs, keyed as the dump names their rows (``input.0``, a list's ``input.1.0``, a keyword
    argument's ``input.dim``, ``output.0``; see the module docstring for each API's rule). An argument the
    dump lacks counts as 1."""
    backward = direction == "backward"
    x = _shape(args, "input.0", "input.input") or ()
    out = _shape(args, "output.0") or ()
    numel = _prod(x)
    lengths = [1]
    if op in ("linear", "bilinear"):
        w = _shape(args, "input.1", "input.weight") or ()
        lengths.append(x[-1] if x else 1)
        if backward:
            lengths += [w[0] if w else 1, _prod(x[:-1])]
    elif op in ("matmul", "mm", "bmm", "mv", "dot", "inner", "addmm", "baddbmm", "addbmm", "addmv"):
        first = "input.1" if op.startswith("add") or op == "baddbmm" else "input.0"
        a = _shape(args, first) or ()
        b = _shape(args, "input.2" if first == "input.1" else "input.1") or ()
        lengths.append(a[-1] if a else 1)
        if backward:
            lengths += [b[-1] if len(b) > 1 else 1, _prod(a[:-1])]
    elif op.startswith("conv"):
        w = _shape(args, "input.1", "input.weight") or ()
        lengths.append(_prod(w[1:]))
        if backward:
            lengths += [w[0] * _prod(w[2:]) if w else 1, (out[0] * _prod(out[2:])) if out else 1]
    elif op in ("layer_norm", "rms_norm"):
        size = _prod(_ints(args, "input.1", "input.normalized_shape")) or (x[-1] if x else 1)
        lengths.append(size)
        if backward:
            lengths.append(max(1, numel // max(1, size)))
    elif op in ("batch_norm", "instance_norm"):
        channels = x[1] if len(x) > 1 else 1
        lengths.append(max(1, numel // max(1, channels * (x[0] if op == "instance_norm" else 1))))
    elif op == "group_norm":
        groups = (_ints(args, "input.1", "input.num_groups") or [1])[0]
        lengths.append(max(1, numel // max(1, (x[0] if x else 1) * groups)))
    elif op in ("softmax", "log_softmax", "softmin", "logsumexp"):
        dims = _ints(args, "input.1", "input.dim")
        lengths.append(_axis(x, dims[0]) if dims and x else (x[-1] if x else 1))
    elif op in ("sum", "mean", "var", "std", "norm", "nansum", "nanmean", "prod", "cumsum"):
        dims = _ints(args, "input.1", "input.dim")
        lengths.append(_prod([_axis(x, d) for d in dims]) if dims and x else numel)
    elif op == "scaled_dot_product_attention":
        q, k = _shape(args, "input.0", "input.query") or (), _shape(args, "input.1", "input.key") or ()
        lengths += [q[-1] if q else 1, k[-2] if len(k) > 1 else 1]
        if backward:
            lengths.append(q[-2] if len(q) > 1 else 1)
    elif op in ("cross_entropy", "nll_loss"):
        classes = x[1] if len(x) > 1 else (x[0] if x else 1)
        lengths += [classes, max(1, numel // max(1, classes))]
    elif op in ("lstm", "gru", "rnn_tanh", "rnn_relu"):
        h = _shape(args, "input.1.0", "input.1") or ()
        hidden = h[-1] if h else 1
        steps = max(x[:-1]) if len(x) > 1 else 1
        lengths.append(((x[-1] if x else 1) + hidden) * steps)
    elif "pool" in op and out:
        lengths.append(max(1, numel // max(1, _prod(out))))
    elif op in ("embedding", "embedding_bag"):  # a gather; its backward sums repeated indices' gradients
        lengths.append(numel if backward else 1)
    elif op in API_CLASSES:  # a loss or reduction without its own rule: everything it reads
        lengths.append(numel)
    return max(lengths)


def rounding_bound(unit: float, k: int) -> float:
    """The model: the normwise relative error rounding in a dtype of unit roundoff ``unit`` adds to a
    reduction of ``k`` terms, ``u * (1 + ROUNDING_SCALE * sqrt(K))``; ``u`` for an elementwise op (k <= 1)."""
    return unit if k <= 1 else unit * (1.0 + ROUNDING_SCALE * math.sqrt(k))


def replay_allowance(unit: float, k: int) -> float:
    """How far a correct kernel's output may sit from its float64 replay: the same model, for a reduction of
    at least one term, times REPLAY_SAFETY."""
    return REPLAY_SAFETY * rounding_bound(unit, max(k, 2)) if unit else 0.0


def expected_rounding(op: str, direction: str | None, args: Mapping[str, Recorded], unit: float) -> float:
    """The normwise relative error a correct kernel may add to the call, whose least precise floating dtype
    has unit roundoff ``unit`` (0: no floating data, nothing to round): ``unit`` for an elementwise op."""
    return rounding_bound(unit, reduction_length(op, direction, args))
