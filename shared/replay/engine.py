"""Float64 replay: run a recorded call again on the CPU in float64, from each side's own recorded inputs, and
say which side's recorded output sits farther from its replay than rounding allows.

Each side is judged against itself: the target's output against the target's inputs replayed, the bench's
against the bench's. Inputs that already differ between the sides therefore do not count against a call; a
kernel that computes wrongly does, on the side that ran it::

    target output 2.1e-02 from its float64 replay, bench 3.0e-08 (rounding allows 1.9e-06: float32, K=16):
    the target's kernel is wrong

Forward: the callable comes from the allow-list (:mod:`parity.shared.replay.apis`) and gets the recorded
positional and keyword arguments, floating tensors and dtypes raised to float64. Backward: the forward is
replayed with autograd on, and the autograd node of its first output (the node msprobe and Parity's client
hook) is called with the recorded gradients of the outputs (the backward entry's ``input``); its result, the
gradients of the inputs in the node's own order, is judged against the entry's ``output``.

A call that cannot be replayed says why (:class:`ReplayRefusal`): a missing tensor file, a module call, a
custom op or an API not on the list, randomness, an input overwritten in place, arguments that do not rebuild,
a replay too large. Nothing a dump holds is evaluated or imported, tensors load weights-only, and the size of
every replay is bounded before it runs (shapes first inferred on the ``meta`` device).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from parity.shared.dump.layout import DUMP_JSON, TENSOR_DIR
from parity.shared.dump.naming import parse_entry
from parity.shared.dump.reader import read_json
from parity.shared.errors import DumpError
from parity.shared.replay.apis import ReplayRefusal, is_random, resolve
from parity.shared.replay.arguments import RecordedCall, is_tensor_leaf, tensor_file_names
from parity.shared.replay.cost import check_gradients, trace_backward, trace_forward
from parity.shared.replay.precision import held_format
from parity.shared.replay.rounding import reduction_length, rounding_allowance
from parity.shared.replay.verdicts import ReplayVerdict, SideReplay, Verdict, verdict_of
from parity.shared.tensor_io import DEFAULT_LIMITS, TensorLimits

__all__ = [
    "Allowance",
    "DumpSide",
    "ReplayVerdict",
    "SideReplay",
    "Verdict",
    "iter_replays",
    "replay_calls",
    "replay_files",
]

logger = logging.getLogger(__name__)

#: Elements one side's replay may load or produce (float64: 512 MiB); a larger call is refused.
DEFAULT_MAX_ELEMENTS = 2**26
#: the bench side of a gap (calls without a partner, judged as one): another computation, nothing to replay
GAP_REFUSAL = "the bench computes this call as other calls (a gap of the alignment): nothing to replay there"
#: Operations one side's replay may take (``replay.cost``: about a minute of float64 on one CPU core).
MAX_FLOPS = 2**36
#: ``allowance(dtype, K)``: the rounding a correct kernel may add (swap in a fuller expected-error model).
Allowance = Callable[[torch.dtype, int], float]


class DumpSide:
    """One side's dump.json (read once, on first use) and its ``dump_tensor_data`` directory."""

    def __init__(self, name: str, dump_json: Path, limits: TensorLimits = DEFAULT_LIMITS) -> None:
        self.name = name
        self.dump_json = Path(dump_json)
        self.limits = limits  # of each tensor load
        self.tensor_dir = self.dump_json.parent / TENSOR_DIR
        self._data: dict[str, Any] | None = None

    def data(self) -> dict[str, Any]:
        if self._data is None:
            doc = read_json(self.dump_json, DUMP_JSON)
            data = doc.get("data") if isinstance(doc, dict) else None
            if not isinstance(data, dict):
                raise DumpError(self.dump_json, "has no 'data' object")
            self._data = data
        return self._data

    def entry(self, name: str) -> dict[str, Any]:
        value = self.data().get(name)
        if value is None:
            raise ReplayRefusal(f"{self.name}: no entry {name} in its dump.json")
        if not isinstance(value, dict):
            raise ReplayRefusal(f"{self.name}: entry {name} is not an object")
        return value


def _forward_name(entry: str) -> tuple[str, str, str, str]:
    """``(prefix, api, direction, forward entry)`` of an API entry; refusal for anything else."""
    parsed = parse_entry(entry)
    if parsed is None:
        raise ReplayRefusal(f"{entry} is not a dump entry name")
    if parsed.kind != "api":
        raise ReplayRefusal("module call: the replay runs single API calls (Torch, Functional, Tensor, VF); "
                            "the module's own calls are in an L1 or mix dump")  # fmt: skip
    return parsed.prefix, parsed.name, parsed.direction or "forward", parsed.forward


def _plain(record: Any) -> Any:
    """A recorded argument's scalar value, without loading anything (for the randomness test)."""
    if isinstance(record, dict) and "value" in record and not is_tensor_leaf(record):
        return record["value"]
    return record


def _tensors(value: Any, out: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """A call's result flattened like dump.json's ``output`` (a lone tensor is a one-element list)."""
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tensors(v, out)
    else:
        out.append(None)
    return out


def _index(value: Any) -> Any:
    """A recorded index as ``x[...]`` received it. JSON keeps ``x[:, 0]``'s tuple as a list; a list of plain
    ints is advanced indexing (``x[[0, 2]]``) and stays a list, anything else was a tuple."""
    if isinstance(value, list) and not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    return value


def _bound_size(func: Callable[..., Any], api: str, args: list[Any], kwargs: dict[str, Any],
                max_elements: int) -> None:  # fmt: skip
    """Infer the replay's output sizes and cost on the meta device (nothing allocated, ``replay.cost``);
    refuse a replay over budget."""
    try:
        out, trace = trace_forward(func, api, args, kwargs)
    except ReplayRefusal:
        raise
    except Exception as exc:  # noqa: BLE001 - no meta kernel, or a data-dependent shape
        message = " ".join(str(exc).split())[:200]
        if isinstance(exc, TypeError):  # the recorded arguments do not bind to the API's signature
            why = f"its recorded arguments do not make a valid call of {api}: {message}"
        else:
            why = f"the size of its replay cannot be bounded beforehand ({type(exc).__name__}: {message})"
        raise ReplayRefusal(why) from None
    total = sum(int(t.numel()) for t in _tensors(out, []) if t is not None)
    if total > max_elements:
        raise ReplayRefusal(f"over budget: its replay would produce {total} elements, over the cap of "
                            f"{max_elements}")  # fmt: skip
    trace.check(max_elements, MAX_FLOPS)


def _call(func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    try:
        return func(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the recorded arguments do not make a valid float64 CPU call
        message = " ".join(str(exc).split())[:200]
        why = f"the call fails on the CPU in float64: {type(exc).__name__}: {message}"
        raise ReplayRefusal(why) from None


def _squared_errors(recorded: torch.Tensor, replay: torch.Tensor) -> tuple[float, float, int]:
    """``(||recorded - replay||^2, ||replay||^2, elements)`` in float64 over the finite values; non-finite
    values must sit at the same places with the same value, else the difference is infinite."""
    r, e = recorded.detach().to(torch.float64).reshape(-1), replay.detach().to(torch.float64).reshape(-1)
    finite_r, finite_e = torch.isfinite(r), torch.isfinite(e)
    if not torch.equal(finite_r, finite_e):
        return math.inf, 0.0, int(r.numel())
    if not bool(finite_r.all()):
        odd = ~finite_r
        same = (r[odd] == e[odd]) | (torch.isnan(r[odd]) & torch.isnan(e[odd]))
        if not bool(same.all()):
            return math.inf, 0.0, int(r.numel())
        r, e = r[finite_r], e[finite_r]
    return float(torch.sum((r - e) ** 2)), float(torch.sum(e * e)), int(r.numel())


def _sum_to(grad: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """What autograd does to a node's gradient of a broadcast input before anyone sees it (``sum_to``): a
    node called directly skips that step."""
    try:
        return grad.sum_to_size(shape) if shape else grad.sum()
    except RuntimeError:
        return grad  # not a broadcast: the shape check names the mismatch


def _coarsest(tensors: Iterable[torch.Tensor | None]) -> torch.dtype | None:
    floats = [t.dtype for t in tensors if t is not None and t.is_floating_point()]
    return max(floats, key=lambda d: torch.finfo(d).eps) if floats else None


def _judge(recorded: Sequence[torch.Tensor | None], replayed: Sequence[torch.Tensor | None], what: str
           ) -> tuple[float, torch.dtype]:  # fmt: skip
    """The norm-wise distance of the recorded floating outputs from the replay's, taken together, and the
    coarsest dtype among them."""
    if len(recorded) != len(replayed):
        raise ReplayRefusal(f"the replay gives {len(replayed)} {what}, dump.json records {len(recorded)}")
    diff_sq = ref_sq = 0.0
    elements = 0
    judged: list[torch.Tensor] = []
    for i, (rec, rep) in enumerate(zip(recorded, replayed, strict=True)):
        if rec is None or not rec.is_floating_point():
            continue  # nothing recorded here, or indices and masks: rounding does not apply
        if rep is None:
            rep = torch.zeros_like(rec, dtype=torch.float64)  # autograd's "no gradient" is a zero gradient
        if tuple(rep.shape) != tuple(rec.shape) and what == "input gradients":
            rep = _sum_to(rep, tuple(rec.shape))
        if tuple(rep.shape) != tuple(rec.shape):
            raise ReplayRefusal(f"{what} {i}: the replay has shape {list(rep.shape)}, dump.json records "
                                f"{list(rec.shape)}")  # fmt: skip
        judged.append(rec)
        d, r, n = _squared_errors(rec, rep)
        diff_sq, ref_sq, elements = diff_sq + d, ref_sq + r, elements + n
    dtype = _coarsest(judged)
    if dtype is None:
        raise ReplayRefusal(f"no floating-point {what} to judge")
    # One norm over all of them: a gradient that cancels to about 0 (a bias behind a batch norm) holds only
    # rounding, which its own norm would blow up; beside its siblings it weighs what it is.
    if ref_sq > 0.0:
        return math.sqrt(diff_sq / ref_sq), dtype
    return math.sqrt(diff_sq / max(elements, 1)), dtype  # an all-zero replay: the absolute RMS difference


def _with_arguments(fwd: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """``fwd``'s record with ``other``'s non-tensor arguments: each positional one where both recorded a
    non-tensor there, and the keyword arguments as ``other`` passed them (a tensor keyword stays ``fwd``'s).
    The tensors stay ``fwd``'s: the target's inputs, asked what the bench asked."""
    args = list(fwd.get("input_args") or [])
    for i, (mine, theirs) in enumerate(zip(args, other.get("input_args") or [], strict=False)):
        if not is_tensor_leaf(mine) and not is_tensor_leaf(theirs):
            args[i] = theirs
    mine_kwargs, their_kwargs = fwd.get("input_kwargs") or {}, other.get("input_kwargs") or {}
    kwargs = {k: v for k, v in mine_kwargs.items() if is_tensor_leaf(v)}
    kwargs.update((k, v) for k, v in their_kwargs.items() if not is_tensor_leaf(v) or k not in kwargs)
    return {**fwd, "input_args": args, "input_kwargs": kwargs}


def _replay_side(side: DumpSide, entry: str, allowance: Allowance, max_elements: int,
                 asked: tuple[DumpSide, str] | None = None) -> SideReplay:  # fmt: skip
    """One side's replay of ``entry``, judged against its own recorded output; with ``asked`` (the other
    side and its entry), that side's arguments instead of this side's, judged against its output."""
    prefix, api, direction, forward = _forward_name(entry)
    fwd = side.entry(forward)
    judged_side, judged_entry = side, entry
    if asked is not None:
        judged_side, judged_entry = asked
        fwd = _with_arguments(fwd, judged_side.entry(_forward_name(judged_entry)[3]))
    raw_args, raw_kwargs = fwd.get("input_args") or [], fwd.get("input_kwargs") or {}
    if isinstance(raw_args, list) and isinstance(raw_kwargs, dict):
        plain_kwargs = {k: _plain(v) for k, v in raw_kwargs.items()}
        why = is_random(prefix, api, [_plain(a) for a in raw_args], plain_kwargs)
        if why is not None:
            raise ReplayRefusal(f"randomness: {why}; no replay reproduces its output")
    func = resolve(prefix, api)
    calls = RecordedCall(side.tensor_dir, side.name, max_elements=max_elements, limits=side.limits)
    judged = calls if judged_side is side else RecordedCall(judged_side.tensor_dir, judged_side.name,
                                                            max_elements=max_elements, limits=side.limits)
    backward = direction == "backward"
    bwd = side.entry(entry) if backward else None
    args, kwargs = calls.arguments(fwd, float64=True, grad=backward)
    if api == "__getitem__" and len(args) > 1:
        args[1] = _index(args[1])
    _bound_size(func, api, args, kwargs, max_elements)
    held = None
    if bwd is None:
        judged_forward = judged_side.entry(_forward_name(judged_entry)[3])
        recorded = judged.tensors_of(judged_forward.get("output"), "output", float64=False)
        with torch.no_grad():
            out = _tensors(_call(func, args, kwargs), [])
        distance, dtype = _judge(recorded, out, "outputs")
        k = reduction_length(entry, direction, fwd)
        held = held_format(recorded, [*args, *kwargs.values()])
    else:
        grads_out = calls.tensors_of(bwd.get("input"), "backward input", float64=True)
        recorded = judged.tensors_of(judged_side.entry(judged_entry).get("output"), "backward output",
                                     float64=False)  # fmt: skip
        trace_backward(func, api, args, kwargs, grads_out).check(max_elements, MAX_FLOPS)
        with torch.enable_grad():
            out = _tensors(_call(func, args, kwargs), [])
        check_gradients(out, grads_out)
        anchor = next((t for t in out if t is not None and t.grad_fn is not None), None)
        if anchor is None:
            raise ReplayRefusal("the replay builds no autograd node (no input that requires grad)")
        node: Any = anchor.grad_fn  # an autograd Node: calling it runs its backward function
        try:
            grads_in = node(*grads_out)
        except Exception as exc:  # noqa: BLE001 - the recorded gradients do not fit the node
            message = " ".join(str(exc).split())[:160]
            why = (f"the recorded backward does not fit the replay's {type(node).__name__} "
                   f"({len(grads_out)} output gradients recorded): {message}")  # fmt: skip
            raise ReplayRefusal(why) from None
        replayed = list(grads_in) if isinstance(grads_in, (list, tuple)) else [grads_in]
        if len(replayed) != len(recorded):
            raise ReplayRefusal(
                f"the recorded backward has {len(recorded)} input gradients, the replay's "
                f"{type(node).__name__} gives {len(replayed)}: the recorded autograd graph is another one "
                "(another kernel, or a wrapper around the call)"
            )
        distance, dtype = _judge(recorded, replayed, "input gradients")
        k = reduction_length(entry, direction, fwd)
        held = held_format(recorded, grads_out)
    return SideReplay(side.name, distance=distance, allowance=allowance(dtype, k), reduction_length=k,
                      dtype=str(dtype).replace("torch.", ""), held=held)  # fmt: skip


def replay_side(side: DumpSide, entry: str, *, allowance: Allowance = rounding_allowance,
                max_elements: int = DEFAULT_MAX_ELEMENTS,
                asked: tuple[DumpSide, str] | None = None) -> SideReplay:  # fmt: skip
    """One side's replay of ``entry``; a call that cannot be replayed comes back with its ``refusal``.
    ``asked``: replay this side's tensors with the other side's arguments, judged by that side's output."""
    try:
        return _replay_side(side, entry, allowance, max_elements, asked)
    except ReplayRefusal as why:
        return SideReplay(side.name, refusal=str(why))


def replay_calls(
    npu_dump: str | Path,
    bench_dump: str | Path,
    entries: Sequence[str],
    *,
    allowance: Allowance = rounding_allowance,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    limits: TensorLimits = DEFAULT_LIMITS,
    partners: Mapping[str, str] | None = None,
    asked: Mapping[str, str] | None = None,
    identical: Collection[str] = (),
) -> list[ReplayVerdict]:
    """Replay each entry (``Functional.linear.0.forward``, ``Tensor.__add__.3.backward``) on both sides.

    ``npu_dump`` is the target's dump.json, ``bench_dump`` the bench's; each dump.json is read once.
    ``allowance(dtype, K)`` is the rounding a correct kernel may add. ``partners``: the bench call an entry
    was paired with where its name differs (the compare's alignment), ``""`` for a gap (the bench computes it
    as other calls: only the target side is replayed). ``asked``: the entries whose target asked for other
    arguments than the bench, with those arguments in words: their target inputs are replayed with the
    bench's arguments too (the verdict ``arguments`` when that gives the bench's output). ``identical``:
    the entries whose inputs agree on both sides (no verdict then says the difference comes from them).
    Raises ``DumpError`` when a dump.json cannot be read; everything about a single call is its verdict's
    refusal instead. ``limits`` caps each tensor file read.
    """
    return list(iter_replays(npu_dump, bench_dump, entries, allowance=allowance, max_elements=max_elements,
                             limits=limits, partners=partners, asked=asked, identical=identical))  # fmt: skip


def iter_replays(
    npu_dump: str | Path,
    bench_dump: str | Path,
    entries: Sequence[str],
    *,
    allowance: Allowance = rounding_allowance,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    limits: TensorLimits = DEFAULT_LIMITS,
    partners: Mapping[str, str] | None = None,
    asked: Mapping[str, str] | None = None,
    identical: Collection[str] = (),
) -> Iterator[ReplayVerdict]:
    """:func:`replay_calls` one verdict at a time (``replay.sandbox`` sets each call's budget between them).
    Both dump.json files are read before it returns (a ``DumpError`` is raised here)."""
    target, bench = DumpSide("target", Path(npu_dump), limits), DumpSide("bench", Path(bench_dump), limits)
    target.data(), bench.data()  # a broken dump.json is an error of the request, not of one call
    return _replays(target, bench, entries, allowance, max_elements, partners, asked, identical)


def _replays(target: DumpSide, bench: DumpSide, entries: Sequence[str], allowance: Allowance,
             max_elements: int, partners: Mapping[str, str] | None, asked: Mapping[str, str] | None,
             identical: Collection[str]) -> Iterator[ReplayVerdict]:  # fmt: skip
    for entry in entries:
        direction = "backward" if entry.endswith(".backward") else "forward"
        t = replay_side(target, entry, allowance=allowance, max_elements=max_elements)
        partner = partners.get(entry, entry) if partners else entry
        if partner:
            b = replay_side(bench, partner, allowance=allowance, max_elements=max_elements)
        else:
            b = SideReplay(bench.name, refusal=GAP_REFUSAL)
        mixed = None
        if asked and entry in asked and partner:
            mixed = replay_side(target, entry, allowance=allowance, max_elements=max_elements,
                                asked=(bench, partner))  # fmt: skip
        verdict = verdict_of(entry, direction, t, b, asked=mixed, arguments=(asked or {}).get(entry),
                             identical=entry in identical)  # fmt: skip
        logger.debug("replay %s: %s", entry, verdict.text)
        yield verdict


def replay_files(dump_json: str | Path, entries: Sequence[str]) -> list[str]:
    """The tensor files (names in ``dump_tensor_data``) a replay of ``entries`` reads on one side: what a
    worker that holds only part of a rank's files must fetch first."""
    side = DumpSide("dump", Path(dump_json))
    names: list[str] = []
    for entry in entries:
        for name in {entry, entry[: -len("backward")] + "forward" if entry.endswith(".backward") else entry}:
            record = side.data().get(name)
            if isinstance(record, dict):
                tensor_file_names(record, names)
    return list(dict.fromkeys(names))

