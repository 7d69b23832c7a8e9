"""Module-level capture (L0, mix): forward hooks per submodule, backward through multi-grad hooks.

Backward is observed the way ``ModTracker`` does it: ``register_multi_grad_hook`` on the module's inputs and
outputs, never ``register_full_backward_hook``. Full backward hooks route tensors through a custom Function
whose outputs are views, so ``nn.ReLU(inplace=True)`` after a hooked module fails ("is a view and is being
modified inplace") or loses its backward data; tensor hooks do not change the graph. A hook registered
before an in-place update sees the gradient of the pre-update version, so a module whose output is later
overwritten in place still gets its own backward entry.

Backward ``input`` = grads of the module outputs, ``output`` = grads of its inputs that require grad (a
tensor's hook sees its whole gradient, so an input also used outside the module carries every consumer's
share). Parameter gradients come from ``register_post_accumulate_grad_hook``: the accumulated ``.grad``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from parity.client.recorder import Recorder, grad_tensors
from parity.client.stats import quiet
from parity.shared.dump.naming import backward_of, module_prefix, param_grad_file
from torch import nn
from torch.autograd.graph import register_multi_grad_hook
from torch.utils.hooks import RemovableHandle

__all__ = ["ModuleHooks"]

_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


class ModuleHooks:
    """Hooks on every descendant of the models given to ``start(model)`` (the roots themselves excluded)."""

    def __init__(self, get_recorder: Any) -> None:
        self._get = get_recorder  # () -> Recorder | None: None while the debugger is not running
        self.handles: list[RemovableHandle] = []
        self._attached: set[int] = set()
        # per active forward call: (entry name, its entry, selected by the filters, matched ``list`` at mix)
        self._active: list[tuple[str, dict[str, Any] | None, bool, bool]] = []

    def attach(self, model: nn.Module | Sequence[nn.Module]) -> None:
        """Hook ``model`` (or each of a list, named ``Module.{idx}.``) once; later calls are no-ops."""
        roots: list[tuple[int | None, nn.Module]] = (
            list(enumerate(model)) if isinstance(model, (list, tuple)) else [(None, model)]  # type: ignore[list-item]
        )
        for idx, root in roots:
            if id(root) in self._attached:
                continue
            self._attached.add(id(root))
            for path, mod in root.named_modules():
                if not path or type(mod).__name__ == "FullyShardedDataParallel":
                    continue
                prefix = module_prefix(path, type(mod).__name__, idx)
                self.handles.append(
                    mod.register_forward_pre_hook(partial(self._pre, prefix), with_kwargs=True)
                )
                self.handles.append(mod.register_forward_hook(partial(self._post, prefix), with_kwargs=True,
                                                              always_call=True))  # fmt: skip
                for pname, param in mod.named_parameters(recurse=False):
                    if param.requires_grad:
                        self.handles.append(
                            param.register_post_accumulate_grad_hook(partial(self._param_grad, prefix, pname))
                        )

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self._attached.clear()

    # ------------------------------------------------------------------------------------------ forward
    def _pre(self, prefix: str, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        rec: Recorder | None = self._get()
        if rec is None or _is_compiling():
            self._active.append(("", None, False, False))
            return
        n = rec.module_counts.get(prefix, 0)
        rec.module_counts[prefix] = n + 1
        name = f"{prefix}.forward.{n}"
        rec.construct[name] = rec.module_stack[-1] if rec.module_stack else None
        rec.module_stack.append(name)
        selected = rec.selected(name)
        listed = bool(rec.mix and rec.cfg.api_list and any(i == name or i in name for i in rec.cfg.api_list))
        if listed:
            rec.list_depth += 1
        entry: dict[str, Any] | None = None
        if selected:
            rec.dirty = True
            rec.selected_modules.add(prefix)
            grad_on = torch.is_grad_enabled()  # read before quiet(), which turns grad off
            with quiet():
                if rec.want_fwd_in:
                    entry = rec.encode_inputs(name, args, kwargs)
                    rec.data[name] = entry
                if rec.want_bwd_out and grad_on:
                    ins = grad_tensors(args, grad_tensors(kwargs, []))
                    if ins:
                        register_multi_grad_hook(ins, partial(self._bwd_inputs, rec, backward_of(name)))
            if rec.cfg.extra_info:
                rec.record_stack(name, sys._getframe(1))
        self._active.append((name, entry, selected, listed))

    def _post(self, prefix: str, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
              output: Any) -> None:  # fmt: skip
        if not self._active:
            return
        name, entry, selected, listed = self._active.pop()
        rec: Recorder | None = self._get()
        if not name or rec is None:
            return
        if listed:  # leaving a module that matched ``list`` at mix: APIs after it are filtered again
            rec.list_depth -= 1
        if rec.module_stack and rec.module_stack[-1] == name:
            rec.module_stack.pop()
        if not selected:
            return
        grad_on = torch.is_grad_enabled()
        with quiet():
            if rec.want_fwd_out:
                if entry is None:
                    entry = {}
                entry["output"] = rec.encode_output(name, output)
                params = {
                    p: rec.tensor_leaf(t, name, "parameters", (p,))
                    for p, t in module.named_parameters(recurse=False)
                }
                if params:
                    entry["parameters"] = params
            if entry is not None:
                rec.data.pop(name, None)
                rec.data[name] = (
                    entry  # re-inserted at completion: a module follows the APIs inside it (§4.4)
                )
            if rec.want_bwd_in and grad_on:
                outs = grad_tensors(output, [])
                if outs:
                    register_multi_grad_hook(outs, partial(self._bwd_outputs, rec, backward_of(name)))

    # ----------------------------------------------------------------------------------------- backward
    @staticmethod
    def _bwd_entry(rec: Recorder, name: str) -> dict[str, Any]:
        rec.dirty = True
        entry: dict[str, Any] | None = rec.data.get(name)
        if entry is None:
            entry = {}
            rec.data[name] = entry
            if rec.want_bwd_in:
                entry["input"] = []
            if rec.want_bwd_out:
                entry["output"] = []
        return entry

    def _bwd_outputs(self, rec: Recorder, name: str, grads: Sequence[torch.Tensor | None]) -> None:
        with rec.lock, quiet():
            self._bwd_entry(rec, name)["input"] = rec.encode_grads(name, "input", grads)

    def _bwd_inputs(self, rec: Recorder, name: str, grads: Sequence[torch.Tensor | None]) -> None:
        with rec.lock, quiet():
            self._bwd_entry(rec, name)["output"] = rec.encode_grads(name, "output", grads)
            # The gradients of its inputs arrive last: the module's backward completes here, after the
            # backward of every call inside it, and its entry moves there (execution order, as forwards).
            rec.data[name] = rec.data.pop(name)

    def _param_grad(self, prefix: str, pname: str, param: torch.Tensor) -> None:
        rec: Recorder | None = self._get()
        if rec is None or not rec.want_bwd or param.grad is None:
            return
        if rec.filtered and prefix not in rec.selected_modules:
            return
        with rec.lock, quiet():
            current = rec.grad_current.get(prefix)
            if current is None or pname in current:
                k = rec.grad_counts.get(prefix, 0)
                rec.grad_counts[prefix] = k + 1
                current = rec.grad_current[prefix] = {}
                rec.data[f"{prefix}.parameters_grad.{k}"] = current
            entry_name = f"{prefix}.parameters_grad.{rec.grad_counts[prefix] - 1}"
            data_name = None
            if rec.writer is not None:
                data_name = param_grad_file(entry_name, pname)
                rec.writer.submit(rec.dir_writer.tensor_dir / data_name, param.grad)
            current[pname] = [rec.stats.leaf(param.grad, data_name)]
            rec.dirty = True
