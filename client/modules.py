"""Module-level capture (L0, mix): forward hooks per submodule, backward through multi-grad hooks.

Backward is observed the way ``ModTracker`` does it: ``register_multi_grad_hook`` on the module's inputs and
outputs, never ``register_full_backward_hook``. Full backward hooks route tensors through a custom Function
whose outputs are views, so ``nn.ReLU(inplace=True)`` after a hooked module fails ("is a view and is being
modified inplace") or loses its backward data; tensor hooks do not change the graph. A hook registered
before an in-place update sees the gradient of the pre-update version, so a module whose output is later
overwritten in place still gets its own backward entry.

Backward ``input`` = grads of the module outputs (the whole gradient of each, as msprobe's), ``output`` =
the gradients through the module to its inputs that require grad: the module gets a view of each such
input, whose gradient is the module's share alone (:func:`parity.client.recorder.through_views`); none
arrives, and no entry is made, for a module whose outputs do not depend on its inputs. Parameter gradients
come from ``register_post_accumulate_grad_hook``: the accumulated ``.grad``.
Under FSDP (``fully_shard``, or FSDP1) the gradient is assigned to the sharded parameter after its
reduce-scatter, never accumulated: the recorder reads those ``.grad`` when the backward's callbacks are done
(a DTensor: its local shard, see :mod:`parity.client.dtensors`), and a sharded module's parameters in its
forward entry are read when its forward returns, before FSDP frees their gathered storage.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from parity.client.recorder import ModuleCall, Recorder, param_grad_name
from parity.shared.dump.naming import module_prefix
from torch import nn
from torch.utils.hooks import RemovableHandle

__all__ = ["ModuleHooks", "param_grad_name", "sharded_paths"]

_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


class ModuleHooks:
    """Hooks on every descendant of the models given to ``start(model)`` (the roots themselves excluded).

    The hooks only report events to the active :class:`Recorder`; the roots hooked are tracked weakly (a
    freed model's address may be reused by another object, an ``id()`` would then mistake it)."""

    def __init__(self, get_recorder: Any) -> None:
        self._get = get_recorder  # () -> Recorder | None: None while the debugger is not running
        # hooked root -> its hooks' handles
        self._attached: weakref.WeakKeyDictionary[nn.Module, list[RemovableHandle]] = (
            weakref.WeakKeyDictionary()
        )
        # per active forward call: its recorder and the recorder's token (None: not recorded)
        self._active: list[tuple[Recorder, ModuleCall] | None] = []

    @property
    def handles(self) -> list[RemovableHandle]:
        return [h for hs in self._attached.values() for h in hs]

    def attach(self, model: nn.Module | Sequence[nn.Module]) -> None:
        """Hook ``model`` (or each of a list, named ``Module.{idx}.``) once; later calls are no-ops."""
        roots: list[tuple[int | None, nn.Module]] = (
            list(enumerate(model)) if isinstance(model, (list, tuple)) else [(None, model)]  # type: ignore[list-item]
        )
        for idx, root in roots:
            if root in self._attached:
                continue
            # the forward is over when the model returns: the recorder reads its parameters' statistics then
            handles = self._attached[root] = [root.register_forward_hook(self._root_done, always_call=True)]
            sharded_roots = sharded_paths(root)
            for path, mod in root.named_modules():
                if not path or type(mod).__name__ == "FullyShardedDataParallel":
                    continue
                prefix = module_prefix(path, type(mod).__name__, idx)
                own = {pname: p for pname, p in mod.named_parameters(recurse=False) if p.requires_grad}
                # FSDP: the parameters' storage is freed when their unit reshards, and their gradients are
                # assigned, not accumulated: read in the forward, and at the backward's end
                sharded = own if own and _under(path, sharded_roots) else None
                handles.append(mod.register_forward_pre_hook(partial(self._pre, prefix), with_kwargs=True))
                post = partial(self._post, prefix, sharded)
                handles.append(mod.register_forward_hook(post, with_kwargs=True, always_call=True))
                if sharded is not None:
                    continue
                for pname, param in own.items():
                    handles.append(
                        param.register_post_accumulate_grad_hook(partial(self._param_grad, prefix, pname))
                    )

    def detach(self) -> None:
        for handles in self._attached.values():
            for h in handles:
                h.remove()
        self._attached.clear()

    # ------------------------------------------------------------------------------------------- events
    def _pre(self, prefix: str, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
             ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:  # fmt: skip
        rec: Recorder | None = self._get()
        if rec is None or _is_compiling():
            self._active.append(None)
            return None
        call = rec.module_enter(prefix, module, args, kwargs, sys._getframe(1))
        self._active.append((rec, call))
        return call.inputs  # the inputs the module's backward is observed through, or unchanged

    def _post(self, prefix: str, sharded: dict[str, nn.Parameter] | None, module: nn.Module,
              args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:  # fmt: skip
        if not self._active:
            return
        active = self._active.pop()
        if active is None or self._get() is None:
            return
        rec, call = active
        rec.module_exit(call, module, output, sharded)

    def _root_done(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        rec: Recorder | None = self._get()
        if rec is not None and not _is_compiling():
            rec.forward_done()

    def _param_grad(self, prefix: str, pname: str, param: torch.Tensor) -> None:
        rec: Recorder | None = self._get()
        if rec is not None and (grad := param.grad) is not None:
            rec.param_gradient(prefix, pname, grad, param)


def sharded_paths(root: nn.Module) -> tuple[str, ...]:
    """The paths of ``root``'s modules that FSDP shards (``fully_shard``'s ``FSDPModule``, FSDP1's wrapper),
    ``""`` for the root itself: every module at or under one has parameters FSDP frees and re-gathers."""
    fsdp2: type | None
    try:
        from torch.distributed.fsdp import FSDPModule as fsdp2
    except Exception:  # a torch without distributed support
        fsdp2 = None
    return tuple(path for path, mod in root.named_modules()
                 if (fsdp2 is not None and isinstance(mod, fsdp2))
                 or type(mod).__name__ == "FullyShardedDataParallel")  # fmt: skip


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(r == "" or path == r or path.startswith(f"{r}.") for r in roots)
