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
from parity.client.api_backward import InputNodes, input_nodes
from parity.client.recorder import Recorder, grad_tensors
from parity.client.stats import quiet
from parity.shared.dump.naming import backward_of, module_prefix, param_grad_file
from torch import nn
from torch.autograd.graph import register_multi_grad_hook
from torch.utils.hooks import RemovableHandle

__all__ = ["ModuleHooks"]

_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


def param_grad_name(prefix: str) -> str:
    """``Module.{path}.{Class}.parameters_grad``: msprobe 8.3.3's name, no counter (one entry a step)."""
    return f"{prefix}.parameters_grad"


class ModuleHooks:
    """Hooks on every descendant of the models given to ``start(model)`` (the roots themselves excluded)."""

    def __init__(self, get_recorder: Any) -> None:
        self._get = get_recorder  # () -> Recorder | None: None while the debugger is not running
        self.handles: list[RemovableHandle] = []
        self._attached: set[int] = set()
        # per active forward call: (entry name, its entry, selected by the filters, matched ``list`` at mix,
        # its grad-requiring inputs and their nodes before the call)
        self._active: list[tuple[str, dict[str, Any] | None, bool, bool, InputNodes]] = []

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
            self._active.append(("", None, False, False, []))
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
        # an in-place module (nn.ReLU(inplace=True)) may drop the node of a recorded view it updates
        before = input_nodes(args, kwargs) if rec.want_bwd and torch.is_grad_enabled() else []
        self._active.append((name, entry, selected, listed, before))

    def _post(self, prefix: str, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
              output: Any) -> None:  # fmt: skip
        if not self._active:
            return
        name, entry, selected, listed, before = self._active.pop()
        rec: Recorder | None = self._get()
        if not name or rec is None:
            return
        if before:
            rec.api_backward.follow_inplace(before)
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
                entry["parameters"] = {  # present, maybe empty, as msprobe writes it
                    p: rec.tensor_leaf(t, name, "parameters", (p,))
                    for p, t in module.named_parameters(recurse=False)
                }
            if entry is not None:
                rec.data.pop(name, None)
                rec.data[name] = (
                    entry  # re-inserted at completion: a module follows the APIs inside it (§4.4)
                )
            if rec.want_bwd and grad_on and prefix not in rec.param_grads:
                # msprobe 8.3.3 reserves the gradient entry right after the module's first forward, one
                # ``[null]`` per trainable parameter, filled when the gradient arrives
                slots = {p: [None] for p, t in module.named_parameters(recurse=False) if t.requires_grad}
                if slots:
                    rec.param_grads[prefix] = slots
                    rec.data[param_grad_name(prefix)] = slots
            if rec.want_bwd_in and grad_on:
                outs = grad_tensors(output, [])
                if outs:
                    register_multi_grad_hook(outs, partial(self._bwd_outputs, rec, backward_of(name)))
                if len(outs) == 1 and outs[0]._is_view():  # its hook is lost if it is updated in place
                    rec.api_backward.watch_view(outs[0], partial(self._bwd_rebased, rec, backward_of(name)))

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

    def _bwd_rebased(self, rec: Recorder, name: str, g_view: torch.Tensor | None, _: Any) -> None:
        self._bwd_outputs(rec, name, (g_view,))

    def _bwd_inputs(self, rec: Recorder, name: str, grads: Sequence[torch.Tensor | None]) -> None:
        with rec.lock, quiet():
            entry = self._bwd_entry(rec, name)
            entry["output"] = rec.encode_grads(name, "output", grads)
            # placed once the module's backward is complete, after the APIs inside it (msprobe's order)
            rec.data.pop(name, None)
            rec.data[name] = entry

    def _param_grad(self, prefix: str, pname: str, param: torch.Tensor) -> None:
        rec: Recorder | None = self._get()
        if rec is None or not rec.want_bwd or param.grad is None:
            return
        if rec.filtered and prefix not in rec.selected_modules:
            return
        with rec.lock, quiet():
            # One entry per module and step, as msprobe 8.3.3 names it; a later accumulation (another
            # micro-batch) overwrites the leaf, so the entry ends with the gradient the optimizer sees.
            entry_name = param_grad_name(prefix)
            entry = rec.param_grads.get(prefix)
            if entry is None:
                entry = rec.param_grads[prefix] = {}
                rec.data[entry_name] = entry
            data_name = None
            if rec.writer is not None:
                data_name = param_grad_file(entry_name, pname)
                rec.writer.submit(rec.dir_writer.tensor_dir / data_name, param.grad)
            entry[pname] = [rec.stats.leaf(param.grad, data_name)]
            rec.dirty = True
