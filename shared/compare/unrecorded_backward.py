"""A call whose backward only the bench records: the target ran it on a hand-written backward.

A port's fused kernel is often a custom ``torch.autograd.Function``: its forward calls the model's own
code (recorded, and matching the bench's), its backward is hand-written (never dumped: calls inside a
backward are not recorded, and the calls inside a Function's forward have no backward of their own). The
bench runs the same forward calls under autograd, so it records their backward entries, which the target
lacks: a gap with bench calls only, which no target row can be judged in. If that backward is wrong, the
first place the table shows it is the target call that reads the gradient it hands on: that call's input
differs while the gradient that entered the gap did not, and nothing between them is judged.

Here such a gap is judged as the forward call the target did record: the gradient crossing into it (a
bench-only input that is, value for value by its four statistics, the output of a paired bench row) and
the gradient leaving it (a bench-only output that is a paired row's input) give its input and output
error, read on those paired rows. The bench's statistics are float64 reductions of the very same tensor,
so equality is provenance, not coincidence; a gap tensor without such a partner is internal to the gap
(a chain of backward calls) and is not read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from parity.shared.compare.call_errors import CallColumns
from parity.shared.compare.facts import RowFacts
from parity.shared.dump.columns import STATE_INPUT, STATE_OUTPUT
from parity.shared.dump.naming import BACKWARD, direction_of, forward_of

__all__ = ["UnrecordedBackward", "unrecorded_backwards"]


@dataclass(frozen=True, slots=True)
class UnrecordedBackward:
    """The gradient errors across a bench-only backward gap, judged as the target's forward call."""

    call: int  # the target's forward call (index into the calls)
    backward: str  # the bench's backward entry that the target does not record (the gap's first)
    input_err: float  # the gradient entering the gap
    output_err: float  # the gradient leaving it

    def text(self) -> str:
        return (f"its backward {self.backward} is recorded on the bench only (the target runs a "
                f"hand-written backward): the gradient it hands on differs by {self.output_err:.1e} where "
                f"the one it receives differs by {self.input_err:.1e}")  # fmt: skip


def unrecorded_backwards(facts: RowFacts, states: Sequence[str], row_apis: Sequence[str], cols: CallColumns,
                         errs: np.ndarray) -> list[UnrecordedBackward]:  # fmt: skip
    """Every run of bench-only backward rows whose calls' forwards the target recorded (the module
    docstring), with the errors of the paired rows its boundary gradients are."""
    n = len(row_apis)
    if not cols.apis or n == 0:
        return []
    npu_present, bench_present = facts.npu.present_array(), facts.bench.present_array()
    calls = {api: k for k, api in enumerate(cols.apis)}
    runs = _bench_only_runs(row_apis, npu_present, bench_present, calls)
    if not runs:
        return []
    stats, numeric = facts.bench.stats_array(), facts.bench.numeric_array()
    paired = npu_present & bench_present & facts.bench.tensor_array() & numeric.all(axis=1)
    paired &= np.isfinite(errs)
    # a paired row by its bench tensor's statistics, per state: a gap's input is some call's output
    by_stats: dict[tuple[str, bytes], float] = {}
    for i in np.flatnonzero(paired).tolist():
        key = (states[i], stats[i].tobytes())
        by_stats[key] = min(by_stats.get(key, np.inf), float(errs[i]))
    out: list[UnrecordedBackward] = []
    for rows in runs:
        received = [by_stats.get((STATE_OUTPUT, stats[i].tobytes())) for i in rows
                    if states[i] == STATE_INPUT]  # fmt: skip
        handed = [by_stats.get((STATE_INPUT, stats[i].tobytes())) for i in rows
                  if states[i] == STATE_OUTPUT]  # fmt: skip
        i_errs = [e for e in received if e is not None]
        o_errs = [e for e in handed if e is not None]
        if not i_errs or not o_errs:
            continue
        backward = row_apis[rows[0]]
        out.append(UnrecordedBackward(calls[forward_of(backward)], backward, max(i_errs), max(o_errs)))
    return out


def _bench_only_runs(row_apis: Sequence[str], npu_present: np.ndarray, bench_present: np.ndarray,
                     calls: dict[str, int]) -> list[list[int]]:  # fmt: skip
    """The runs of consecutive bench-only rows (in the bench's order) of backward calls whose forward the
    target recorded and whose backward it did not."""
    runs: list[list[int]] = []
    last = -2
    for i in np.flatnonzero(bench_present & ~npu_present).tolist():
        api = row_apis[i]
        if direction_of(api) != BACKWARD or api in calls or forward_of(api) not in calls:
            continue
        if i == last + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
        last = i
    return runs
