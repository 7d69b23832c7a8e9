"""A cheap screen for calls that computed in float16 or bfloat16 and wrote float32: from the table's
statistics alone, the calls worth the replay's full held-format check (``parity.shared.replay.precision``).

Such a call can hide from the table: its own error may be no bigger than what a TF32 matmul class carries
into it, so its score ranks it among the last and the replay never sees it. Its statistics give it away: the
recorded max and min are values of the output, and a float32 output that went through float16 holds float16
values only. A generic float32 value fits float16 with chance about 2**-13, both of them about 2**-26.

A call is screened in when, on the target side, for one format (float16 or bfloat16):

* every float32/float64 output row's max and min fit the format, and at least one of them is not an integer
  (zeros, masks, one-hot and counts fit trivially);
* the bench's outputs do not all fit it (a rounding op, or an integer-valued result, fits on both sides);
* the call has float inputs and not all of theirs fit it (a call that passes float16 values on, a view, a
  ReLU of float16 values, computed nothing in float16).

The screen names candidates only; the replay loads their tensors and its verdict decides.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from parity.shared.compare.call_errors import JUDGED_INPUTS, CallColumns
from parity.shared.compare.facts import RowFacts, SideFacts
from parity.shared.dump.columns import STATE_OUTPUT

__all__ = ["held_screen"]

_WIDE = frozenset({"torch.float32", "torch.float64", "float32", "float64"})


def _floats(facts: SideFacts, k: int) -> np.ndarray:
    """Statistic ``k`` (0: max, 1: min) of one side as float64, NaN where it is no number or a bool's."""
    values = facts.stats_array()[:, k].copy()
    values[~facts.numeric_array()[:, k]] = np.nan
    return values


def _fits(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whether each value is finite and exactly a float16 value, and a bfloat16 value."""
    with np.errstate(over="ignore", invalid="ignore"):
        finite = np.isfinite(values)
        safe = np.where(finite, values, 0.0)
        half = finite & (safe.astype(np.float16).astype(np.float64) == safe)
        single = safe.astype(np.float32)
        brain = finite & (single.astype(np.float64) == safe) & ((single.view(np.uint32) & 0xFFFF) == 0)
    return half, brain


def _per_call(flags: np.ndarray, cols: CallColumns) -> np.ndarray:
    """How many of each call's rows have the flag."""
    total = np.concatenate(([0], np.cumsum(flags, dtype=np.int64)))
    return total[cols.stop_row] - total[cols.first_row]


def held_screen(facts: RowFacts, states: Sequence[str], cols: CallColumns) -> np.ndarray:
    """Each call screened in as a held-format candidate (see the module docstring), from the rows' facts."""
    n = len(cols.apis)
    if n == 0:
        return np.zeros(n, dtype=bool)
    rows = len(facts)
    wide = np.fromiter(map(_WIDE.__contains__, facts.npu.dtype), dtype=bool, count=rows)
    t_max, t_min = _floats(facts.npu, 0), _floats(facts.npu, 1)
    b_max, b_min = _floats(facts.bench, 0), _floats(facts.bench, 1)
    with np.errstate(invalid="ignore"):
        stats = wide & np.isfinite(t_max) & np.isfinite(t_min)
        not_integer = (t_max != np.round(t_max)) | (t_min != np.round(t_min))
    is_out = stats & np.fromiter(map(STATE_OUTPUT.__eq__, states), dtype=bool, count=rows)
    is_in = stats & np.fromiter(map(JUDGED_INPUTS.__contains__, states), dtype=bool, count=rows)
    outputs, inputs = _per_call(is_out, cols), _per_call(is_in, cols)
    fractional = _per_call(is_out & not_integer, cols) > 0
    screened = np.zeros(n, dtype=bool)
    target = [x & y for x, y in zip(_fits(t_max), _fits(t_min), strict=True)]
    bench = [x & y for x, y in zip(_fits(b_max), _fits(b_min), strict=True)]
    for t_fit, b_fit in zip(target, bench, strict=True):
        held = _per_call(is_out & t_fit, cols) == outputs
        bench_held = _per_call(is_out & b_fit, cols) == outputs
        inputs_held = _per_call(is_in & t_fit, cols) == inputs
        screened |= (outputs > 0) & held & fractional & ~bench_held & (inputs > 0) & ~inputs_held
    return screened
