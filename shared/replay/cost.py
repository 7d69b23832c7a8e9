"""What a replay may cost, bounded before it runs: a rule per allowed API and per aten operation it reaches.

A dump is untrusted, and its recorded shapes and arguments choose how much work a replay does: one
``max_pool1d`` with a kernel of 2**19 over 2**20 elements (from a 2 KB file holding an expanded tensor) is
2**38 comparisons; an ``einsum`` over three tiny files builds a 3 GB intermediate; ``unbind`` of 2**20
elements makes a million tensors. So before a call runs, its replay is traced on the ``meta`` device (shapes
only, nothing allocated) under :class:`CostTrace`, which sees every aten operation the call decomposes into,
its intermediates included (an ``einsum``'s pairwise contractions, a ``matmul``'s broadcast copies), and
charges each by its rule:

* counted: matmul, convolution and attention, by torch's own FLOP formulas (``torch.utils.flop_counter``);
* windowed: pooling, the output's elements times the window's (adaptive pooling: its largest window);
* pairwise: ``cdist``, every pair of rows times the row length, whatever ``p``;
* spectral: the SVD behind nuclear and spectral norms, ``m n min(m, n)`` per matrix;
* trilinear: ``bilinear``'s product, the elements of its broadcast operands;
* sorting: median, sort, top-k, ``n log n``;
* linear: elementwise maths, reductions, norms, copies, indexing: the elements read and written;
* a view: nothing.

An aten operation with none of these is refused as "no cost bound", and so is an allowed API without an entry
in :data:`API_RULES` (which also checks, before anything is traced, what the trace itself would cost: the
tensors ``unbind``, ``split`` and ``chunk`` make). The call is refused ("over budget") when its operations
pass the cap, when any one intermediate passes the element cap, or when it makes too many tensors. A backward
is
traced the same way: the forward with autograd on, then the recorded node called with meta gradients.

The bound is what a correct CPU kernel does with those shapes; the replay's process has its own memory and
CPU caps besides (:mod:`parity.shared.replay.sandbox`), so a kernel that does more than its rule says is
stopped there and loses only its verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from parity.shared.replay.apis import ALLOWED, ReplayRefusal
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

__all__ = ["API_RULES", "MAX_OUTPUT_TENSORS", "CostTrace", "check_arguments", "check_gradients", "to_meta",
           "trace_backward", "trace_forward"]  # fmt: skip

#: Tensors one call may make: each is an object of about a kilobyte, whatever its size.
MAX_OUTPUT_TENSORS = 2**14

aten = torch.ops.aten


# ------------------------------------------------------------------------------------------------------
# aten operations: what each one costs, from its arguments' and results' shapes


def _numel(value: Any) -> int:
    return sum(int(t.numel()) for t in tree_leaves(value) if isinstance(t, torch.Tensor))


def _ints(value: Any, dims: int) -> list[int]:
    """A kernel-size argument as ``dims`` ints (an int stands for all, a list of one too)."""
    if isinstance(value, int):
        return [value] * dims
    values = [int(v) for v in value]
    return values * dims if len(values) == 1 else values


def _first(value: Any) -> torch.Tensor:
    return value[0] if isinstance(value, (tuple, list)) else value  # type: ignore[no-any-return]


def _pooling(kernel_at: int, out_of: Callable[[Any, Any], torch.Tensor] | None = None
             ) -> Rule:  # fmt: skip
    """Pooling: every output element looks at every element of its window."""

    def cost(args: Sequence[Any], kwargs: Mapping[str, Any], out: Any) -> float:
        result = out_of(args, out) if out_of is not None else _first(out)
        spatial = max(result.dim() - 2, 1)
        window = math.prod(_ints(kwargs.get("kernel_size", args[kernel_at]), spatial))
        return float(result.numel()) * window

    return cost


Rule = Callable[[Sequence[Any], Mapping[str, Any], Any], float]


def _adaptive(spatial: int, backward: bool = False) -> Rule:
    """Adaptive pooling: windows of at most ``ceil(in / out) + 1`` elements along each dimension (a
    backward: ``(grad_output, self, ...)``, windows of the grad_output over the input)."""

    def cost(args: Sequence[Any], kwargs: Mapping[str, Any], out: Any) -> float:
        source, result = (args[1], args[0]) if backward else (args[0], _first(out))
        ins, outs = source.shape[-spatial:], result.shape[-spatial:]
        window = math.prod(math.ceil(i / max(o, 1)) + 1 for i, o in zip(ins, outs, strict=True))
        return float(max(result.numel(), 1)) * window

    return cost


def _cdist(args: Sequence[Any], kwargs: Mapping[str, Any], out: Any) -> float:
    """``cdist``: every pair of rows, each over the row length (any ``p``)."""
    x1, x2 = (args[0], args[1]) if args[0].dim() >= 2 and args[1].dim() >= 2 else (args[1], args[2])
    batch = math.prod(torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2]))
    return 3.0 * batch * x1.shape[-2] * x2.shape[-2] * x1.shape[-1]


def _cdist_backward(args: Sequence[Any], kwargs: Mapping[str, Any], out: Any) -> float:
    return _cdist(args[1:3], kwargs, out)  # (grad, x1, x2, p, cdist)


def _svd(args: Sequence[Any], kwargs: Mapping[str, Any], out: Any) -> float:
    """An SVD (nuclear and spectral norms): ``m n min(m, n)`` per matrix, times the method's constant."""
    a = args[0]
    m, n = a.shape[-2], a.shape[-1]
    return 12.0 * math.prod(a.shape[:-2]) * m * n * min(m, n)


def _trilinear(args: Sequence[Any], kwargs: Mapping[str, Any], out: Any) -> float:
    """``bilinear``'s ``_trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim)``: the elements of the
    three operands broadcast together, once each."""
    shapes = []
    for tensor, expand in zip(args[:3], args[3:6], strict=True):
        shape = list(tensor.shape)
        for dim in sorted(expand):
            shape.insert(dim, 1)
        shapes.append(shape)
    return 2.0 * math.prod(torch.broadcast_shapes(*shapes))


def _sorting(args: Sequence[Any], kwargs: Mapping[str, Any], out: Any) -> float:
    n = max(int(args[0].numel()), 1)
    return float(n) * (math.log2(n) + 1)


def _packets(names: str) -> frozenset[Any]:
    return frozenset(getattr(aten, n) for n in names.split() if hasattr(aten, n))


_POOL_FORWARD = {
    getattr(aten, n): _pooling(1) for n in (
        "max_pool1d max_pool2d max_pool3d max_pool1d_with_indices max_pool2d_with_indices "
        "max_pool3d_with_indices avg_pool1d avg_pool2d avg_pool3d mkldnn_max_pool2d"
    ).split() if hasattr(aten, n)
}  # fmt: skip
_POOL_BACKWARD = {
    getattr(aten, n): _pooling(2, lambda args, _out: args[0]) for n in (
        "avg_pool2d_backward avg_pool3d_backward max_pool2d_with_indices_backward "
        "max_pool3d_with_indices_backward"
    ).split() if hasattr(aten, n)
}  # fmt: skip
#: aten operation packet -> its cost from ``(args, kwargs, out)``, beyond the elements it reads and writes.
ATEN_RULES: dict[Any, Rule] = {
    **_POOL_FORWARD,
    **_POOL_BACKWARD,
    **dict.fromkeys(_packets("adaptive_avg_pool1d adaptive_max_pool1d"), _adaptive(1)),
    **dict.fromkeys(_packets("_adaptive_avg_pool2d adaptive_max_pool2d"), _adaptive(2)),
    **dict.fromkeys(_packets("_adaptive_avg_pool3d adaptive_max_pool3d"), _adaptive(3)),
    **dict.fromkeys(_packets("_adaptive_avg_pool2d_backward adaptive_max_pool2d_backward"),
                    _adaptive(2, backward=True)),
    **dict.fromkeys(_packets("_adaptive_avg_pool3d_backward adaptive_max_pool3d_backward"),
                    _adaptive(3, backward=True)),
    **dict.fromkeys(_packets("_cdist_forward _euclidean_dist"), _cdist),
    **dict.fromkeys(_packets("_cdist_backward"), _cdist_backward),
    **dict.fromkeys(_packets("_linalg_svd linalg_svd svd"), _svd),
    **dict.fromkeys(_packets("_trilinear"), _trilinear),
    **dict.fromkeys(_packets("median nanmedian sort kthvalue topk msort"), _sorting),
}  # fmt: skip

#: aten operations whose work is the elements they read and write (besides pointwise ones and views).
LINEAR = _packets(
    # creation and copies
    "empty empty_like empty_strided zeros zeros_like ones ones_like full full_like fill fill_ zero_ "
    "new_empty new_empty_strided new_zeros new_ones new_full scalar_tensor lift_fresh lift_fresh_copy clone "
    "copy copy_ _to_copy to contiguous detach alias _unsafe_view resize_ set_ _copy_from "
    "_copy_from_and_resize "
    "constant_pad_nd pad reflection_pad1d reflection_pad2d replication_pad1d replication_pad2d "
    # shapes and indexing
    "cat stack hstack vstack split_with_sizes unsafe_split unsafe_split_with_sizes unsafe_chunk flip roll "
    "gather scatter scatter_add scatter_reduce index index_put index_put_ _index_put_impl_ index_select "
    "index_add index_copy index_fill masked_fill masked_scatter masked_select take_along_dim embedding "
    "embedding_dense_backward embedding_backward repeat tril triu tril_ triu_ diag diag_embed "
    "diagonal_backward select_backward slice_backward index_select_backward unfold_backward "
    "as_strided_scatter select_scatter slice_scatter diagonal_scatter narrow_copy trace trace_backward "
    "pixel_shuffle pixel_unshuffle where nonzero arange linspace expand_copy "
    # reductions
    "sum mean prod std var std_mean var_mean norm linalg_vector_norm amax amin max min aminmax argmax "
    "argmin logsumexp cumsum cumsum_ cumprod cumprod_backward _logcumsumexp logcumsumexp nansum nanmean "
    "all any count_nonzero dist _cummax_helper _cummin_helper cummax cummin mode sum_to_size "
    "_softmax _log_softmax _softmax_backward_data _log_softmax_backward_data _safe_softmax "
    # norms, losses, activations with their backward kernels
    "native_layer_norm native_layer_norm_backward native_batch_norm native_batch_norm_backward "
    "_native_batch_norm_legit _native_batch_norm_legit_no_training _native_batch_norm_legit_functional "
    "batch_norm_backward _batch_norm_with_update _batch_norm_no_update _batch_norm_impl_index "
    "_batch_norm_impl_index_backward native_group_norm native_group_norm_backward _fused_rms_norm "
    "_fused_rms_norm_backward nll_loss_forward nll_loss_backward nll_loss2d_forward nll_loss2d_backward "
    "mse_loss mse_loss_backward l1_loss smooth_l1_loss smooth_l1_loss_backward huber_loss "
    "huber_loss_backward binary_cross_entropy binary_cross_entropy_backward "
    "binary_cross_entropy_with_logits soft_margin_loss kl_div poisson_nll_loss "
    "gelu_backward silu_backward mish_backward hardswish_backward hardsigmoid_backward elu_backward "
    "leaky_relu_backward softplus_backward threshold_backward hardtanh_backward sigmoid_backward "
    "tanh_backward logit_backward log_sigmoid_forward log_sigmoid_backward glu glu_backward "
    "_prelu_kernel _prelu_kernel_backward prelu rrelu_with_noise rrelu_with_noise_backward "
    "softshrink_backward hardshrink_backward polar cosine_similarity "
    "_thnn_fused_lstm_cell _thnn_fused_lstm_cell_backward_impl _thnn_fused_gru_cell "
    "_thnn_fused_gru_cell_backward native_dropout native_dropout_backward dropout "
    "_pdist_forward _pdist_backward _local_scalar_dense item"
)


@dataclass(slots=True)
class _Costliest:
    op: str = ""
    operations: float = 0.0


class CostTrace(TorchDispatchMode):
    """Every aten operation a meta run dispatches, charged by its rule: ``operations`` in all, the
    ``largest`` intermediate (elements of one new tensor) and the operation that made it, and the first
    operation without a rule (``unbounded``)."""

    def __init__(self) -> None:
        super().__init__()
        self.operations = 0.0
        self.largest = 0
        self.largest_op = ""
        self.costliest = _Costliest()
        self.unbounded: str | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self._charge(func, args, kwargs, out)
        return out

    def _charge(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any], out: Any) -> None:
        returns = func._schema.returns
        if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            return  # a view: nothing is computed or allocated
        packet = func._overloadpacket
        fresh = [t for t, r in zip(_results(out), returns, strict=False)
                 if isinstance(t, torch.Tensor) and r.alias_info is None]  # fmt: skip
        for t in fresh:
            if t.numel() > self.largest:
                self.largest, self.largest_op = int(t.numel()), str(packet)
        work = float(_numel(args) + _numel(kwargs) + _numel(out))
        if packet in flop_registry:
            work += float(flop_registry[packet](*args, **kwargs, out_val=out))
        elif packet in ATEN_RULES:
            work += ATEN_RULES[packet](args, kwargs, out)
        elif packet not in LINEAR and torch.Tag.pointwise not in func.tags:
            if self.unbounded is None:
                self.unbounded = str(packet)
        self.operations += work
        if work > self.costliest.operations:
            self.costliest = _Costliest(str(packet), work)

    def check(self, max_elements: int, max_operations: float) -> None:
        """Refuse the traced call if it has an operation without a rule or passes a cap."""
        if self.unbounded is not None:
            raise ReplayRefusal(f"no cost bound: its replay runs {self.unbounded}, which has no cost rule")
        if self.largest > max_elements:
            raise ReplayRefusal(f"over budget: its replay would hold an intermediate of {self.largest} "
                                f"elements ({self.largest_op}), over the cap of {max_elements}")  # fmt: skip
        if self.operations > max_operations:
            raise ReplayRefusal(
                f"over budget: its replay would take {self.operations:.1e} operations "
                f"({self.costliest.op}: {self.costliest.operations:.1e}), over the cap of "
                f"{max_operations:.1e}"
            )


def _results(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


# ------------------------------------------------------------------------------------------------------
# allowed APIs: what is checked before the trace


def _dim(args: Sequence[Any], kwargs: Mapping[str, Any], at: int, default: int = 0) -> int:
    value = kwargs.get("dim", args[at] if len(args) > at else default)
    return int(value) if isinstance(value, int) else default


def _tensor_dim(tensor: Any, dim: int) -> int:
    if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
        return 1
    return int(tensor.shape[dim % tensor.dim()])


def _splits(args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    """The tensors ``split`` makes: one per section, or ``ceil(size / split_size)``."""
    sections = kwargs.get("split_size_or_sections", kwargs.get("split_size", args[1] if len(args) > 1 else 1))
    if isinstance(sections, (list, tuple)):
        return len(sections)
    size = _tensor_dim(args[0] if args else None, _dim(args, kwargs, 2))
    return math.ceil(size / sections) if isinstance(sections, int) and sections > 0 else 1


def _chunks(args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    chunks = kwargs.get("chunks", args[1] if len(args) > 1 else 1)
    return int(chunks) if isinstance(chunks, int) else 1


def _unbinds(args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    return _tensor_dim(args[0] if args else None, _dim(args, kwargs, 1))


_TRACED = None
#: Allowed API name -> how many tensors it makes, counted from its arguments before the trace (None: its
#: result's own, after it; its work is charged by the trace). Every allowed API has an entry; one without
#: is refused as "no cost bound".
API_RULES: Mapping[str, Callable[[Sequence[Any], Mapping[str, Any]], int] | None] = {
    **{name: _TRACED for table in ALLOWED.values() for name in table},
    "split": _splits,
    "chunk": _chunks,
    "unbind": _unbinds,
}


def check_arguments(api: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Before any trace: the API has a rule, and the tensors it would make are within the cap."""
    if api not in API_RULES:
        raise ReplayRefusal(f"no cost bound: {api} has no cost rule")
    count_of = API_RULES[api]
    count = count_of(args, kwargs) if count_of is not None else 1
    if count > MAX_OUTPUT_TENSORS:
        raise ReplayRefusal(f"over budget: its replay would make {count} tensors, over the cap of "
                            f"{MAX_OUTPUT_TENSORS}")  # fmt: skip


# ------------------------------------------------------------------------------------------------------
# the traces


def to_meta(value: Any, *, grad: bool = False) -> Any:
    """``value`` with every tensor replaced by an empty one of its shape and dtype on the meta device;
    ``grad``: floating tensors that require grad keep requiring it, as copies (the replay's own: in-place
    calls may alter them), for a backward's trace."""
    if isinstance(value, torch.Tensor):
        meta = torch.empty(value.shape, dtype=value.dtype, device="meta")
        if grad and value.requires_grad and value.is_floating_point():
            return meta.requires_grad_().clone()
        return meta
    if isinstance(value, list):
        return [to_meta(v, grad=grad) for v in value]
    if isinstance(value, tuple):
        return tuple(to_meta(v, grad=grad) for v in value)
    if isinstance(value, dict):
        return {k: to_meta(v, grad=grad) for k, v in value.items()}
    return value


def _unmasked(index: Any) -> Any:
    """An index with each boolean mask replaced by the indices of its true elements (``x[mask, i]`` is
    ``x[m0, m1, i]``): the same result, whose shape a meta tensor can know (the mask is real, at hand)."""
    if isinstance(index, torch.Tensor) and index.dtype == torch.bool and index.dim() > 0:
        return index.nonzero(as_tuple=True)
    if isinstance(index, tuple):
        out: list[Any] = []
        for part in index:
            unmasked = _unmasked(part)
            out.extend(unmasked) if isinstance(part, torch.Tensor) and isinstance(unmasked, tuple) else (
                out.append(unmasked))  # fmt: skip
        return tuple(out)
    return index


def _meta_arguments(api: str, args: list[Any], kwargs: dict[str, Any], *, grad: bool = False
                    ) -> tuple[list[Any], dict[str, Any]]:  # fmt: skip
    if api == "__getitem__" and len(args) > 1:
        args = [args[0], _unmasked(args[1]), *args[2:]]
    return to_meta(args, grad=grad), to_meta(kwargs, grad=grad)


def trace_forward(func: Callable[..., Any], api: str, args: list[Any], kwargs: dict[str, Any]
                  ) -> tuple[Any, CostTrace]:  # fmt: skip
    """The call run on meta tensors under a :class:`CostTrace`: its (meta) result and the trace."""
    check_arguments(api, args, kwargs)
    meta_args, meta_kwargs = _meta_arguments(api, args, kwargs)
    trace = CostTrace()
    with torch.no_grad(), trace:
        out = func(*meta_args, **meta_kwargs)
    return out, trace


def trace_backward(func: Callable[..., Any], api: str, args: list[Any], kwargs: dict[str, Any],
                   grads: Sequence[torch.Tensor | None]) -> CostTrace:  # fmt: skip
    """The forward with autograd on, then the autograd node of its first output called with meta gradients
    of the recorded shapes (checked against the outputs first), all under one :class:`CostTrace`: what a
    backward replay does."""
    meta_args, meta_kwargs = _meta_arguments(api, args, kwargs, grad=True)
    trace = CostTrace()
    try:
        with torch.enable_grad(), trace:
            outputs = _flat(func(*meta_args, **meta_kwargs), [])
            check_gradients(outputs, grads)
            anchor = next((t for t in outputs if t is not None and t.grad_fn is not None), None)
            if anchor is not None:
                node: Any = anchor.grad_fn  # an autograd Node: calling it runs its backward function
                node(*[to_meta(g) for g in grads])
    except ReplayRefusal:
        raise
    except Exception as exc:  # noqa: BLE001 - no meta kernel for its backward, or gradients it refuses
        message = " ".join(str(exc).split())[:200]
        raise ReplayRefusal(f"the cost of its backward cannot be bounded beforehand ({type(exc).__name__}: "
                            f"{message})") from None  # fmt: skip
    return trace


def _flat(value: Any, out: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """A result flattened as dump.json records it: tensors in order, None for anything else."""
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _flat(v, out)
    else:
        out.append(None)
    return out


def check_gradients(outputs: Sequence[torch.Tensor | None], grads: Sequence[torch.Tensor | None]) -> None:
    """The recorded gradients of a call's outputs fit them (same shape, floating), or the replay is refused
    before autograd's node sees them: a node called directly skips autograd's own checks, and native
    kernels (layer norm, batch norm, cdist) read past an empty gradient and crash the process."""
    for i, grad in enumerate(grads):
        if grad is None:
            continue
        output = outputs[i] if i < len(outputs) else None
        if output is None:
            raise ReplayRefusal(f"backward input {i}: a gradient is recorded for an output the call does not "
                                "make as a tensor")  # fmt: skip
        if not grad.is_floating_point():
            raise ReplayRefusal(f"backward input {i}: the recorded gradient is {grad.dtype}, not floating")
        if tuple(grad.shape) != tuple(output.shape):
            raise ReplayRefusal(f"backward input {i}: the recorded gradient has shape {list(grad.shape)}, "
                                f"the call's output {i} has {list(output.shape)}: not handed to the "
                                "kernel")  # fmt: skip
