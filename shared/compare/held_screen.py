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
from parity.shared.compare.result import CompareRow
from parity.shared.dump.columns import STATE_OUTPUT

__all__ = ["held_screen"]

_WIDE = frozenset({"torch.float32", "torch.float64", "float32", "float64"})
_TARGET = ("NPU Dtype", "NPU max", "NPU min")
_BENCH = ("Bench max", "Bench min")
_NUMBERS = frozenset({float, int, type(None)})


def _column(rows: Sequence[CompareRow], col: int) -> np.ndarray:
    """A statistics column as float64, NaN where a cell is no number (None, a text, a bool's any/all)."""
    cells = [row.cells[col] for row in rows]
    if set(map(type, cells)) <= _NUMBERS:  # the common column: one C-level conversion (None -> NaN)
        return np.array(cells, dtype=np.float64)
    return np.fromiter((c if type(c) in _NUMBERS and c is not None else np.nan for c in cells),
                       dtype=np.float64, count=len(cells))  # fmt: skip


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


def held_screen(rows: Sequence[CompareRow], states: Sequence[str], header: Sequence[str],
                cols: CallColumns) -> np.ndarray:  # fmt: skip
    """Each call screened in as a held-format candidate (see the module docstring); all False when the
    table has no target statistics."""
    n = len(cols.apis)
    if n == 0 or not all(name in header for name in (*_TARGET, *_BENCH)):
        return np.zeros(n, dtype=bool)
    dtype_col = header.index("NPU Dtype")
    wide = np.fromiter(map(_WIDE.__contains__, (row.cells[dtype_col] for row in rows)), dtype=bool,
                       count=len(rows))  # fmt: skip
    t_max, t_min, b_max, b_min = (_column(rows, header.index(name)) for name in (*_TARGET[1:], *_BENCH))
    with np.errstate(invalid="ignore"):
        stats = wide & np.isfinite(t_max) & np.isfinite(t_min)
        not_integer = (t_max != np.round(t_max)) | (t_min != np.round(t_min))
    is_out = stats & np.fromiter(map(STATE_OUTPUT.__eq__, states), dtype=bool, count=len(rows))
    is_in = stats & np.fromiter(map(JUDGED_INPUTS.__contains__, states), dtype=bool, count=len(rows))
    outputs, inputs = _per_call(is_out, cols), _per_call(is_in, cols)
    fractional = _per_call(is_out & not_integer, cols) > 0
    screened = np.zeros(n, dtype=bool)
    target = [a & b for a, b in zip(_fits(t_max), _fits(t_min), strict=True)]
    bench = [a & b for a, b in zip(_fits(b_max), _fits(b_min), strict=True)]
    for t_fit, b_fit in zip(target, bench, strict=True):
        held = _per_call(is_out & t_fit, cols) == outputs
        bench_held = _per_call(is_out & b_fit, cols) == outputs
        inputs_held = _per_call(is_in & t_fit, cols) == inputs
        screened |= (outputs > 0) & held & fractional & ~bench_held & (inputs > 0) & ~inputs_held
    return screened
