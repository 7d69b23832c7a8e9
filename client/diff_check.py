"""The baseline side of msprobe 26's ``task: "diff_check"`` (one-pass divergence dump): which call of a
live run is a culprit, judged against a baseline (bench) dump's checksums, and which calls' files go with it.

msprobe 26.2.0 (``DiffCheckDataProcessor``) reads ``{bench_path}/step{N}/rank{R}/dump.json`` and indexes every
``torch.Tensor`` of ``input_args`` and ``output`` by (entry, side, position) to its checksum (``md5``: md5 or
xor, one key in both) and shape. A call is a culprit when every input the baseline has agrees (same shape and
checksum, none missing from the baseline, all of the baseline's counted) and some output of the same shape
does not; msprobe then writes that call's tensors and counts it, up to ``diff_nums`` (-1: no limit). Parity
adds the culprit's data-flow neighbours as ``parity plan`` picks them (:class:`parity.shared.plan.dataflow.
DataFlow`, over the baseline dump, whose call order the target repeats where its inputs agree).

Not yet wired into the recorder: ``task: "diff_check"`` is still refused in :mod:`parity.client.config`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parity.client.errors import ConfigError
from parity.shared.dump.layout import rank_dir_path
from parity.shared.dump.reader import read_json
from parity.shared.errors import ParityError
from parity.shared.plan.builder import DEFAULT_NEIGHBOURS
from parity.shared.plan.dataflow import DataFlow

__all__ = ["Baseline", "CallChecksums", "DiffCheck", "baseline_json"]

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
    expected = rank_dir_path(path, step, rank) / "dump.json"
    raise ConfigError("tensor.bench_path", f"no baseline dump.json for step {step}, rank {rank} under "
                      f"{str(path)!r} (expected {expected})")  # fmt: skip


def _tensors(values: Any) -> dict[int, _Ref]:
    """msprobe's index: the ``torch.Tensor`` items of a top-level list, by position."""
    out: dict[int, _Ref] = {}
    if isinstance(values, list):
        for i, leaf in enumerate(values):
            if isinstance(leaf, dict) and leaf.get("type") == "torch.Tensor":
                md5 = leaf.get("md5")
                out[i] = (md5 if isinstance(md5, str) else None, tuple(leaf.get("shape") or ()))
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
