"""``Distributed.*`` capture: the few collectives that bypass ``TorchFunctionMode``, wrapped while running.

``torch.distributed`` functions call into C++ directly, so the function mode never sees them; this is the
one place with a (short, documented) list, msprobe's ``Distributed`` namespace. Each wrapper records the
inputs before the call and, as ``output``, the post-call values of all args then all kwarg values (the
communication is in place, §4.2). For ``async_op=True`` (and ``isend``/``irecv``) the output is recorded when
the returned ``Work`` is waited on: ``Work.wait`` is wrapped for that, and everything is restored at stop.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch
from parity.client.recorder import Collective, Recorder

__all__ = ["COLLECTIVES", "DistributedPatch"]

#: The wrapped ``torch.distributed`` functions.
COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "broadcast", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all", "all_to_all_single",
    "gather", "scatter",
    "send", "recv",
    "isend", "irecv", "barrier",
)  # fmt: skip
_ASYNC_ALWAYS = ("isend", "irecv")
#: the arguments a collective only writes, by position (and keyword): recorded without their prior values
_OUTPUT_BUFFERS: dict[str, tuple[int | str, ...]] = {
    "all_gather": (0, "tensor_list"), "all_gather_into_tensor": (0, "output_tensor"),
    "all_gather_single": (0, "output_tensor"), "reduce_scatter": (0, "output"),
    "reduce_scatter_tensor": (0, "output"), "reduce_scatter_single": (0, "output"),
    "all_to_all": (0, "output_tensor_list"), "all_to_all_single": (0, "output"), "recv": (0, "tensor"),
    "irecv": (0, "tensor"), "gather": (1, "gather_list"), "scatter": (0, "tensor"),
}  # fmt: skip


class _Inside(threading.local):
    active = False


class DistributedPatch:
    """Installs the wrappers on ``torch.distributed`` and ``distributed_c10d``; :meth:`restore` undoes it."""

    def __init__(self, get_recorder: Callable[[], Recorder | None]) -> None:
        self._get = get_recorder
        self._saved: list[tuple[Any, str, Any]] = []
        self._inside = _Inside()  # per thread: a wrapped collective is running
        # id(Work) -> (the Work, kept alive so its id is not reused; recorder, the call, args, kwargs)
        self._pending: dict[int, tuple[Any, Recorder, Collective, tuple[Any, ...], dict[str, Any]]] = {}

    def install(self) -> None:
        import torch.distributed as dist

        if self._saved or not dist.is_available():
            return
        c10d = dist.distributed_c10d
        for name in COLLECTIVES:
            orig = getattr(c10d, name, None)
            if orig is None:
                continue
            wrapper = self._wrap(name, orig)
            for ns in (dist, c10d):
                if getattr(ns, name, None) is orig:
                    self._saved.append((ns, name, orig))
                    setattr(ns, name, wrapper)
        work = getattr(c10d, "Work", None)
        if work is not None:
            orig_wait = work.wait
            self._saved.append((work, "wait", orig_wait))
            patch = self

            def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
                result = orig_wait(self, *args, **kwargs)
                patch._complete(self)
                return result

            work.wait = wait

    def restore(self) -> None:
        for ns, name, orig in reversed(self._saved):
            setattr(ns, name, orig)
        self._saved.clear()

    def _wrap(self, api: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        prefix_api = f"Distributed.{api}"
        buffers = _OUTPUT_BUFFERS.get(api, ())

        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            rec = self._get()
            if rec is None or self._inside.active:  # a collective another one calls (a deprecated alias)
                return orig(*args, **kwargs)
            call = rec.collective_enter(prefix_api, args, kwargs, buffers)
            self._inside.active = True
            try:
                with torch._C.DisableTorchFunction():  # the collective's own tensor calls are not APIs
                    result = orig(*args, **kwargs)
            finally:
                self._inside.active = False
            if rec.collective_exit(call):
                if result is not None and (kwargs.get("async_op") or api in _ASYNC_ALWAYS):
                    self._pending[id(result)] = (result, rec, call, args, kwargs)
                else:
                    rec.collective_output(call, args, kwargs)
            return result

        return wrapper

    def _complete(self, work: Any) -> None:
        pending = self._pending.pop(id(work), None)
        if pending is not None:
            _, rec, call, args, kwargs = pending
            rec.collective_output(call, args, kwargs)
