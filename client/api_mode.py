"""API-level capture (L1, mix): one ``TorchFunctionMode`` sees every ``torch.*``, ``torch.nn.functional.*``
and Tensor method call, with no API list and no monkeypatching.

While ``__torch_function__`` runs, torch pops the mode, so the calls an API makes internally (and the
tool's own statistics) are not seen: only outermost calls are recorded, as msprobe's depth guard does.

torch.compile: ops run by a compiled graph are not captured. Dynamo traces ``__torch_function__`` with
``is_compiling()`` true; AOT autograd and inductor compile with their own code (its calls are not
recorded, see ``_FRAMEWORK_FILES``), and at run time the graph's ops come from generated code
(``<eval_with_key>``, inductor's output): each such graph call becomes one marker entry
``Torch.compiled_region.{n}.forward`` and a warning is logged once.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

import torch
from parity.client.call_site import as_called
from parity.client.naming_rules import OPERATOR_METHODS, api_name, operator_dunder
from parity.client.recorder import Recorder
from torch.overrides import TorchFunctionMode, resolve_name

__all__ = ["COMPILED_MARKER", "ApiMode", "BackwardCapture", "ReflectedOperators"]

log = logging.getLogger(__name__)

COMPILED_MARKER = "Torch.compiled_region"
#: A compiled graph's own code, run at each call (an FX graph module's ``forward``, inductor's output): one
#: marker per call of such a frame
_COMPILED_FILES = ("<eval_with_key>", "torchinductor")
_TORCH = torch.__path__[0]
#: Code whose tensor calls are plumbing, not the model's computation, recorded by nobody:
#: - the parallel frameworks' own: FSDP's gathers, copies and buffers around each unit, DTensor's
#:   redistributions (their collectives are recorded as ``Distributed.*`` by their own wrappers): recorded,
#:   they would be calls one layout makes and another does not, and their buffers hold uninitialised values;
#: - torch.compile's machinery: dynamo, AOT autograd and inductor tracing and compiling a graph (on fake
#:   tensors, or ``aten.*`` overloads with uninitialised ``out=`` buffers) and their runtime wrappers,
#:   FX's interpreter, decompositions, fake and meta tensors;
#: - the activation checkpoint's detaches and devices around a recompute.
_FRAMEWORK_FILES = (
    *(f"{_TORCH}/distributed/{d}/" for d in ("fsdp", "_composable", "tensor")),
    *(f"{_TORCH}/{d}/" for d in ("_dynamo", "_inductor", "_functorch", "fx", "_subclasses", "_decomp",
                                  "_refs", "_prims", "_prims_common", "_higher_order_ops", "_library",
                                  "_export", "export", "utils/_sympy")),
    f"{_TORCH}/_guards.py", f"{_TORCH}/_meta_registrations.py", f"{_TORCH}/utils/checkpoint.py",
)  # fmt: skip
_OPS_FILE = f"{torch.__path__[0]}/_ops.py"
_USER, _COMPILED, _FRAMEWORK, _OPS = 0, 1, 2, 3
_is_compiling: Callable[[], bool] = getattr(torch.compiler, "is_compiling", lambda: False)
_tf_mode_on = torch._C._is_torch_function_mode_enabled
_warned_compile = False

_TENSOR_BACKWARD = torch.Tensor.backward
# Cache per func object: (prefix, api, is_operator_candidate, "prefix.api") or None for an ignored call.
_Name = tuple[str, str, bool, str] | None
# Both caches live as long as the process, not one mode: ``start()`` makes a new mode every step, and naming
# a function (``resolve_name``) costs about as much as recording its call.
_NAMES: dict[Any, _Name] = {}
# id(code) -> (the code, held so its id stays unique; whose code it is: _USER, _COMPILED, _FRAMEWORK): a code
# object's own hash is recomputed from its fields at every lookup
_COMPILED_CODE: dict[int, tuple[CodeType, int]] = {}
#: past this many entries a cache starts over (functions and code made on the fly would otherwise pile up)
_MAX_NAMES = 20000


class ApiMode(TorchFunctionMode):
    """Routes each outermost torch call to :meth:`Recorder.record_api`."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder
        self.active = True  # False in a forked child (DataLoader workers): calls pass straight through
        self._names = _NAMES
        self._compiled_code = _COMPILED_CODE
        self._compiled_frame: FrameType | None = None

    def _resolve(self, func: Any) -> _Name:
        try:
            resolved = resolve_name(func)
        except Exception:  # resolve_name builds an index of torch's namespace; never fail a call over a name
            resolved = None
        pa = api_name(resolved, func)
        name: _Name = None if pa is None else (
            pa[0], pa[1], pa[0] == "Tensor" and pa[1] in OPERATOR_METHODS, f"{pa[0]}.{pa[1]}"
        )
        if len(self._names) >= _MAX_NAMES:
            self._names.clear()
        self._names[func] = name
        return name

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:  # fmt: skip
        if kwargs is None:
            kwargs = {}
        if not self.active or _is_compiling():
            return func(*args, **kwargs)
        try:
            name = self._names[func]
        except (KeyError, TypeError):
            name = self._resolve(func) if _hashable(func) else None
        if name is None:
            if func is _TENSOR_BACKWARD:
                return self._backward(*args, **kwargs)
            return func(*args, **kwargs)
        frame = sys._getframe(1)
        code = frame.f_code
        known = self._compiled_code.get(id(code))
        if known is None:
            if len(self._compiled_code) >= _MAX_NAMES:
                self._compiled_code.clear()
            known = self._compiled_code[id(code)] = (code, _caller_kind(code.co_filename))
        if known[1] == _OPS and frame.f_back is not None:  # ``torch.ops.ns.op(...)``: whoever called it
            known = (code, _caller_kind(frame.f_back.f_code.co_filename))
        if known[1] and known[1] != _OPS:
            if known[1] == _COMPILED:
                self._mark_compiled(frame)
            return func(*args, **kwargs)
        if self._compiled_frame is not None:
            self._compiled_frame = None
        prefix, api, operator, prefix_api = name
        if operator:
            reflected = _REFLECTING.name
            if reflected is not None and _REFLECTED[reflected] == api:  # ``0.5 * x``: see ReflectedOperators
                _REFLECTING.name = None
                prefix_api = f"{prefix}.{reflected}"
                frame = frame.f_back or frame  # the operator's own frame, not the wrapper's
            else:
                dunder = operator_dunder(api, frame)
                if dunder is not None:
                    prefix_api = f"{prefix}.{dunder}"
        shown_args, shown_kwargs, caller = as_called(func, args, kwargs, frame)
        return self.recorder.record_api(prefix_api, func, args, kwargs, caller,
                                        shown=(shown_args, shown_kwargs))  # fmt: skip

    def _backward(self, tensor: torch.Tensor, gradient: Any = None, retain_graph: Any = None,
                  create_graph: bool = False, inputs: Any = None) -> None:  # fmt: skip
        """``loss.backward()``: the implicit gradient of a scalar loss is made here, under the mode, by the
        same call autograd's ``_make_grads`` makes, so the dump holds msprobe's ``Torch.ones_like`` entry
        (msprobe's patched ``torch.ones_like`` sees autograd's call; a function mode is off inside it)."""
        if gradient is None and tensor.requires_grad and tensor.numel() == 1:
            with self:
                gradient = torch.ones_like(tensor, memory_format=torch.preserve_format)
        torch.autograd.backward(tensor, gradient, retain_graph, create_graph, inputs=inputs)

    def _mark_compiled(self, frame: FrameType) -> None:
        """One marker per compiled-graph call (the graph's frame); its ops are not captured."""
        global _warned_compile
        if frame is self._compiled_frame:
            return
        self._compiled_frame = frame  # held (not an id) so a new call cannot reuse the address
        if not _warned_compile:
            _warned_compile = True
            log.warning("parity: ops inside torch.compile regions are not captured; each compiled call is "
                        "recorded as one '%s' marker entry", COMPILED_MARKER)  # fmt: skip
        self.recorder.compiled_region(COMPILED_MARKER)


#: The reflected operators torch implements in C (the others, ``__rsub__``, ``__rpow__``..., are Python
#: functions the mode sees by their own name), and the method each arrives as.
_REFLECTED = {"__rmul__": "mul", "__radd__": "add", "__rand__": "bitwise_and", "__ror__": "bitwise_or",
              "__rxor__": "bitwise_xor"}  # fmt: skip


class _Reflecting(threading.local):
    name: str | None = None  # the reflected operator running on this thread, until the mode sees its call


_REFLECTING = _Reflecting()


class ReflectedOperators:
    """``0.5 * x`` reaches the function mode as ``Tensor.mul``, exactly as ``x * 0.5`` does, and the calling
    instruction is the same ``BINARY_OP``: which side the tensor was on is only known to Python, which calls
    ``Tensor.__rmul__``. msprobe names the call ``Tensor.__rmul__`` (and every later counter of both APIs
    depends on it), so while capturing, these five dunders of ``torch.Tensor`` are Python wrappers that say so
    (:meth:`install`; :meth:`restore` puts torch's back). The cost is a Python call per reflected operator."""

    def __init__(self) -> None:
        self._saved: list[tuple[str, Any]] = []  # (dunder, torch.Tensor's own attribute or None: inherited)

    def install(self) -> None:
        if self._saved:
            return
        for dunder in _REFLECTED:
            orig = getattr(torch.Tensor, dunder, None)
            if orig is None:
                continue
            self._saved.append((dunder, torch.Tensor.__dict__.get(dunder)))
            setattr(torch.Tensor, dunder, _reflected(dunder, orig))

    def restore(self) -> None:
        for dunder, own in reversed(self._saved):
            if own is None:
                delattr(torch.Tensor, dunder)
            else:
                setattr(torch.Tensor, dunder, own)
        self._saved.clear()


def _reflected(dunder: str, orig: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def operator(self: Any, other: Any) -> Any:
        _REFLECTING.name = dunder
        try:
            return orig(self, other)
        finally:
            _REFLECTING.name = None

    operator.__name__ = operator.__qualname__ = dunder
    return operator


class BackwardCapture:
    """The function mode inside the backward, where the autograd engine does not carry it.

    The engine runs a backward's nodes with no torch-function mode, so the torch calls a custom autograd
    Function's backward makes were never seen: above all a reentrant checkpoint's recomputed forward
    (``checkpoint(..., use_reentrant=True)``, Megatron's and MindSpeed's own), whose API entries and their
    backward were all lost, and a non-reentrant checkpoint's recomputation (run from a saved-tensor hook).
    msprobe's wrappers are always on and record them, marked ``is_recompute``. While capturing, the two
    places the engine enters Python for them push the mode back (``BackwardCFunction.apply``, torch's
    checkpoint's recompute call); the recorder marks what it records there (a forward call while a graph
    task runs) ``is_recompute``."""

    def __init__(self, get_mode: Callable[[], ApiMode | None]) -> None:
        self._get = get_mode
        self._saved: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        if self._saved:
            return
        from torch.autograd.function import BackwardCFunction

        targets: list[tuple[Any, str]] = [(BackwardCFunction, "apply"), (BackwardCFunction, "apply_boxed")]
        try:
            import torch.utils.checkpoint as checkpoint

            targets.append((checkpoint, "_run_fn_with_dynamo_disabled"))
        except Exception:  # a torch without it: reentrant checkpoints are still seen
            pass
        for owner, attr in targets:
            orig = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
            if orig is None:
                continue
            self._saved.append((owner, attr, orig))
            setattr(owner, attr, self._under_mode(orig))

    def restore(self) -> None:
        for owner, attr, orig in reversed(self._saved):
            setattr(owner, attr, orig)
        self._saved.clear()

    def _under_mode(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        get = self._get

        @functools.wraps(orig)
        def run(*args: Any, **kwargs: Any) -> Any:
            mode = get()
            if mode is None or not mode.active or _tf_mode_on():
                return orig(*args, **kwargs)
            with mode:
                return orig(*args, **kwargs)

        return run


def _caller_kind(filename: str) -> int:
    if filename.startswith(_COMPILED_FILES) or "torchinductor" in filename:
        return _COMPILED
    if filename.startswith(_FRAMEWORK_FILES):
        return _FRAMEWORK
    if filename == _OPS_FILE:
        return _OPS
    return _USER


def _hashable(func: Any) -> bool:
    try:
        hash(func)
    except TypeError:
        return False
    return True
