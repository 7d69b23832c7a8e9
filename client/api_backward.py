"""Backward records of API calls that belong to the call, whatever later happens to its outputs.

msprobe hooks the ``grad_fn`` of a call's first output tensor and records that node's gradients. That node is
the call's own in the common case, and then its order is msprobe's layout (``Functional.linear``'s backward
``output`` is ``[bias, input, weight.T]``, the order of the ``addmm`` node's inputs), which Parity keeps.
It is wrong or lost in three cases, each handled here by construction:

- **No-op calls** (``float()`` on fp32, ``to()`` of the same dtype, ``contiguous()`` of a contiguous
  tensor) return an input tensor, so its ``grad_fn`` is the *previous* call's node: hooking it records the
  previous call's gradients under this call's name. A call whose output is an input, or carries a node that
  an input already had, gets a tensor hook on that output instead; the call is the identity, so its
  backward ``input`` and ``output`` are both that gradient.
- **Views changed in place later** (``F.linear`` on a 3-D input returns a view; ``h.mul_(2)`` afterwards):
  autograd rebases the view's history and the view's node leaves the graph, so no hook on it (node or
  tensor) ever fires: the backward entry was lost. A view output is remembered (weakly); when a later call
  changes it in place, the record moves to the base's new ``CopySlices`` node, whose first gradient is the
  base's gradient before the update: the entry gets the view's region of it (``input``) and, for a direct
  view, the base gradient itself (``output``, what the lost view node would have passed on).
- **Outputs used twice or changed in place (not views)**: the call's own node stays in the graph and sees
  the summed gradient of the value it produced; nothing to do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from parity.client.stats import quiet
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["ApiBackward", "InputNodes"]

Tensor = torch.Tensor
#: ``(tensor, its grad_fn)`` for every input tensor that requires grad, taken before the call.
InputNodes = list[tuple[Tensor, Any]]
#: ``(entry name, grads of the call's outputs, grads of its inputs)``; a side is None when not recorded.
Record = Callable[[str, Sequence[Tensor | None], Sequence[Tensor | None] | None], None]


def input_nodes(args: Sequence[Any], kwargs: dict[str, Any]) -> InputNodes:
    """Grad-requiring tensors among the arguments (and one level into lists: ``cat``) and their nodes."""
    found: InputNodes = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor):
            if value.requires_grad:
                found.append((value, value.grad_fn))
        elif isinstance(value, (list, tuple)):
            for v in value:
                if isinstance(v, Tensor) and v.requires_grad:
                    found.append((v, v.grad_fn))
    return found


def _anchor(out: Any) -> Tensor | None:
    """The first output tensor that takes part in autograd (msprobe: the first tensor of the output)."""
    if isinstance(out, Tensor):
        return out if out.requires_grad else None
    if isinstance(out, (list, tuple)):
        for v in out:
            t = _anchor(v)
            if t is not None:
                return t
    elif isinstance(out, dict):
        for v in out.values():
            t = _anchor(v)
            if t is not None:
                return t
    return None


class ApiBackward:
    """Hooks that make each API call's backward entry; one per recorder (so per step)."""

    def __init__(self, record: Record) -> None:
        self._record = record
        # view outputs whose entry hangs on the view's node: moved if the view is changed in place
        self._views: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def after_call(self, name: str, out: Any, before: InputNodes) -> None:
        """Attach ``name``'s backward to the call's outputs; ``before``: its inputs' nodes before it ran."""
        self.follow_inplace(before)
        t = _anchor(out)
        if t is None:
            return
        node = t.grad_fn
        if node is None or any(node is n for _, n in before):
            identity = any(t is x for x, _ in before)
            t.register_hook(self._tensor_hook(name, identity))
            return
        node.register_hook(self._node_hook(name))
        if t._is_view():
            self._views[t] = (name, node)

    def follow_inplace(self, before: InputNodes) -> None:
        """Move the entry of a remembered view that the call just changed in place (its node is gone)."""
        if not self._views:
            return
        for x, node in before:
            held = self._views.get(x)
            if held is None or x.grad_fn is node:
                continue
            del self._views[x]
            name, view_node = held
            base = x._base
            if base is None or base.grad_fn is None:
                continue
            copy_slices = base.grad_fn
            nexts = copy_slices.next_functions
            direct = bool(nexts) and bool(view_node.next_functions) and (
                view_node.next_functions[0][0] is nexts[0][0]
            )
            geometry = (tuple(base.shape), base.stride(), tuple(x.shape), x.stride(),
                        x.storage_offset() - base.storage_offset())  # fmt: skip
            copy_slices.register_hook(self._rebased_hook(name, geometry, direct))

    def _node_hook(self, name: str) -> Callable[[Any, Any], None]:
        def hook(grad_inputs: Any, grad_outputs: Any) -> None:
            # grad_outputs: grads of the call's outputs (msprobe "input"); grad_inputs: grads flowing to its
            # inputs ("output")
            self._record(name, grad_outputs, grad_inputs)

        return hook

    def _tensor_hook(self, name: str, identity: bool) -> Callable[[Tensor], None]:
        def hook(grad: Tensor) -> None:
            self._record(name, (grad,), (grad,) if identity else ())

        return hook

    def _rebased_hook(self, name: str, geometry: tuple[Any, ...], direct: bool) -> Callable[[Any, Any], None]:
        base_shape, base_stride, shape, stride, offset = geometry

        def hook(grad_inputs: Any, grad_outputs: Any) -> None:
            g_base = grad_inputs[0] if grad_inputs else None
            if g_base is None:
                self._record(name, (None,), (None,) if direct else ())
                return
            with quiet():  # CopySlices' own layout: the base's strides, the view's region of them
                laid = torch.empty_strided(base_shape, base_stride, dtype=g_base.dtype, device=g_base.device)
                laid.copy_(g_base)
                region = laid.as_strided(shape, stride, offset)
            self._record(name, (region,), (g_base,) if direct else ())

        return hook
