"""The per-process dump state of one step: entries, counters, filters, stacks, construct, and the flush.

Capture front-ends (the function mode in :mod:`parity.client.api_mode`, module hooks in
:mod:`parity.client.modules`, collective wrappers in :mod:`parity.client.distributed`) call into one
:class:`Recorder`; it owns naming (§5), the ``scope``/``list``/``data_mode`` filters, value encoding (§4.3)
and writing the rank directory (§3) through :class:`parity.shared.dump.writer.RankDirWriter`.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from parity.client.api_backward import ApiBackward, InputNodes, add_tensor_hook, input_nodes, last_hook_key
from parity.client.call_stacks import CallStacks, Stacks
from parity.client.config import DebuggerConfig
from parity.client.diff_check import Baseline, DiffCheck, LiveDiffCheck
from parity.client.errors import ConfigError
from parity.client.naming_rules import UNINITIALISED
from parity.client.stats import Later, StatsBuffer, quiet
from parity.client.tensor_writer import BackgroundWriter
from parity.shared.dump.layout import rank_dir_path
from parity.shared.dump.naming import backward_of, param_grad_file, parse_entry, tensor_file
from parity.shared.dump.writer import RankDirWriter
from parity.shared.plan.dataflow import DataFlow
from torch import nn
from torch.autograd.graph import register_multi_grad_hook
from torch.utils import _pytree as pytree

__all__ = ["Collective", "ModuleCall", "Recorder", "param_grad_name"]

log = logging.getLogger(__name__)

Tensor = torch.Tensor
_Documents = tuple[dict[str, Any], Stacks, dict[str, str | None]]
_set_grad_enabled = torch._C._set_grad_enabled
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
_tf_mode_on = torch._C._is_torch_function_mode_enabled
_graph_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: -1)
_is_grad_enabled = torch._C.is_grad_enabled
_DisableTorchFunction = torch._C.DisableTorchFunction
_SCALARS = (bool, int, float, str)
_TENSORS = (torch.Tensor, torch.nn.Parameter)  # plain classes: no subclass that could hide a tensor inside


def grad_tensors(value: Any, out: list[Tensor]) -> list[Tensor]:
    """Every tensor in ``value`` that requires grad, flattened in order."""
    if isinstance(value, Tensor):
        if value.requires_grad:
            out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            grad_tensors(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            grad_tensors(v, out)
    return out


class _GradFanout:
    """One tensor hook for every module that wants that tensor's gradient, in the order they asked: a
    module's output is usually the next module's only input, and both want its gradient (the first as its
    backward ``input``, the next as its backward ``output``)."""

    __slots__ = ("items", "rec")

    def __init__(self, rec: Recorder, name: str, of_outputs: bool) -> None:
        self.rec = rec
        self.items = [(name, of_outputs)]  # (the module's backward entry, the gradient is of its outputs)

    def __call__(self, grad: Tensor) -> None:
        self.rec.module_grads(self.items, (grad,))


def through_views(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A module's arguments with each tensor that requires grad replaced by a view of itself (``view_as``).

    msprobe's module backward ``output`` is the gradient that flows through the module to its inputs (torch's
    full backward hook puts an identity Function between the caller's tensors and the module). A hook on
    the caller's tensor sees its whole gradient instead, every consumer's share summed (``a(h) + b(h)``),
    and fires for a module whose output does not depend on it (a rotary embedding reads only its input's
    dtype). A view is that identity without a custom Function: the module's calls consume the view, so the
    view's gradient is the module's own, and none arrives where the module did not use it; unlike the
    Function's output, a view may be changed in place (``nn.ReLU(inplace=True)``, whose lost node
    :meth:`Recorder.module_exit` follows to the base's ``CopySlices``)."""
    if not kwargs and all(type(a) in _TENSORS for a in args):  # the usual call: tensors only
        return tuple(a.view_as(a) if a.requires_grad else a for a in args), kwargs
    return pytree.tree_map_only(Tensor, _view_if_grad, (args, kwargs))  # type: ignore[no-any-return]


def _view_if_grad(t: Tensor) -> Tensor:
    return t.view_as(t) if t.requires_grad else t


def own_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``module.named_parameters(recurse=False)`` without its generator machinery (called per forward)."""
    own = module._parameters
    if not own:
        return []
    out = []
    for name, p in own.items():
        if p is not None:
            out.append((name, p))
    n = len(out)
    if n == 2 and out[0][1] is out[1][1]:  # one parameter under two names: listed once, as torch does
        out.pop()
    elif n > 2:
        seen: set[int] = set()
        unique = []
        for name, p in out:
            if id(p) not in seen:
                seen.add(id(p))
                unique.append((name, p))
        out = unique
    return out


def param_grad_name(prefix: str) -> str:
    """``Module.{path}.{Class}.parameters_grad``: msprobe 8.3.3's name, no counter (one entry a step)."""
    return f"{prefix}.parameters_grad"


@dataclass(slots=True)
class ModuleCall:
    """One module forward in flight, from :meth:`Recorder.module_enter` to :meth:`Recorder.module_exit`."""

    prefix: str
    name: str
    bname: str  # its backward entry
    entry: dict[str, Any] | None
    selected: bool
    listed: bool  # matched ``list`` at mix: everything inside is recorded
    before: InputNodes  # its grad-requiring inputs and their nodes before the call
    #: the module's arguments with each grad-requiring tensor replaced by a view of itself (see
    #: :func:`through_views`), None where they are unchanged
    inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    #: ``(view, its node, its version)`` of each view in ``inputs``
    views: list[tuple[Tensor, Any, int]] | None = None


@dataclass(slots=True)
class Collective:
    """One collective in flight, from :meth:`Recorder.collective_enter` to its output."""

    prefix_api: str
    n: int
    name: str
    entry: dict[str, Any]
    selected: bool


class Recorder:
    """Entries of the current step for one rank, and everything needed to name and flush them.

    Capture front-ends report events, one method each, and never touch the state: an API call
    (:meth:`record_api`) and its gradients (:meth:`api_gradients`), a module's forward
    (:meth:`module_enter`, :meth:`module_exit`) and gradients (:meth:`module_output_grads`,
    :meth:`module_input_grads`), a parameter's gradient (:meth:`param_gradient`), a collective
    (:meth:`collective_enter`, :meth:`collective_exit`, :meth:`collective_output`) and a compiled region
    (:meth:`compiled_region`)."""

    def __init__(self, cfg: DebuggerConfig, rank: int, step: int,
                 background: BackgroundWriter | None = None) -> None:  # fmt: skip
        self.cfg = cfg
        self.rank = rank
        self.step = step
        self.tensors = cfg.task == "tensor"
        # One writer thread for the process (the debugger's), shared across steps so a step's files are
        # written while the next step trains; a recorder used on its own gets (and closes) its own.
        self._owns_background = background is None
        self.background = (BackgroundWriter(max_host_bytes=cfg.host_buffer_mb << 20) if background is None
                           else background)  # fmt: skip
        self.writer = self.background if self.tensors else None  # tensor files: task ``tensor`` only
        self._failed: set[Path] = set()  # rank dirs whose last write failed (writer thread only)
        self.lock = threading.RLock()
        self.want_fwd_in = cfg.wants("forward", "input")
        self.want_fwd_out = cfg.wants("forward", "output")
        self.want_bwd = cfg.wants("backward", "input") or cfg.wants("backward", "output")
        self.want_bwd_in = cfg.wants("backward", "input")
        self.want_bwd_out = cfg.wants("backward", "output")
        self.mix = cfg.level == "mix"
        self.modules_on = cfg.level in ("L0", "mix")
        # A planned dump (``statistics_for_all``): ``list`` chooses which calls get tensor files, not which
        # calls are recorded, so every call keeps its statistics entry and its name.
        self._select_list = () if cfg.statistics_for_all else cfg.api_list
        self._file_list = cfg.api_list if cfg.statistics_for_all else None
        # a full entry name (what ``parity plan`` writes) is looked up; anything else matches as a substring
        self._file_names = frozenset(i for i in cfg.api_list if parse_entry(i) is not None)
        self._file_parts = tuple(i for i in cfg.api_list if i not in self._file_names)
        self._file_entry: tuple[str, bool] = ("", False)  # the last entry asked about, and the answer
        # a plan lists full names only: whether an entry writes files is one set lookup, no list scan
        self._names_only = not self._file_parts
        self.filtered = bool(cfg.scope or self._select_list)
        self._extra_info = cfg.extra_info
        self._reset()

    # ----------------------------------------------------------------------------------------- step state
    def _reset(self) -> None:
        self._data: dict[str, Any] = {}
        self._api_counts: dict[str, int] = {}
        self._module_counts: dict[str, int] = {}
        self._param_grads: dict[str, dict[str, Any]] = {}  # module prefix -> its parameters_grad entry
        # parameter gradients whose statistics wait for their backward's end: (prefix, name) -> (grad, leaf)
        self._late_grads: dict[tuple[str, str], Later] = {}
        self._late_task: int | None = None  # the graph task whose end callback is queued
        # parameters recorded in forward entries, read when the forward is over, and their versions then
        self._late_params: list[Later] = []
        self._late_versions: list[int] = []
        # modules FSDP shards, recorded in a forward: prefix -> their sharded parameters (see module_exit)
        self._sharded: dict[str, Mapping[str, nn.Parameter]] = {}
        self._sharded_task: int | None = None  # the backward whose sharded gradients are to be read
        self._construct: dict[str, str | None] = {}
        self._module_stack: list[str] = []
        self._list_depth = 0  # > 0 while inside a module that matched ``list`` (mix: dump all inside)
        self._in_scope = False
        self._scope_done = False
        self._selected_modules: set[str] = set()
        # diff_check judges a call by its checksums when it returns: an md5 is computed then (as msprobe
        # does), not staged for the writer thread
        diff = self.cfg.bench_path is not None
        self.stats = StatsBuffer(md5=self.cfg.summary_mode == "md5",
                                 stage=None if diff else self.background.submit_host,
                                 fill_later=self.background.submit_call,
                                 xor=self.cfg.summary_mode == "xor")  # fmt: skip
        # statistics only (no tensor files to name): encoding a tensor is just its leaf
        self._stats_leaf = self.stats.leaf if self.writer is None else None
        # a planned dump's unlisted calls: the same leaf, the method bound once
        self._unlisted_leaf = self.stats.leaf if self._file_list is not None else None
        self.api_backward = ApiBackward(self.api_gradients)
        self._stacks = CallStacks()
        # (tensor, its hook, the hook's key) of the last single-tensor gradient hook added (see _grads_hook)
        self._last_fanout: tuple[Tensor, _GradFanout, Any] | None = None
        self.rank_dir = rank_dir_path(self.cfg.dump_path, self.step, self.rank)
        self.dir_writer = RankDirWriter(self.rank_dir)
        # tensor files' paths joined as strings: a Path a file costs more than the rest of its submission
        self._tensor_dir = f"{self.dir_writer.tensor_dir}{os.sep}"
        self._diff = self._live_diff_check() if diff else None
        self._dirty = False  # entries changed since the last flush
        self.flushed = False
        self.handed_over = False  # the step's live containers went to the writer (final flush)
        if self.tensors:
            self.dir_writer.prepare(tensors=True)

    @property
    def data(self) -> dict[str, Any]:
        """The step's entries so far (read them; recording goes through the event methods)."""
        return self._data

    def _live_diff_check(self) -> LiveDiffCheck:
        """This step's divergence dump against the baseline's same step and rank; a step the baseline
        lacks keeps statistics and checksums only (no call can be judged), with a warning."""
        assert self.cfg.bench_path is not None
        try:
            baseline = Baseline.load(self.cfg.bench_path, self.step, self.rank)
        except ConfigError as exc:
            log.warning("parity: diff_check: %s; step %d (rank %d) gets statistics and checksums only",
                        exc, self.step, self.rank)  # fmt: skip
            baseline = Baseline({}, DataFlow({}))
        writer = self.writer
        assert writer is not None
        tensor_dir = self._tensor_dir
        return LiveDiffCheck(DiffCheck(baseline, self.cfg.diff_nums),
                             lambda name, t: writer.submit(tensor_dir + name, t))  # fmt: skip

    def _judge(self, entry: str) -> None:
        """diff_check: a forward call's outputs are recorded; judged where the baseline has it."""
        diff = self._diff
        if diff is None or diff.check.done or entry not in diff.check.baseline.calls:
            if diff is not None:
                diff.call_done(entry, {})  # no longer wanted, nothing to judge
            return
        record = self._data.get(entry)
        if record is None:
            return
        if self.stats.xor is not None and self.stats.xor.pending:
            self.stats.xor.resolve()  # this call's checksums (one read of them)
        diff.call_done(entry, record)

    # ------------------------------------------------------------------------------------------ filters
    def selected(self, name: str) -> bool:
        """``scope`` (inclusive range in call order) and ``list`` (full names or substrings) for one entry.

        Called for every outermost call, filtered or not, because the scope range is positional."""
        if not self.filtered:
            return True
        cfg = self.cfg
        if cfg.scope:
            if not self._in_scope and not self._scope_done and name == cfg.scope[0]:
                self._in_scope = True
            hit = self._in_scope
            if self._in_scope and name == cfg.scope[1]:
                self._in_scope, self._scope_done = False, True
            if not hit:
                return False
        if self._select_list:
            return self._list_depth > 0 or any(item == name or item in name for item in self._select_list)
        return True

    def _wants_file(self, entry: str) -> bool:
        """A planned dump: whether ``entry`` is listed, by its full name or, for an item that is no entry
        name (``"gelu"``), as msprobe matches: a substring. A full name matches itself only, where msprobe
        would also take ``Module.m.M.forward.10`` for ``...forward.1``."""
        if self._names_only:
            return entry in self._file_names
        last, answer = self._file_entry
        if entry != last:
            answer = entry in self._file_names or any(item in entry for item in self._file_parts)
            self._file_entry = (entry, answer)
        return answer

    # ----------------------------------------------------------------------------------------- encoding
    def tensor_leaf(
        self, t: Tensor, entry: str, category: str, path: tuple[int | str, ...]
    ) -> dict[str, Any]:
        if self._diff is not None:
            return self._diff_leaf(t, entry, tensor_file(entry, category, path))
        data_name = None
        if self.writer is not None and (self._file_list is None or self._wants_file(entry)):
            data_name = tensor_file(entry, category, path)
            self.writer.submit(self._tensor_dir + data_name, t)
        self._dirty = True
        return self.stats.leaf(t, data_name)

    def _diff_leaf(self, t: Tensor, entry: str, data_name: str) -> dict[str, Any]:
        """diff_check: the leaf names the tensor's file while the call may still get one (held till then)."""
        diff = self._diff
        assert diff is not None
        self._dirty = True
        if not diff.wants(entry):
            return self.stats.leaf(t)
        leaf = self.stats.leaf(t, data_name)
        diff.hold(entry, data_name, t, leaf)
        return leaf

    def encode(
        self, value: Any, entry: str, category: str, path: tuple[int | str, ...], key: str | None = None
    ) -> Any:
        """One value as a dump.json leaf (§4.3 table); ``key`` is the kwarg name (dtype/device quirks)."""
        if isinstance(value, Tensor):
            if self.writer is None:  # statistics only: no file name to make (callers set ``_dirty``)
                return self.stats.leaf(value)
            return self.tensor_leaf(value, entry, category, path)
        if value is None:
            return None
        if isinstance(value, _SCALARS):
            return {"type": type(value).__name__, "value": value}
        if isinstance(value, torch.Size):
            return {"type": "torch.Size", "value": list(value)}
        if isinstance(value, (list, tuple)):
            fields = getattr(value, "_fields", None)
            if fields is not None:  # namedtuple -> object keyed by field
                pairs = zip(fields, value, strict=True)
                return {f: self.encode(v, entry, category, (*path, f)) for f, v in pairs}
            return [self.encode(v, entry, category, (*path, i)) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {
                str(k): self.encode(v, entry, category, (*path, str(k)), str(k)) for k, v in value.items()
            }
        if isinstance(value, slice):
            return {"type": "slice", "value": [_plain(value.start), _plain(value.stop), _plain(value.step)]}
        if value is Ellipsis:
            return {"type": "ellipsis", "value": "..."}
        if isinstance(value, torch.dtype):
            return {"type": "torch.dtype", "value": str(value)} if key in ("dtype", "output_dtype") else {}
        if isinstance(value, torch.device):
            return {"type": "torch.device", "value": f"{value.type}:{value.index}"} if key == "device" else {}
        if isinstance(value, torch.memory_format):
            return {"type": "torch.memory_format", "format": str(value).rsplit(".", 1)[-1]}
        return _encode_special(value)

    def _leaf_for(self, entry: str) -> Callable[[Tensor], dict[str, Any]] | None:
        """The statistics-only leaf maker where ``entry`` writes no tensor file (None: ``encode`` names one);
        a planned dump's unlisted calls take it, at a statistics dump's cost."""
        if self._file_list is None:
            return self._stats_leaf
        if self._names_only:
            return None if entry in self._file_names else self._unlisted_leaf
        return None if self._wants_file(entry) else self._unlisted_leaf

    def encode_inputs(self, entry: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        enc = self.encode
        leaf = self._stats_leaf if self._file_list is None else self._leaf_for(entry)
        if leaf is None:
            return {
                "input_args": [enc(v, entry, "input", (i,)) for i, v in enumerate(args)],
                "input_kwargs": {k: enc(v, entry, "kwargs", (k,), k) for k, v in kwargs.items()},
            }
        # statistics only: a tensor (most arguments) goes straight to its leaf, one call instead of two;
        # loops, not comprehensions (each one more function call in this Python), for the usual few values
        shown_args = []
        for i, v in enumerate(args):
            shown_args.append(leaf(v) if isinstance(v, Tensor) else enc(v, entry, "input", (i,)))
        shown_kwargs = {}
        for k, v in kwargs.items():
            shown_kwargs[k] = leaf(v) if isinstance(v, Tensor) else enc(v, entry, "kwargs", (k,), k)
        return {"input_args": shown_args, "input_kwargs": shown_kwargs}

    def encode_output(self, entry: str, out: Any) -> list[Any]:
        """``output`` is always a list: a lone tensor/None becomes a one-element list (§4.2)."""
        leaf = self._stats_leaf if self._file_list is None else self._leaf_for(entry)
        if leaf is not None and isinstance(out, Tensor):
            return [leaf(out)]
        if isinstance(out, (list, tuple)) and getattr(out, "_fields", None) is None:
            return self.encode_grads(entry, "output", out)
        return [self.encode(out, entry, "output", (0,))]

    def encode_grads(self, entry: str, category: str, grads: Any) -> list[Any]:
        enc = self.encode
        leaf = self._stats_leaf if self._file_list is None else self._leaf_for(entry)
        if leaf is None:
            return [enc(g, entry, category, (i,)) for i, g in enumerate(grads)]
        return [leaf(g) if isinstance(g, Tensor) else enc(g, entry, category, (i,))
                for i, g in enumerate(grads)]  # fmt: skip

    # ----------------------------------------------------------------------------------- stack / construct
    def api_parent(self, fwd: str, bwd: str | None = None) -> None:
        """mix: every API maps to the innermost active module, forward and backward (§4.5); ``bwd``: the
        backward name of ``fwd`` where the caller has it."""
        parent = self._module_stack[-1] if self._module_stack else None
        self._construct[fwd] = parent
        self._construct[bwd or backward_of(fwd)] = backward_of(parent) if parent else None

    # ------------------------------------------------------------------------------------------ the API
    def record_api(self, prefix_api: str, func: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any], frame: FrameType | None,
                   shown: tuple[tuple[Any, ...], dict[str, Any]] | None = None) -> Any:  # fmt: skip
        """Run one outermost API call and record it (inputs before the call: in-place ops mutate them).

        ``shown``: the arguments as the caller spelled them (what the dump records), where that differs
        from how ``func`` is called."""
        n = self._api_counts.get(prefix_api, 0)
        fwd = f"{prefix_api}.{n}.forward"
        bwd = f"{prefix_api}.{n}.backward"  # backward_of(fwd)
        if self.mix:
            self.api_parent(fwd, bwd)
        grad_on = _is_grad_enabled()
        track = self.want_bwd and grad_on
        before: InputNodes = input_nodes(args, kwargs) if track else []
        if self.filtered and not self.selected(fwd):
            out = func(*args, **kwargs)
            self._api_counts[prefix_api] = n + 1
            if before:  # not recorded, but it may change a recorded view in place
                self.api_backward.follow_inplace(before)
            return out
        entry: dict[str, Any] | None = None
        self._dirty = True
        # grad off around the tool's own tensor work (its copies), set directly: two per recorded call
        if self.want_fwd_in:
            _set_grad_enabled(False)
            try:
                entry = self.encode_inputs(fwd, *(shown or (args, kwargs)))
            finally:
                _set_grad_enabled(grad_on)
            self._data[fwd] = entry
        recompute = _graph_task_id() >= 0  # a forward call while a backward runs: a recomputation
        if recompute:
            if entry is None:
                entry = self._data[fwd] = {}
            entry["is_recompute"] = True  # msprobe's key, where msprobe places it (before ``output``)
        out = func(*args, **kwargs)
        self._api_counts[prefix_api] = n + 1
        if self.want_fwd_out:
            grad_now = _is_grad_enabled()  # the call may have changed it (torch.set_grad_enabled)
            _set_grad_enabled(False)
            try:
                if prefix_api in UNINITIALISED and type(out) is not tuple and isinstance(out, Tensor):
                    encoded = [self.stats.unwritten(out, prefix_api)]
                else:
                    encoded = self.encode_output(fwd, out)
            finally:
                _set_grad_enabled(grad_now)
            if entry is None:
                entry = self._data[fwd] = {}
            entry["output"] = encoded
            if self._diff is not None:
                self._judge(fwd)
        if entry is not None and self._extra_info:
            self._stacks.record(fwd, frame)
        if track:
            self.api_backward.after_call(bwd, out, before)
        return out

    def api_gradients(self, name: str, of_outputs: Any, of_inputs: Any) -> None:
        """One API call's gradients arrived: of its outputs (msprobe ``input``), its inputs (``output``)."""
        with self.lock, quiet():
            self._dirty = True
            entry: dict[str, Any] = {}
            if self.want_bwd_in:
                entry["input"] = self.encode_grads(name, "input", of_outputs)
            if self.want_bwd_out:
                entry["output"] = self.encode_grads(name, "output", of_inputs)
            self._data[name] = entry

    # --------------------------------------------------------------------------------- compiled regions
    def compiled_region(self, marker: str) -> None:
        """One call of a ``torch.compile`` graph: a marker entry (its ops are not captured)."""
        n = self._api_counts.get(marker, 0)
        self._api_counts[marker] = n + 1
        name = f"{marker}.{n}.forward"
        if self.selected(name):
            self._data[name] = {"input_args": [], "input_kwargs": {}, "output": []}
            self._dirty = True

    # ------------------------------------------------------------------------------------------ modules
    def module_enter(self, prefix: str, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                     frame: FrameType | None) -> ModuleCall:  # fmt: skip
        """A module's forward starts: its name, construct parent, inputs and input-gradient hooks."""
        counts = self._module_counts
        n = counts.get(prefix, 0)
        counts[prefix] = n + 1
        name = f"{prefix}.forward.{n}"
        bname = f"{prefix}.backward.{n}"  # backward_of(name)
        stack = self._module_stack
        self._construct[name] = stack[-1] if stack else None
        stack.append(name)
        selected = self.selected(name) if self.filtered else True
        listed = False
        if self.mix:
            api_list = self.cfg.api_list
            listed = bool(api_list) and any(i == name or i in name for i in api_list)
            if listed:
                self._list_depth += 1
        grad_on = _is_grad_enabled()
        # an in-place module (nn.ReLU(inplace=True)) may drop the node of a recorded view it updates
        before = input_nodes(args, kwargs) if self.want_bwd and grad_on else []
        entry: dict[str, Any] | None = None
        inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        views: list[tuple[Tensor, Any, int]] | None = None
        if selected:
            self._dirty = True
            self._selected_modules.add(prefix)
            # quiet(), inline: this runs for every module call
            tf = _DisableTorchFunction()
            tf.__enter__()
            try:
                if self.want_bwd_out and before:  # (grad on): the views take part in autograd
                    inputs = through_views(args, kwargs)
                    views = [(v, v.grad_fn, v._version) for v in grad_tensors(inputs, [])]
                if grad_on:
                    _set_grad_enabled(False)
                if self.want_fwd_in:
                    entry = self.encode_inputs(name, args, kwargs)
                    self._data[name] = entry
                if views:
                    self._grads_hook([v for v, _, _ in views], bname, False)
            finally:
                if grad_on:
                    _set_grad_enabled(True)
                tf.__exit__(None, None, None)
            if self._extra_info:
                self._stacks.record(name, frame)
        return ModuleCall(prefix, name, bname, entry, selected, listed, before, inputs, views)

    def module_exit(self, call: ModuleCall, module: nn.Module, output: Any,
                    sharded: Mapping[str, nn.Parameter] | None = None) -> None:  # fmt: skip
        """A module's forward returned: its outputs, parameters, gradient slots and output-gradient hooks.

        ``sharded``: the module's parameters as FSDP registered them (its sharded parameters) where FSDP
        shards it: the parameters are read now (their gathered storage is freed when the unit reshards) and
        their gradients when the backward's callbacks are done (FSDP assigns them, after its
        reduce-scatter, where no accumulation hook sees them)."""
        if call.before and self.api_backward.views:
            self.api_backward.follow_inplace(call.before)
        views = call.views
        if views and len(views) == 1:
            view, node, version = views[0]
            if view._version != version and view.grad_fn is not node:  # changed in place by the module
                self.api_backward.rebased(view, [(node, partial(self._module_input_rebased, call.bname))])
        if call.listed:  # leaving a module that matched ``list`` at mix: APIs after it are filtered again
            self._list_depth -= 1
        name = call.name
        stack = self._module_stack
        if stack and stack[-1] == name:
            stack.pop()
        if not call.selected:
            return
        self._dirty = True  # a flush since module_enter (stop() in the forward) wrote the entry without it
        entry = call.entry
        grad_on = _is_grad_enabled()
        params: list[tuple[str, nn.Parameter]] | None = None
        # quiet(), inline: this runs for every module call
        tf = _DisableTorchFunction()
        tf.__enter__()
        if grad_on:
            _set_grad_enabled(False)
        try:
            if self.want_fwd_out:
                if entry is None:
                    entry = {}
                entry["output"] = self.encode_output(name, output)
                params = own_parameters(module)
                # present, maybe empty, as msprobe writes it
                if self._stats_leaf is not None and not sharded:
                    entry["parameters"] = self._param_leaves(params)
                else:  # read now: a sharded module's gathered parameters are freed when its unit reshards
                    leaf = self.tensor_leaf
                    entry["parameters"] = {p: leaf(t, name, "parameters", (p,)) for p, t in params}
            if entry is not None:
                if _graph_task_id() >= 0:  # a forward while a backward runs: a recomputation (checkpoint)
                    entry["is_recompute"] = True
                self._data.pop(name, None)
                self._data[name] = entry  # re-inserted at completion: a module follows its APIs (§4.4)
                if self._diff is not None and "output" in entry:
                    self._judge(name)
            prefix = call.prefix
            if self.want_bwd and prefix not in self._param_grads:
                # msprobe 8.3.3 reserves the gradient entry right after the module's first forward (with
                # grad or not: a reentrant checkpoint's first forward has none), one ``[null]`` per trainable
                # parameter, filled when the gradient arrives
                own = params if params is not None else own_parameters(module)
                slots = {p: [None] for p, t in own if t.requires_grad}
                if slots:
                    self._param_grads[prefix] = slots
                    self._data[param_grad_name(prefix)] = slots
            if sharded and self.want_bwd and grad_on:
                self._sharded[prefix] = sharded
            if self.want_bwd_in and grad_on:
                if type(output) in _TENSORS:
                    outs = [output] if output.requires_grad else []
                else:
                    outs = grad_tensors(output, [])
                bname = call.bname
                if outs:
                    self._grads_hook(outs, bname, True)
                if len(outs) == 1 and outs[0]._is_view():  # its hook is lost if it is updated in place
                    self.api_backward.watch_view(outs[0], partial(self._module_rebased, bname))
        finally:
            if grad_on:
                _set_grad_enabled(True)
            tf.__exit__(None, None, None)

    def forward_done(self) -> None:
        """A model given to ``start()`` returned from its forward: the statistics of the parameters its
        modules recorded are read now (one stack per shape for all of them)."""
        if self._late_params:
            with self.lock, quiet():
                self._take_late_params()

    def _param_leaves(self, params: list[tuple[str, nn.Parameter]]) -> dict[str, Any]:
        """A module's parameters' leaves in its forward entry, their statistics read when the forward is
        over (:meth:`forward_done`; or when the backward starts or the step is flushed, for a module called
        on its own). Nothing writes a parameter during a forward; an in-place write would show in its
        version and is noted on the leaf (see _take_late_params). A ``.data`` write does not show: it goes
        unseen."""
        later, leaves = self.stats.later, {}
        for p, t in params:
            late = later(t)
            if late is None:
                leaves[p] = self.stats.leaf(t)
            else:
                self._late_params.append(late)
                self._late_versions.append(t._version)
                leaves[p] = late[2]
        return leaves

    def _take_late_params(self) -> None:
        late = self._late_params
        if not late:
            return
        versions = self._late_versions
        self._late_params, self._late_versions = [], []
        for (t, _, leaf), version in zip(late, versions, strict=True):
            if t._version != version:
                leaf["note"] = "written in place later in the forward: statistics of the value after that"
                _warn_once("parity: a parameter was written in place during the forward; its statistics in "
                           "the forward entry are those after the write (noted on its leaf)")  # fmt: skip
        self.stats.take_later(late)

    def _grads_hook(self, tensors: list[Tensor], name: str, of_outputs: bool) -> None:
        """Record the gradients of all ``tensors`` (a module's outputs, ``of_outputs``, or its inputs) in the
        backward entry ``name`` once they all arrived (``register_multi_grad_hook``, mode all).

        Most modules take and return one tensor: its own hook is the same event (it fires once per backward,
        with that gradient) without the multi-hook's per-call closures, lock and graph-task bookkeeping. When
        the tool's own last hook is still the last one on that tensor (the previous module's output is this
        module's input), this module joins it: one hook call instead of two, the entries in the same order,
        the gradient's leaf encoded once."""
        if len(tensors) != 1:
            record = self.module_output_grads if of_outputs else self.module_input_grads
            register_multi_grad_hook(tensors, partial(record, name))
            return
        t = tensors[0]
        last = self._last_fanout
        if last is not None and last[0] is t and last_hook_key(t) == last[2]:
            last[1].items.append((name, of_outputs))
            return
        fanout = _GradFanout(self, name, of_outputs)
        self._last_fanout = (t, fanout, add_tensor_hook(t, fanout))

    def module_output_grads(self, name: str, grads: Sequence[Tensor | None]) -> None:
        """Gradients of a module's outputs arrived (msprobe's backward ``input``)."""
        self.module_grads(((name, True),), grads)

    def _module_rebased(self, name: str, g_view: Tensor | None, _: Any) -> None:
        self.module_output_grads(name, (g_view,))

    def _module_input_rebased(self, name: str, g_view: Tensor | None, _: Any) -> None:
        self.module_input_grads(name, (g_view,))

    def module_input_grads(self, name: str, grads: Sequence[Tensor | None]) -> None:
        """Gradients of a module's inputs arrived (backward ``output``): the module's backward is complete."""
        self.module_grads(((name, False),), grads)

    def module_grads(self, items: Sequence[tuple[str, bool]], grads: Sequence[Tensor | None]) -> None:
        """The same gradients for each ``(backward entry, of its module's outputs)`` of ``items``, in order:
        of a module's outputs, its backward ``input``; of its inputs, its ``output``, and the module's
        backward is complete. Without tensor files the leaves are the same for every item: encoded once."""
        with self.lock, quiet():
            self._dirty = True
            if self._late_params:  # the backward started: the forward is over
                self._take_late_params()
            if self._sharded and self._sharded_task != _graph_task_id():
                self._sharded_grads_later()
            data = self._data
            # statistics only, one tensor (the usual gradient): its leaf, without encode_grads' calls
            one = self._stats_leaf if len(grads) == 1 and type(grads[0]) is Tensor else None
            encoded: list[Any] | None = None
            for name, of_outputs in items:
                entry: dict[str, Any] | None = data.get(name)
                if entry is None:
                    entry = data[name] = {}
                    if self.want_bwd_in:
                        entry["input"] = []
                    if self.want_bwd_out:
                        entry["output"] = []
                if encoded is not None and self.writer is None:
                    encoded = list(encoded)
                elif one is not None:
                    encoded = [one(grads[0])]  # type: ignore[arg-type]
                else:
                    encoded = self.encode_grads(name, "input" if of_outputs else "output", grads)
                if of_outputs:
                    entry["input"] = encoded
                else:
                    entry["output"] = encoded
                    # placed once the module's backward is complete, after the APIs inside it (msprobe's)
                    data.pop(name, None)
                    data[name] = entry

    def param_gradient(self, prefix: str, pname: str, grad: Tensor, param: Tensor | None = None) -> None:
        """A parameter's gradient was accumulated (``.grad``, what the optimizer sees)."""
        if not self.want_bwd or (self.filtered and prefix not in self._selected_modules):
            return
        with self.lock:
            # One entry per module and step, as msprobe 8.3.3 names it; a later accumulation (another
            # micro-batch) overwrites the leaf, so the entry ends with the gradient the optimizer sees.
            entry = self._param_grads.get(prefix)
            if entry is None:
                entry = self._param_grads[prefix] = {}
                self._data[param_grad_name(prefix)] = entry
            self._dirty = True
            # statistics only, no torch-function mode to hide from (later() runs no operator): read when
            # this backward ends (one stack per shape for all of them), as the optimizer will see it; a
            # later accumulation in the same backward replaces it
            if self.writer is None and not _tf_mode_on():
                late = self.stats.later(grad) if param is None else self.stats.later_grad(grad, param)
            else:
                late = None
            if late is not None and (self._late_task == _graph_task_id() or self._grads_later()):
                self._late_grads[(prefix, pname)] = late
                entry[pname] = [late[2]]
                return
            with quiet():
                data_name = None
                if self._diff is not None:
                    entry_name = param_grad_name(prefix)
                    entry[pname] = [self._diff_leaf(grad, entry_name, param_grad_file(entry_name, pname))]
                    return
                if self.writer is not None:
                    entry_name = param_grad_name(prefix)
                    if self._file_list is None or self._wants_file(entry_name):
                        data_name = param_grad_file(entry_name, pname)
                        self.writer.submit(self._tensor_dir + data_name, grad)
                entry[pname] = [self.stats.leaf(grad, data_name)]

    def _sharded_grads_later(self) -> None:
        """Read the sharded parameters' gradients once this backward is over. FSDP queues its own final
        callback (which waits for the reduce-scatters and assigns the gradients) during the backward, maybe
        after this one: so this callback queues the reading behind every callback queued so far (the
        engine runs callbacks added while it runs them, in order)."""
        task = _graph_task_id()
        try:
            _queue_callback(partial(_queue_callback, partial(self._take_sharded_grads, task)))
        except RuntimeError:  # not in a backward: nothing to wait for
            return
        self._sharded_task = task

    def _take_sharded_grads(self, task: int) -> None:
        with self.lock:
            if self._sharded_task == task:
                self._sharded_task = None
            for prefix, params in list(self._sharded.items()):
                for pname, param in params.items():
                    grad = param.grad
                    if grad is not None:
                        self.param_gradient(prefix, pname, grad, param)

    def _grads_later(self) -> bool:
        """Whether the statistics of parameter gradients can wait for the end of the running backward: a
        callback queued once per backward (graph task) takes them; none can be queued outside one."""
        task = _graph_task_id()
        if task == self._late_task:
            return True
        self._take_late_params()  # the forward is over
        if self._late_grads:  # a backward that ended without running the callback (it raised)
            self._take_late_grads()
        try:
            _queue_callback(partial(self._end_of_backward, task))
        except RuntimeError:
            return False
        self._late_task = task
        return True

    def _end_of_backward(self, task: int) -> None:
        with self.lock:
            if task == self._late_task:
                self._late_task = None
            self._take_late_grads()

    def _take_late_grads(self) -> None:
        if self._late_grads:
            pairs = list(self._late_grads.values())
            self._late_grads.clear()
            self.stats.take_later(pairs)

    # -------------------------------------------------------------------------------------- collectives
    def collective_enter(self, prefix_api: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                         buffers: tuple[int | str, ...] = ()) -> Collective:  # fmt: skip
        """A ``torch.distributed`` collective is about to run: its name and inputs. ``buffers``: the
        positions (an index or a keyword) of the arguments it only writes (an all-gather's output): their
        leaves keep dtype and shape, not the values they hold before the call (uninitialised memory)."""
        n = self._api_counts.get(prefix_api, 0)
        name = f"{prefix_api}.{n}.forward"
        if self.mix:
            self.api_parent(name)
        call = Collective(prefix_api, n, name, {}, self.selected(name))
        if call.selected:
            with self.lock, quiet():
                self._dirty = True
                if self.want_fwd_in:
                    encoded = self.encode_inputs(name, args, kwargs)
                    what = f"{prefix_api}'s output buffer"
                    for where in buffers:
                        if isinstance(where, int):
                            if where < len(args) and args[where] is not None:
                                encoded["input_args"][where] = self._unwritten(args[where], what)
                        elif kwargs.get(where) is not None:
                            encoded["input_kwargs"][where] = self._unwritten(kwargs[where], what)
                    call.entry.update(encoded)
                self._data[name] = call.entry
        return call

    def _unwritten(self, value: Any, what: str) -> Any:
        """:meth:`StatsBuffer.unwritten` for a tensor or each tensor of a list (an all-gather's outputs)."""
        if isinstance(value, Tensor):
            return self.stats.unwritten(value, what)
        if isinstance(value, (list, tuple)):
            return [self._unwritten(v, what) for v in value]
        return self.encode(value, "", "input", ())

    def collective_exit(self, call: Collective) -> bool:
        """The collective returned (maybe still running, ``async_op``); True if its output is wanted."""
        self._api_counts[call.prefix_api] = call.n + 1
        return call.selected and self.want_fwd_out

    def collective_output(self, call: Collective, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The collective's communication is complete: the post-call values of its args then kwargs."""
        with self.lock, quiet():
            self._dirty = True
            self.stats.forget()  # the collective wrote into its tensors without bumping their _version
            values = [*args, *kwargs.values()]
            call.entry["output"] = [self.encode(v, call.name, "output", (i,)) for i, v in enumerate(values)]
            if self._diff is not None:
                self._judge(call.name)

    # ------------------------------------------------------------------------------------------- flush
    def flush(
        self, *, final: bool = False, on_written: Callable[[int, int, Path], None] | None = None
    ) -> Path | None:
        """Resolve statistics and hand the step's documents to the writer thread; None if nothing recorded.

        The training thread only moves the statistics to the host (one copy per dtype) and enqueues. The
        documents handed off are never touched again: ``final`` (the step boundary) hands over the live
        containers and starts fresh ones, so a hook firing after the step cannot reach them; otherwise
        (``stop()``, recording may resume in this step) a snapshot is handed over. ``on_written`` runs on the
        writer thread after the files are completely written, and only if they were.
        """
        with self.lock, quiet():
            self._stacks.release_frames()  # held only while recording: frames keep their locals alive
            self._last_fanout = None  # nor this tensor
            self._take_late_grads()  # a flush inside the backward: the gradients as they are now
            self._take_late_params()  # or inside a forward
            if self._dirty and not self.handed_over:  # after the final hand-off, late hooks are not written
                if self._diff is not None:
                    self._diff.settle()  # the held tensors' leaves name no file: none was written
                    if final:
                        log.info(self._diff.summary(self.step, self.rank))
                self.stats.resolve()
                docs = self._take_documents() if final else self._snapshot_documents()
                self.background.submit_call(partial(self._write, self.dir_writer, *docs), document=True,
                                            syncs_files=True)  # fmt: skip
                self._dirty = False
                self.flushed = True
            if not self.flushed:  # unchanged since the last flush and never written: nothing to hand on
                return None
            if on_written is not None:
                done = partial(self._after_write, on_written, self.step, self.rank, self.rank_dir)
                self.background.submit_call(done)
            return self.rank_dir

    def _snapshot_documents(self) -> _Documents:
        """Copies deep enough that later recording cannot change them.

        Recording after a flush only ever sets keys of an entry dict (``output``, backward ``input``, a
        parameter's grad) or adds entries, stack names and construct keys; the values it stores are new
        objects and resolved leaves are final. So one level of entry copies is a complete snapshot."""
        data = {k: dict(v) if type(v) is dict else v for k, v in self._data.items()}
        return data, self._stacks.snapshot(), dict(self._construct)

    def _take_documents(self) -> _Documents:
        """The live containers, replaced by fresh ones (what late hooks of this step may still touch)."""
        self._stacks.release_frames()
        docs = self._data, self._stacks.groups, self._construct
        self.handed_over = True
        self._data = {}
        self._param_grads = {}  # its dicts are entries of the data handed off
        self._construct = {}
        self._stacks = CallStacks()
        return docs

    def _write(self, dir_writer: RankDirWriter, data: dict[str, Any], stacks: Stacks,
               construct: dict[str, str | None]) -> None:  # fmt: skip
        """Writer thread: the rank directory's JSON files (tensor files queued before are already saved)."""
        extra = self.cfg.extra_info
        try:
            dir_writer.write(
                task=self.cfg.task,
                level=self.cfg.level,
                data=data,
                tensors=self.tensors,
                stacks=stacks if extra else None,
                construct=(construct if self.modules_on else {}) if extra else None,
                before_commit=self.background.files_synced,  # the tensor files it names are durable first
            )
        except Exception:
            self._failed.add(dir_writer.rank_dir)
            raise  # logged (once) by the writer
        self._failed.discard(dir_writer.rank_dir)

    def _after_write(self, on_written: Callable[[int, int, Path], None], step: int, rank: int,
                     rank_dir: Path) -> None:  # fmt: skip
        if rank_dir in self._failed:
            log.debug("parity: %s was not written completely; not handed on", rank_dir)
            return
        on_written(step, rank, rank_dir)

    def close(self) -> None:
        """Let go of the step's entries (the last flush wrote them) and stop this recorder's own writer
        thread (after its queue is written); a shared one stays.

        A recorder outlives its step: its ApiBackward calls back into it (a reference cycle), and hooks on
        tensors that outlive the step hold it. Its entries and leaves, thousands of objects a step, would
        then wait for the garbage collector, whose next pass walks every one of them; dropped here, they
        are freed at once."""
        with self.lock:
            if not self.handed_over:
                # freed on the writer thread, like the documents it wrote: tens of thousands of objects a
                # step at L1, whose deallocation would otherwise be the training thread's
                self.background.submit_call(partial(_let_go, self._take_documents()))
            self.api_backward.forget_views()
        if self._owns_background:
            self.background.close()


def _let_go(*_: object) -> None:
    """A job that only holds what it is given: freed where the job is dropped (the writer thread)."""


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


def _plain(v: Any) -> Any:
    return v if v is None or isinstance(v, _SCALARS) else None


def _encode_special(value: Any) -> Any:
    """Distributed objects, numpy values; anything else unsupported is ``null`` (§4.3)."""
    cls = type(value).__name__
    if cls in ("ProcessGroup", "ProcessGroupGloo", "ProcessGroupNCCL"):
        try:
            import torch.distributed as dist

            ranks = dist.get_process_group_ranks(value)
        except Exception:  # not a usable group (destroyed, or not a member): still a valid leaf
            ranks = []
        return {"type": "torch.ProcessGroup", "group_ranks": ranks,
                "group_id": str(zlib.crc32(str(ranks).encode()) & 0xFFFFFFFF)}  # fmt: skip
    if cls == "ReduceOp" or cls == "RedOpType":
        return {"type": "torch.distributed.ReduceOp", "value": str(value)}
    module = type(value).__module__
    if module == "numpy":
        if hasattr(value, "shape") and hasattr(value, "dtype") and cls == "ndarray":
            return {"type": "numpy.ndarray", "dtype": str(value.dtype), "shape": list(value.shape)}
        if hasattr(value, "item"):
            return {"type": str(value.dtype), "value": value.item()}
    return None
