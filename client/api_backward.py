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

Module outputs have the same view problem (``nn.Linear`` of a 3-D input, then ``nn.ReLU(inplace=True)``),
so :mod:`parity.client.modules` registers its view outputs here too (:meth:`ApiBackward.watch_view`), and
reports the in-place calls it sees at L0, where no API is recorded (:meth:`ApiBackward.follow_inplace`).
"""

from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from parity.client.stats import quiet

__all__ = ["ApiBackward", "InputNodes", "add_tensor_hook", "last_hook_key"]

Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
# keys of the hooks add_tensor_hook adds: negative, torch's own handles count up from 0 and never meet them
_hook_keys = itertools.count(-1, -1)
#: ``(tensor, its grad_fn)`` for every input tensor that requires grad, taken before the call.
InputNodes = list[tuple[Tensor, Any]]
#: ``(entry name, grads of the call's outputs, grads of its inputs)``; a side is None when not recorded.
Record = Callable[[str, Sequence[Tensor | None], Sequence[Tensor | None] | None], None]
#: Called when a watched view's node left the graph: ``(the view's gradient, the base's gradient)``, both
#: of the values before the in-place update; the base's is None unless the view was taken from it directly.
OnRebased = Callable[[Tensor | None, Tensor | None], None]


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


def add_tensor_hook(t: Tensor, hook: Callable[[Tensor], Any]) -> int:
    """``t.register_hook(hook)`` for good (the tool never removes its hooks), without the removable handle.

    The handle (a weak reference, a class counter, an import at every call) is most of ``register_hook``'s
    cost, and the tool adds a hook or two per recorded call. For a plain tensor this does what
    ``Tensor.register_hook`` does without it: the tensor's ``_backward_hooks`` dict, made once and handed to
    its node, holds the hook; the hooks run in the order they were added, as torch's do. A subclass (it may
    override ``register_hook``) takes the public call. Callers pass tensors that require grad. Returns the
    hook's key in ``t._backward_hooks``."""
    cls = type(t)
    if cls is not Tensor and cls is not _Parameter:
        return int(t.register_hook(hook).id)
    hooks = t._backward_hooks
    if hooks is None:
        hooks = t._backward_hooks = OrderedDict()
        node = t.grad_fn
        if node is not None:
            node._register_hook_dict(t)
    key = next(_hook_keys)
    hooks[key] = hook
    return key


def last_hook_key(t: Tensor) -> Any:
    """The key of the hook added last to ``t`` (by anyone), or None."""
    hooks = t._backward_hooks
    return next(reversed(hooks)) if hooks else None


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
        # view outputs whose entries hang on the view's node: moved if the view is changed in place
        # id(view) -> (a weak reference to the view, [(its node, OnRebased)]): a plain dictionary, checked
        # against the reference (torch's WeakIdKeyDictionary makes a Python weak reference object per
        # lookup); the entries of views that died stay until the step ends, with this object. Public so
        # that a caller skips follow_inplace (a call per recorded call) while it is empty.
        self.views: dict[int, tuple[weakref.ref[Tensor], list[tuple[Any, OnRebased]]]] = {}

    def after_call(self, name: str, out: Any, before: InputNodes) -> None:
        """Attach ``name``'s backward to the call's outputs; ``before``: its inputs' nodes before it ran."""
        self.follow_inplace(before)
        t = _anchor(out)
        if t is None:
            return
        node = t.grad_fn
        if node is None or any(node is n for _, n in before):
            identity = any(t is x for x, _ in before)
            add_tensor_hook(t, self._tensor_hook(name, identity))
            return
        node.register_hook(self._node_hook(name))
        if t._is_view():
            self.watch_view(t, partial(self._rebased, name))

    def watch_view(self, view: Tensor, on_rebased: OnRebased) -> None:
        """Call ``on_rebased`` with the gradients if a later in-place update drops ``view``'s node."""
        if view.grad_fn is not None:
            entry = self.views.get(id(view))
            if entry is None or entry[0]() is not view:
                entry = self.views[id(view)] = (weakref.ref(view), [])
            entry[1].append((view.grad_fn, on_rebased))

    def forget_views(self) -> None:
        """Stop watching views (their step is over): their nodes, and the graph behind them, are let go."""
        self.views.clear()

    def _rebased(self, name: str, g_view: Tensor | None, g_base: Tensor | None) -> None:
        # what the lost view node would have recorded: the view's gradient in, the base's out
        self._record(name, (g_view,), (g_base,) if g_base is not None else ())

    def follow_inplace(self, before: InputNodes) -> None:
        """Move the entries of remembered views that a call just changed in place (their node is gone)."""
        views = self.views
        if not views:
            return
        for x, node in before:
            entry = views.get(id(x))
            if entry is None or entry[0]() is not x or x.grad_fn is node:
                continue
            del views[id(x)]
            self.rebased(x, entry[1])

    def rebased(self, x: Tensor, watchers: Sequence[tuple[Any, OnRebased]]) -> None:
        """The view ``x`` was changed in place: each ``(its node before, on_rebased)`` of ``watchers`` gets
        the gradients its lost node would have seen, from the base's new ``CopySlices`` node."""
        base = x._base
        if base is None or base.grad_fn is None:
            return
        copy_slices = base.grad_fn  # its first input is the base before the update
        nexts = copy_slices.next_functions
        geometry = (tuple(base.shape), base.stride(), tuple(x.shape), x.stride(),
                    x.storage_offset() - base.storage_offset())  # fmt: skip
        for view_node, on_rebased in watchers:
            view_of = view_node.next_functions
            direct = bool(nexts) and bool(view_of) and view_of[0][0] is nexts[0][0]
            copy_slices.register_hook(self._rebased_hook(on_rebased, geometry, direct))

    def _node_hook(self, name: str) -> Callable[[Any, Any], None]:
        # a partial of the plain function, not a closure or bound method: one object per recorded call instead
        # of three (function and two cells)
        # for the garbage collector to walk while the graph lives
        return partial(ApiBackward._node_record, self, name)

    def _node_record(self, name: str, grad_inputs: Any, grad_outputs: Any) -> None:
        # grad_outputs: grads of the call's outputs (msprobe "input"); grad_inputs: grads flowing to its
        # inputs ("output")
        self._record(name, grad_outputs, grad_inputs)

    def _tensor_hook(self, name: str, identity: bool) -> Callable[[Tensor], None]:
        def hook(grad: Tensor) -> None:
            self._record(name, (grad,), (grad,) if identity else ())

        return hook

    @staticmethod
    def _rebased_hook(on_rebased: OnRebased, geometry: tuple[Any, ...], direct: bool
                      ) -> Callable[[Any, Any], None]:  # fmt: skip
        base_shape, base_stride, shape, stride, offset = geometry

        def hook(grad_inputs: Any, grad_outputs: Any) -> None:
            g_base = grad_inputs[0] if grad_inputs else None
            if g_base is None:
                on_rebased(None, None)
                return
            with quiet():  # CopySlices' own layout: the base's strides, the view's region of them
                laid = torch.empty_strided(base_shape, base_stride, dtype=g_base.dtype, device=g_base.device)
                laid.copy_(g_base)
                region = laid.as_strided(shape, stride, offset)
            on_rebased(region, g_base if direct else None)

        return hook
