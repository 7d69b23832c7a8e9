"""API-level capture (L1, mix): one ``TorchFunctionMode`` sees every ``torch.*``, ``torch.nn.functional.*``
and Tensor method call, with no API list and no monkeypatching.

While ``__torch_function__`` runs, torch pops the mode, so the calls an API makes internally (and the
tool's own statistics) are not seen: only outermost calls are recorded, as msprobe's depth guard does.

torch.compile: ops run by a compiled graph are not captured. Dynamo traces ``__torch_function__`` with
``is_compiling()`` true, and at run time the graph's ops come from generated code (``<eval_with_key>``,
inductor or AOT-autograd files); each such graph call becomes one marker entry
``Torch.compiled_region.{n}.forward`` and a warning is logged once.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

import torch
from parity.client.call_site import as_called
from parity.client.naming_rules import OPERATOR_METHODS, api_name, operator_dunder
from parity.client.recorder import Recorder
from torch.overrides import TorchFunctionMode, resolve_name

__all__ = ["ApiMode", "COMPILED_MARKER"]

log = logging.getLogger(__name__)

COMPILED_MARKER = "Torch.compiled_region"
_COMPILED_FILES = ("<eval_with_key>", "torchinductor", f"{torch.__path__[0]}/_dynamo/",
                   f"{torch.__path__[0]}/_inductor/", f"{torch.__path__[0]}/_functorch/")  # fmt: skip
_is_compiling: Callable[[], bool] = getattr(torch.compiler, "is_compiling", lambda: False)
_warned_compile = False

_TENSOR_BACKWARD = torch.Tensor.backward
# Cache per func object: (prefix, api, is_operator_candidate, "prefix.api") or None for an ignored call.
_Name = tuple[str, str, bool, str] | None
# Both caches live as long as the process, not one mode: ``start()`` makes a new mode every step, and naming
# a function (``resolve_name``) costs about as much as recording its call.
_NAMES: dict[Any, _Name] = {}
# id(code) -> (the code, held so its id stays unique; it is a compiled graph's): a code object's own hash is
# recomputed from its fields at every lookup
_COMPILED_CODE: dict[int, tuple[CodeType, bool]] = {}
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
            known = self._compiled_code[id(code)] = (code, code.co_filename.startswith(_COMPILED_FILES) or (
                "torchinductor" in code.co_filename
            ))  # fmt: skip
        if known[1]:
            self._mark_compiled(frame)
            return func(*args, **kwargs)
        if self._compiled_frame is not None:
            self._compiled_frame = None
        prefix, api, operator, prefix_api = name
        if operator:
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


def _hashable(func: Any) -> bool:
    try:
        hash(func)
    except TypeError:
        return False
    return True
