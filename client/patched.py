"""Torch functions the training code replaced, recorded under the attribute they are called through.

NPU adapters, fused-kernel libraries and ports replace torch functions with their own
(``torch.nn.functional.softmax = fused_softmax``). The function mode never sees such a call as one: a
plain Python function does not take part in ``__torch_function__``, so only the torch calls inside it are
recorded (or, if it implements the protocol itself, it is named by its own ``__qualname__``), and the call
never pairs with the bench's ``Functional.softmax``. msprobe wraps the attribute, whatever it holds, and
names the call by it. So while capturing, every attribute of ``torch.nn.functional``, ``torch`` and
``torch.Tensor`` that holds a Python function from outside torch is wrapped the same way: the call is one
entry named by the attribute (``Functional.softmax``), the calls inside it are not recorded (msprobe's
depth guard), and :meth:`PatchedFunctions.restore` puts the user's functions back.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch
from parity.client.naming_rules import api_name
from parity.client.recorder import Recorder

__all__ = ["PatchedFunctions"]

_tf_mode_on = torch._C._is_torch_function_mode_enabled
_DisableTorchFunction = torch._C.DisableTorchFunction


def _namespaces() -> list[tuple[Any, str]]:
    import torch.nn.functional as F

    return [(F, "torch.nn.functional"), (torch, "torch"), (torch.Tensor, "torch.Tensor")]


def _foreign(value: Any) -> bool:
    """A Python function defined outside torch (torch's own Python functions take part in the protocol)."""
    if not inspect.isfunction(value) or getattr(value, "_parity_patched", False):
        return False
    module = getattr(value, "__module__", None) or ""
    return module != "torch" and not module.startswith("torch.")


class PatchedFunctions:
    """Wraps the replaced torch functions while capturing (:meth:`install` at ``start()``, :meth:`restore`
    at ``stop()``)."""

    def __init__(self, get_recorder: Callable[[], Recorder | None]) -> None:
        self._get = get_recorder
        self._saved: list[tuple[Any, str, Any]] = []  # (namespace, attribute, the user's function)

    def install(self) -> None:
        if self._saved:
            return
        for ns, path in _namespaces():
            for attr, value in list(vars(ns).items()):
                if attr.startswith("_") or not _foreign(value):
                    continue
                named = api_name(f"{path}.{attr}", value)
                if named is None:
                    continue
                self._saved.append((ns, attr, value))
                setattr(ns, attr, self._wrap(f"{named[0]}.{named[1]}", value))

    def restore(self) -> None:
        for ns, attr, value in reversed(self._saved):
            setattr(ns, attr, value)
        self._saved.clear()

    def _wrap(self, prefix_api: str, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            rec = self._get()
            # outermost calls only: inside another recorded call (or the tool's own work) the mode is off
            if rec is None or not _tf_mode_on():
                return func(*args, **kwargs)
            frame = sys._getframe(1)
            # as inside the mode's own handler: neither the tool's work nor the calls inside the function
            # are APIs (msprobe's depth guard)
            with _DisableTorchFunction():
                return rec.record_api(prefix_api, func, args, kwargs, frame)

        wrapper._parity_patched = True  # type: ignore[attr-defined]
        return wrapper
