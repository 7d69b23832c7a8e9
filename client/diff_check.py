"""The baseline side of msprobe 26's ``task: "diff_check"`` (one-pass divergence dump): which call of a
live run is a culprit, judged against a baseline (bench) dump's checksums, and which calls' files go with it.

msprobe 26.2.0 (``DiffCheckDataProcessor``) reads ``{bench_path}/step{N}/rank{R}/dump.json`` and indexes every
``torch.Tensor`` of ``input_args`` and ``output`` by (entry, side, position) to its checksum (``md5``: md5 or
xor, one key in both) and shape. A call is a culprit when every input the baseline has agrees (same shape and
checksum, none missing from the baseline, all of the baseline's counted) and some output of the same shape
does not; msprobe then writes that call's tensors and counts it, up to ``diff_nums`` (-1: no limit). Parity
adds the culprit's data-flow neighbours as ``parity plan`` picks them (:class:`parity.shared.plan.dataflow.
DataFlow`, over the baseline dump, whose call order the target repeats where its inputs agree).

The live side (:class:`LiveDiffCheck`, driven by :class:`parity.client.recorder.Recorder`): every recorded
call gets its statistics and checksums; its tensors are held (references, no copy) with their file names
until the call is judged, when its forward outputs are recorded (one read of that call's checksums, as
msprobe does). A culprit's files are written then, with those of its producers still held (the last
:attr:`LiveDiffCheck.HELD` entries) and, as they run, its consumers; a held tensor changed in place since it
was recorded gets no file (its values are gone) and says so in the leaf. Every other leaf loses its file name.
Unlike msprobe 26.2.0, which stops the whole dump at ``diff_nums`` culprits, the statistics go on to the end
of the step (the comparison of the two runs still has every call); and an xor baseline works (msprobe 26.2.0
reads the live checksum before its xor is computed, so it never finds a culprit in xor mode).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from parity.client.errors import ConfigError
from parity.shared.dump.layout import find_rank_dirs, rank_dir_path, step_dir_name
from parity.shared.dump.reader import read_json
from parity.shared.errors import ParityError
from parity.shared.plan.builder import DEFAULT_NEIGHBOURS
from parity.shared.plan.dataflow import DataFlow

__all__ = ["Baseline", "CallChecksums", "DiffCheck", "LiveDiffCheck", "baseline_json"]

log = logging.getLogger(__name__)

#: (checksum, shape) of one tensor, or None where the dump has no checksum for it
_Ref = tuple[str | None, tuple[int, ...]]


@dataclass(frozen=True)
class CallChecksums:
    """One live call's tensors: position -> (checksum, shape), inputs (``input_args``) and outputs."""

    inputs: Mapping[int, _Ref]
    outputs: Mapping[int, _Ref]

    @classmethod
    def of_entry(cls, entry: Mapping[str, Any]) -> CallChecksums:
        """One dump.json entry's tensors, indexed as msprobe 26 indexes the baseline's."""
        return cls(_tensors(entry.get("input_args")), _tensors(entry.get("output")))


def baseline_json(bench_path: str | Path, step: int, rank: int) -> Path:
    """The baseline's dump.json for one step and rank: ``bench_path`` itself (a dump.json), its dump.json,
    or, as msprobe 26 reads it, ``{bench_path}/step{step}/rank{rank}/dump.json``."""
    path = Path(bench_path)
    for candidate in (path, path / "dump.json", rank_dir_path(path, step, rank) / "dump.json"):
        if candidate.is_file():
            return candidate
    for step_dir in (path / step_dir_name(step), path):  # msprobe's unnumbered ``proc{pid}`` folder too
        try:
            found = [d for d in find_rank_dirs(step_dir) if d.number == rank and d.dump_json.is_file()]
        except ParityError:
            continue
        if found:
            return found[0].dump_json
    expected = rank_dir_path(path, step, rank) / "dump.json"
    raise ConfigError("tensor.bench_path", f"no baseline dump.json for step {step}, rank {rank} under "
                      f"{str(path)!r} (expected {expected})")  # fmt: skip


def _tensors(values: Any) -> dict[int, _Ref]:
    """msprobe's index: the ``torch.Tensor`` items of a top-level list, by position."""
    out: dict[int, _Ref] = {}
    if isinstance(values, list):
        for i, leaf in enumerate(values):
            if isinstance(leaf, dict) and leaf.get("type") == "torch.Tensor":
                md5 = leaf.get("md5")  # a 0-d tensor's xor checksum is its value: compared as text (msprobe)
                out[i] = (None if md5 is None else str(md5), tuple(leaf.get("shape") or ()))
    return out


@dataclass
class Baseline:
    """A baseline dump's checksums by entry, and its data flow (for the culprits' neighbours)."""

    calls: dict[str, CallChecksums]
    flow: DataFlow

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Baseline:
        calls = {name: CallChecksums.of_entry(e) for name, e in data.items() if isinstance(e, dict)}
        if not any(ref[0] for c in calls.values() for ref in (*c.inputs.values(), *c.outputs.values())):
            raise ConfigError("tensor.bench_path", "the baseline dump has no checksums: dump it with "
                              'summary_mode "md5" or "xor"')  # fmt: skip
        return cls(calls, DataFlow(data))

    @classmethod
    def load(cls, bench_path: str | Path, step: int, rank: int) -> Baseline:
        path = baseline_json(bench_path, step, rank)
        try:
            doc = read_json(path, "baseline dump.json")
        except ParityError as exc:
            raise ConfigError("tensor.bench_path", str(exc)) from None
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, dict):
            raise ConfigError("tensor.bench_path", f"{path}: no 'data' object")
        return cls.from_data(data)


@dataclass
class DiffCheck:
    """The culprits of one step, judged call by call as msprobe 26 does, up to ``diff_nums``."""

    baseline: Baseline
    diff_nums: int = 1
    hops: int = DEFAULT_NEIGHBOURS
    culprits: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        """``diff_nums`` culprits found: no more are looked for (statistics go on)."""
        return self.diff_nums != -1 and len(self.culprits) >= self.diff_nums

    def judge(self, entry: str, live: CallChecksums) -> bool:
        """Whether ``entry`` is a culprit (its inputs agree with the baseline's, an output does not); a
        culprit is counted."""
        ref = self.baseline.calls.get(entry)
        if self.done or ref is None or set(live.inputs) != set(ref.inputs):
            return False  # msprobe: an input one side lacks proves nothing
        for i, (md5, shape) in live.inputs.items():
            want_md5, want_shape = ref.inputs[i]
            if md5 is None or want_md5 is None or md5 != want_md5 or shape != want_shape:
                return False
        culprit = any(
            i in ref.outputs and shape == ref.outputs[i][1] and md5 is not None
            and ref.outputs[i][0] is not None and md5 != ref.outputs[i][0]
            for i, (md5, shape) in live.outputs.items()
        )  # fmt: skip
        if culprit:
            self.culprits.append(entry)
        return culprit

    def file_calls(self, culprits: Sequence[str] | None = None) -> list[str]:
        """The calls whose tensor files go with the culprits: the culprits, then their neighbours within
        ``hops`` in the baseline's data flow (``parity plan``'s choice), in dump order."""
        seeds = list(self.culprits if culprits is None else culprits)
        return seeds + [n for n in self.baseline.flow.neighbours(seeds, self.hops) if n not in seeds]


#: one held tensor: its file name, the tensor, its ``_version`` when recorded, and its leaf
_Held = tuple[str, torch.Tensor, int, dict[str, Any]]


class LiveDiffCheck:
    """One step's divergence dump in the live run: which entries' tensors are held, written or let go.

    ``write(file_name, tensor)`` queues a tensor file (the recorder's writer); the recorder asks
    :meth:`wants` before naming a tensor's file, :meth:`hold` after making its leaf, and calls
    :meth:`call_done` once a forward call's outputs are recorded and :meth:`settle` before a flush."""

    #: the entries whose tensors stay held after their call (a later culprit's producers); references only,
    #: so past this many the oldest is let go (its tensors then free as the run would free them)
    HELD = 64

    def __init__(self, check: DiffCheck, write: Callable[[str, torch.Tensor], None]) -> None:
        self.check = check
        self._write = write
        self._held: OrderedDict[str, list[_Held]] = OrderedDict()
        self._wanted: set[str] = set()  # a culprit's neighbours not run yet: written as they are recorded
        self._seen: set[str] = set()  # entries already let go or written: too late for their files
        self._complete: set[str] = set()  # forward calls whose outputs are recorded
        self.written: list[str] = []  # entries whose files were written, in order (once per tensor)
        self.lost: list[str] = []  # neighbours whose tensors were let go (or changed) before a culprit showed

    def wants(self, entry: str) -> bool:
        """Whether ``entry``'s tensors may still get files (every entry until ``diff_nums`` culprits)."""
        return not self.check.done or entry in self._wanted

    def hold(self, entry: str, file_name: str, tensor: torch.Tensor, leaf: dict[str, Any]) -> None:
        """A recorded tensor that may get a file; a wanted neighbour's is written at once."""
        if entry in self._wanted:
            self._write(file_name, tensor)
            self.written.append(entry)
            return
        held = self._held.get(entry)
        if held is None:
            held = self._held[entry] = []
            if len(self._held) > self.HELD:
                self._let_go(next(iter(self._held)))
        held.append((file_name, tensor, tensor._version, leaf))

    def call_done(self, entry: str, record: Mapping[str, Any]) -> None:
        """A forward call's outputs are recorded (its checksums filled): judge it; a culprit's files and
        its held producers' are written, its consumers are wanted."""
        self._wanted.discard(entry)
        self._complete.add(entry)
        if self.check.done or not self.check.judge(entry, CallChecksums.of_entry(record)):
            return
        for name in self.check.file_calls([entry]):
            if name in self._held:
                self._flush_held(name)
                if name not in self._complete:  # a call still running (the module around the culprit)
                    self._wanted.add(name)
            elif name in self._seen:
                self.lost.append(name)
            elif name != entry:
                self._wanted.add(name)

    def settle(self) -> None:
        """Before the documents are written: every held entry lets its file names go (no file was written)."""
        for entry in list(self._held):
            self._let_go(entry)

    def _flush_held(self, entry: str) -> None:
        changed = False
        for file_name, tensor, version, leaf in self._held.pop(entry):
            if tensor._version != version:  # an in-place update since: the values recorded are gone
                leaf.pop("data_name", None)
                leaf["note"] = "changed in place before diff_check wrote it: no tensor file"
                changed = True
            else:
                self._write(file_name, tensor)
        self._seen.add(entry)
        (self.lost if changed else self.written).append(entry)

    def _let_go(self, entry: str) -> None:
        for _, _, _, leaf in self._held.pop(entry):
            leaf.pop("data_name", None)
        self._seen.add(entry)

    def summary(self, step: int, rank: int) -> str:
        """One line for the log: the culprits, the entries with files, those too late for theirs."""
        culprits = ", ".join(self.check.culprits) or "none"
        line = f"parity: diff_check step {step} rank {rank}: culprits: {culprits}"
        written, lost = list(dict.fromkeys(self.written)), list(dict.fromkeys(self.lost))
        if self.check.culprits:
            line += f"; tensor files for {len(written)} entries ({', '.join(written)})"
        if lost:
            line += f"; not written (let go or changed in place before the culprit ran): {', '.join(lost)}"
        return line
