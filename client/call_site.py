"""How the caller spelled a call: positional or keyword, and which arguments it passed at all.

msprobe wraps each API, so its dump holds the arguments exactly as the caller wrote them. A
``TorchFunctionMode`` sees Python-level torch functions (``F.layer_norm``, ``F.dropout``, ``F.cross_entropy``,
``Tensor.split``, ...) only through their own ``handle_torch_function(...)`` call, which re-spells every
argument as the function's author chose: ``F.layer_norm(x, (16,), w, b, 1e-5)`` arrives as
``(x, (16,)), {weight, bias, eps}`` and ``F.cross_entropy(x, y)`` arrives with six defaults the caller never
passed. So for those functions the layout is read from the caller's own call instruction (how many
positional arguments, which keyword names) and the values from the function's parameters. Anything else
(C functions, ``f(*args, **kw)`` call sites, a call from C) keeps the layout the mode received.

The bytecode of one call site is decoded once and cached by (code object, instruction offset).
Limit: a call site does not say whether a Python Tensor method got ``self`` implicitly, so the method form
(``x.split(2)``) is assumed; the rare unbound form ``torch.Tensor.split(x, 2)`` then shows one trailing
positional default (``dim``) the caller did not pass.
"""

from __future__ import annotations

import dis
import inspect
from types import CodeType, FrameType
from typing import Any

from torch import overrides

__all__ = ["CallSpelling", "as_called"]

#: ``(positional arguments, keyword names)`` the caller's call instruction passed, not counting an implicit
#: ``self``; None where the call site does not say (``f(*a, **k)``, an operator, a call from C).
CallSpelling = tuple[int, tuple[str, ...]]

_HANDLE_CODE = overrides.handle_torch_function.__code__
_CALLS = {"CALL", "CALL_FUNCTION", "CALL_METHOD", "CALL_KW", "CALL_FUNCTION_KW"}
_NO_DEFAULT = inspect.Parameter.empty
# (id(code), offset) -> the spelling, and the code held so its id stays unique (a code object's own hash is
# recomputed from its fields at every lookup)
_site_cache: dict[tuple[int, int], tuple[CodeType, CallSpelling | None]] = {}
_code_cache: dict[CodeType, list[dis.Instruction]] = {}  # decoded once per function, not once per site
# per function: its parameters as (name, kind, default), or None when it has no usable signature
_params_cache: dict[Any, tuple[tuple[str, Any, Any], ...] | None] = {}


def _spelling(code: CodeType, lasti: int) -> CallSpelling | None:
    """Decode the call instruction at (or, on 3.11+, whose inline caches end at) ``lasti``."""
    decoded = _code_cache.get(code)
    if decoded is None:
        decoded = _code_cache[code] = list(dis.get_instructions(code))
    instrs = [i for i in decoded if i.offset <= lasti][-3:]
    if not instrs or instrs[-1].opname not in _CALLS:
        return None
    call = instrs[-1]
    argc = int(call.arg or 0)
    names: tuple[str, ...] = ()
    before = instrs[:-1]
    if call.opname in ("CALL_KW", "CALL_FUNCTION_KW"):  # 3.13 / 3.10: names tuple pushed as a constant
        if not before or not isinstance(before[-1].argval, tuple):
            return None
        names = tuple(before[-1].argval)
    else:  # 3.11 (KW_NAMES, PRECALL, CALL) and 3.12 (KW_NAMES, CALL)
        for ins in reversed(before):
            if ins.opname == "KW_NAMES":
                names = tuple(code.co_consts[int(ins.arg or 0)])
                break
            if ins.opname != "PRECALL":
                break
    return argc - len(names), names


def _forwards_all(code: CodeType) -> bool:
    """``def f(*args, **kwargs)`` and nothing else in its signature."""
    both = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS
    return code.co_argcount == 0 and code.co_kwonlyargcount == 0 and code.co_flags & both == both


def _params(func: Any) -> tuple[tuple[str, Any, Any], ...] | None:
    try:
        return _params_cache[func]
    except KeyError:
        pass
    except TypeError:  # unhashable callable
        return None
    try:
        sig = inspect.signature(func)
        params: tuple[tuple[str, Any, Any], ...] | None = tuple(
            (p.name, p.kind, p.default) for p in sig.parameters.values()
        )
    except (TypeError, ValueError):
        params = None
    _params_cache[func] = params
    return params


def _is_tensor_method(func: Any) -> bool:
    qual = getattr(func, "__qualname__", "")
    return qual.startswith(("Tensor.", "_TensorBase.", "TensorBase."))


def _respell(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], spelling: CallSpelling
             ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:  # fmt: skip
    params = _params(func)
    if params is None:
        return None
    positional, names = spelling
    var_pos = any(kind is inspect.Parameter.VAR_POSITIONAL for _, kind, _ in params)
    named_pos = [p for p in params if p[1] in (inspect.Parameter.POSITIONAL_ONLY,
                                               inspect.Parameter.POSITIONAL_OR_KEYWORD)]  # fmt: skip
    if _is_tensor_method(func) and (var_pos or positional + 1 <= len(named_pos)):
        positional += 1  # ``x.split(2)``: the call site does not count ``self``
    # the values the function received, by parameter name (its own re-spelled call)
    values: dict[str, Any] = {}
    extra: list[Any] = []
    for i, value in enumerate(args):
        if i < len(named_pos):
            values[named_pos[i][0]] = value
        else:
            extra.append(value)
    values.update(kwargs)
    out_args: list[Any] = []
    for name, _, default in named_pos[:positional]:
        value = values.get(name, default)
        if value is _NO_DEFAULT:
            return None  # the function's own call does not carry what the caller passed: keep it
        out_args.append(value)
    if positional > len(named_pos):
        if not var_pos:
            return None
        out_args.extend(extra[: positional - len(named_pos)])
    out_kwargs: dict[str, Any] = {}
    for name in names:
        if name in values:
            out_kwargs[name] = values[name]
        else:
            default = next((d for n, _, d in params if n == name), _NO_DEFAULT)
            if default is _NO_DEFAULT:
                return None
            out_kwargs[name] = default
    return tuple(out_args), out_kwargs


def as_called(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], frame: FrameType
              ) -> tuple[tuple[Any, ...], dict[str, Any], FrameType]:  # fmt: skip
    """The arguments as the caller passed them, and the caller's frame (where its stack starts).

    ``frame`` is the frame that entered the mode. Only a Python torch function's own
    ``handle_torch_function`` call is re-spelled; every other call comes back unchanged."""
    if frame.f_code is not _HANDLE_CODE:
        return args, kwargs, frame
    fn_frame = frame.f_back
    code = getattr(func, "__code__", None)
    if fn_frame is None or code is None:
        return args, kwargs, frame
    if fn_frame.f_code is not code:
        dispatcher = fn_frame.f_back
        if dispatcher is not None and dispatcher.f_code is code and _forwards_all(code):
            # ``func`` is a ``def f(*args, **kwargs)`` dispatcher (F.max_pool2d's ``boolean_dispatch``) that
            # called the implementation which handed ``func`` to the mode: its own locals are the call as
            # the caller wrote it
            local = dispatcher.f_locals
            names = code.co_varnames
            return tuple(local[names[0]]), dict(local[names[1]]), dispatcher.f_back or dispatcher
        return args, kwargs, frame
    caller = fn_frame.f_back
    if caller is None:
        return args, kwargs, fn_frame
    ccode = caller.f_code
    key = (id(ccode), caller.f_lasti)
    try:
        spelling = _site_cache[key][1]
    except KeyError:
        spelling = _spelling(ccode, caller.f_lasti)
        _site_cache[key] = (ccode, spelling)
    if spelling is None:
        return args, kwargs, caller
    respelled = _respell(func, args, kwargs, spelling)
    if respelled is None:
        return args, kwargs, caller
    return respelled[0], respelled[1], caller
