"""How a torch callable seen by the function mode becomes an msprobe API name (dump-format.md §5).

No API list: every callable torch hands to ``__torch_function__`` is named from ``resolve_name`` and its
namespace decides the prefix (``torch.nn.functional.*`` -> ``Functional``, ``torch.Tensor.*`` -> ``Tensor``,
other ``torch.*`` -> ``Torch`` with the last path segment, ``torch.distributed.*`` -> ``Distributed``).
A small ignore set drops calls that compute nothing (metadata getters, printing, conversions to Python).

Python operators reach the mode as the method they map to (``x + y`` arrives as ``Tensor.add``); msprobe
names them by their dunder (``Tensor.__add__``), so for those few methods the calling instruction is read
(``BINARY_OP`` / ``COMPARE_OP`` / ``UNARY_*``) to recover the operator: the same code gives the same name.
"""

from __future__ import annotations

import dis
import sys
from types import CodeType, FrameType

__all__ = ["IGNORED", "UNINITIALISED", "api_name", "operator_dunder"]

#: Calls that compute nothing worth comparing: metadata, printing, hooks, conversions to Python values.
#: Property getters/setters (``x.shape``, ``x.grad``) are dropped by their ``__get__``/``__set__`` suffix.
IGNORED = frozenset({
    "size", "dim", "numel", "nelement", "ndimension", "stride", "storage_offset", "is_contiguous",
    "is_floating_point", "is_complex", "is_signed", "is_nonzero", "data_ptr", "element_size", "get_device",
    "untyped_storage", "storage", "_typed_storage", "dim_order", "has_names", "is_shared", "is_pinned",
    "_is_view", "__repr__", "__str__", "__format__", "__len__", "__hash__", "__bool__", "__index__",
    "__int__", "__float__", "__complex__", "__array__", "__array_wrap__", "__reduce_ex__", "__deepcopy__",
    "__setstate__", "__getstate__", "__iter__", "__dir__", "__torch_function__", "item", "tolist", "numpy",
    "backward", "grad", "register_hook", "register_post_accumulate_grad_hook", "retain_grad",
    "requires_grad_", "_backward_hooks", "is_tensor",
    # grad-mode switches (``torch.no_grad()`` blocks, the optimizer's ``step``) change no value
    "_set_grad_enabled", "set_grad_enabled", "is_grad_enabled", "is_inference_mode_enabled",
    # a device object (checkpoint and fork_rng make them): no tensor, no value
    "device",
})  # fmt: skip

#: APIs whose output is allocated, never written: their values are whatever the allocator left there, so the
#: leaf keeps dtype and shape and no statistics (two identical runs would otherwise differ on every one).
UNINITIALISED = frozenset({"Torch.empty", "Torch.empty_like", "Torch.empty_strided", "Tensor.new_empty",
                           "Tensor.new_empty_strided"})  # fmt: skip

#: Profiler bookkeeping (``record_function`` ranges that optimizers and modules open): markers, not maths.
_IGNORED_NAMESPACES = ("profiler.", "torch.autograd.profiler.", "torch.profiler.", "torch.ops.profiler.")

#: msprobe keeps a separate ``VF`` namespace for the RNN kernels nn.LSTM calls through ``torch._VF``.
_VF_APIS = frozenset({"lstm", "gru", "rnn_tanh", "rnn_relu"})

# The Tensor method torch dispatches for each operator, and msprobe's dunder name for it.
_BINARY = {
    "NB_ADD": ("add", "__add__"), "NB_SUBTRACT": ("sub", "__sub__"), "NB_MULTIPLY": ("mul", "__mul__"),
    "NB_MATRIX_MULTIPLY": ("matmul", "__matmul__"), "NB_TRUE_DIVIDE": ("div", "__truediv__"),
    "NB_FLOOR_DIVIDE": ("floor_divide", "__floordiv__"), "NB_REMAINDER": ("remainder", "__mod__"),
    "NB_POWER": ("pow", "__pow__"), "NB_AND": ("bitwise_and", "__and__"), "NB_OR": ("bitwise_or", "__or__"),
    "NB_XOR": ("bitwise_xor", "__xor__"), "NB_LSHIFT": ("bitwise_left_shift", "__lshift__"),
    "NB_RSHIFT": ("bitwise_right_shift", "__rshift__"),
    "NB_INPLACE_ADD": ("add_", "__iadd__"), "NB_INPLACE_SUBTRACT": ("sub_", "__isub__"),
    "NB_INPLACE_MULTIPLY": ("mul_", "__imul__"), "NB_INPLACE_TRUE_DIVIDE": ("div_", "__itruediv__"),
}  # fmt: skip
_COMPARE = {"<": ("lt", "__lt__"), "<=": ("le", "__le__"), ">": ("gt", "__gt__"), ">=": ("ge", "__ge__"),
            "!=": ("ne", "__ne__")}  # fmt: skip
_UNARY = {"UNARY_NEGATIVE": ("neg", "__neg__"), "UNARY_INVERT": ("bitwise_not", "__invert__")}

_NB_NAMES = [name for name, _sym in getattr(dis, "_nb_ops", [])]
_OP_BINARY = dis.opmap.get("BINARY_OP", -1)
_OP_COMPARE = dis.opmap.get("COMPARE_OP", -1)
_UNARY_OPS = {dis.opmap[name]: pair for name, pair in _UNARY.items() if name in dis.opmap}
_CMP_SHIFT = 0 if sys.version_info < (3, 12) else (4 if sys.version_info < (3, 13) else 5)
#: The method names that can be an operator in disguise; only for these is the caller's bytecode read.
OPERATOR_METHODS = frozenset(
    [m for m, _ in _BINARY.values()] + [m for m, _ in _COMPARE.values()] + [m for m, _ in _UNARY.values()]
)
# id(code) -> (the code, held so its id stays unique; its bytecode): a code object's own hash is recomputed
# from its fields at every lookup
_code_bytes: dict[int, tuple[CodeType, bytes]] = {}
# (id(code), offset, method) -> the answer: an operator call site always runs the same instruction. Keyed by
# id, valid while _code_bytes holds the code; both start over past _MAX_SITES.
_answers: dict[tuple[int, int, str], str | None] = {}
_MAX_SITES = 20000
_UNKNOWN = object()


def operator_dunder(method: str, frame: FrameType | None) -> str | None:
    """The dunder name when ``frame`` is executing a Python operator that dispatched ``method``, else None."""
    if frame is None or sys.version_info < (3, 11):
        return None
    code = frame.f_code
    i = frame.f_lasti
    site = (id(code), i, method)
    answer = _answers.get(site, _UNKNOWN)
    if answer is not _UNKNOWN:
        return answer  # type: ignore[return-value]
    known = _code_bytes.get(id(code))
    if known is None:
        if len(_code_bytes) >= _MAX_SITES or len(_answers) >= _MAX_SITES:
            _code_bytes.clear()
            _answers.clear()
        known = _code_bytes[id(code)] = (code, code.co_code)
    answer = _answers[site] = _dunder_at(known[1], i, method)
    return answer


def _dunder_at(raw: bytes, i: int, method: str) -> str | None:
    """The dunder name of the operator instruction at offset ``i`` of ``raw`` if it dispatched ``method``."""
    if i < 0 or i + 1 >= len(raw):
        return None
    op, arg = raw[i], raw[i + 1]
    pair: tuple[str, str] | None = None
    if op == _OP_BINARY and arg < len(_NB_NAMES):
        pair = _BINARY.get(_NB_NAMES[arg])
    elif op == _OP_COMPARE:
        idx = arg >> _CMP_SHIFT
        pair = _COMPARE.get(dis.cmp_op[idx]) if idx < len(dis.cmp_op) else None
    else:
        pair = _UNARY_OPS.get(op)
    return pair[1] if pair is not None and pair[0] == method else None


def api_name(resolved: str | None, func: object) -> tuple[str, str] | None:
    """``(prefix, api)`` for a callable, or None when it is in the ignore set.

    ``resolved`` is ``torch.overrides.resolve_name(func)``; when torch cannot name the callable (a user
    function that implements the protocol itself), its module and ``__qualname__`` are used.
    """
    if resolved is None:
        qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
        if qual is None:
            return None
        module = getattr(func, "__module__", None) or "Torch"
        resolved = f"{module}.{qual}"
    if resolved.endswith(("__get__", "__set__", "__delete__")) or resolved.startswith(_IGNORED_NAMESPACES):
        return None
    if resolved.startswith("torch.Tensor."):
        prefix, api = "Tensor", resolved[len("torch.Tensor.") :]
    elif resolved.startswith("torch.nn.functional."):
        prefix, api = "Functional", resolved.rsplit(".", 1)[-1]
    elif resolved.startswith("torch.distributed."):
        prefix, api = "Distributed", resolved.rsplit(".", 1)[-1]
    elif resolved.startswith("torch."):
        prefix, api = "Torch", resolved.rsplit(".", 1)[-1]
        if api in _VF_APIS:
            prefix = "VF"
    else:
        head, _, api = resolved.rpartition(".")
        prefix = head or "Torch"
    if api in IGNORED:
        return None
    return prefix, api
