"""Each row's relative error, and each call's input and output error: the numbers localization judges.

A statistics table has ~60,000 rows in ~20,000 calls; read row by row in Python this was half of a compare's
time. Here the common row (eight finite float statistics, matched) is computed for the whole column at once,
and calls are cut and reduced with ``np.*.reduceat``. Rows the vector rule does not cover (NaN, inf, None,
texts, tensor and md5 modes) take the row-at-a-time rule (``row_error``); both give the same numbers (the
vector path does the same IEEE operations in the same order).

Errors are float64 arrays with NaN for "cannot be judged" (unmatched, no data file, shapes differ): a
relative error itself is never NaN (identical NaN statistics count as equal, a NaN on one side is ``inf``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter

import numpy as np
from parity.shared.compare.headers import CompareMode
from parity.shared.compare.result import Cell, CompareRow, RowStatus
from parity.shared.compare.verdicts import MSG_STATISTICS_ONLY
from parity.shared.dump.columns import STATE_INPUT, STATE_OUTPUT, STATE_PARAMETERS

__all__ = [
    "JUDGED_INPUTS",
    "MIN_SCALE",
    "CallColumns",
    "group_calls",
    "row_error",
    "row_errors",
    "row_norms",
    "stats_error",
]

#: The smallest scale a difference is divided by (float64 rounding of a normwise error).
MIN_SCALE = 1e-12
JUDGED_INPUTS = frozenset({STATE_INPUT, STATE_PARAMETERS, "kwargs", "input_kwargs"})
_UNKNOWN_STATUS = frozenset({RowStatus.UNMATCHED, RowStatus.BENCH_ONLY})  # uncomparable: a None argument
_NPU_STATS = ("NPU max", "NPU min", "NPU mean", "NPU l2norm")
_BENCH_STATS = ("Bench max", "Bench min", "Bench mean", "Bench l2norm")
_cells, _api, _status = attrgetter("cells"), attrgetter("api"), attrgetter("status")


def _num(cell: Cell) -> float | None:
    """A statistics or metric cell as a float (msprobe's ``Nan``/``inf`` texts included), else None."""
    if isinstance(cell, bool):
        return float(cell)
    if isinstance(cell, (int, float)):
        return float(cell)
    if isinstance(cell, str):
        text = cell.strip().lower()
        if text in ("nan", "inf", "-inf", "+inf", "infinity", "-infinity"):
            return float(text.replace("infinity", "inf"))
    return None


def _same(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


def _magnitude(npu: Sequence[float | None], bench: Sequence[float | None]) -> float:
    """The largest finite |max|, |min| or |mean| on either side: the scale of a tensor's values."""
    return max((abs(v) for v in (*npu[:3], *bench[:3]) if v is not None and math.isfinite(v)), default=0.0)


def stats_error(npu: Sequence[float | None], bench: Sequence[float | None]) -> float | None:
    """Relative error from (max, min, mean, norm) on both sides: 0 when all four are identical (NaN equal to
    NaN), infinite when a statistic is non-finite on one side only or differs in sign of infinity, else the
    largest change of max/min/mean against the tensor's finite magnitude and of the norm against the norm.
    None when neither side has statistics."""
    if all(v is None for v in npu) and all(v is None for v in bench):
        return None
    err = 0.0
    magnitude = _magnitude(npu, bench)
    for k, (a, b) in enumerate(zip(npu, bench, strict=True)):
        if _same(a, b):
            continue
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            return math.inf
        scale = abs(b) if k == 3 else magnitude
        err = max(err, abs(a - b) / max(scale, MIN_SCALE))
    return err


def row_norms(rows: Sequence[CompareRow], header: Sequence[str]) -> np.ndarray:
    """Each row's bench norm where it is a finite float (NaN otherwise): how much an output counts when a
    call's output errors are combined (a bias gradient that is ~0 by construction must not speak for it)."""
    if "Bench l2norm" not in header:
        return np.full(len(rows), np.nan)
    values = _float_column(list(map(_cells, rows)), header.index("Bench l2norm"))
    values[~np.isfinite(values)] = np.nan
    return values


_NUMBERS = frozenset({float, int, bool, type(None)})


def _float_column(cells: Sequence[Sequence[Cell]], col: int) -> np.ndarray:
    """Column ``col`` as float64, NaN where a cell is no number (None, a text such as "N/A")."""
    column = list(map(itemgetter(col), cells))
    if set(map(type, column)) <= _NUMBERS:  # the common column: one C-level conversion (None -> NaN)
        return np.array(column, dtype=np.float64)
    return np.fromiter((c if type(c) in _NUMBERS and c is not None else np.nan for c in column),
                       dtype=np.float64, count=len(column))  # fmt: skip


def row_errors(rows: Sequence[CompareRow], header: Sequence[str], mode: CompareMode) -> np.ndarray:
    """Each row's relative error (0 = identical, ``inf`` = NaN/Inf positions or md5 differ, NaN = cannot be
    judged: unmatched, no data file, shapes differ)."""
    n = len(rows)
    out = np.full(n, np.nan)
    pos = {name: i for i, name in enumerate(header)}
    todo = np.ones(n, dtype=bool)
    if mode is CompareMode.STATISTICS and n:
        cells = list(map(_cells, rows))
        a0, a1, a2, a3 = (_float_column(cells, pos[c]) for c in _NPU_STATS)
        b0, b1, b2, b3 = (_float_column(cells, pos[c]) for c in _BENCH_STATS)
        with np.errstate(invalid="ignore", over="ignore"):
            fast = np.isfinite(a0 + a1 + a2 + a3 + b0 + b1 + b2 + b3)  # eight finite numbers
        fast &= ~np.fromiter(map(_UNKNOWN_STATUS.__contains__, map(_status, rows)), dtype=bool, count=n)
        # The row rule's arithmetic, column-wise (same operations in the same order, so the same floats).
        a0, a1, a2, a3, b0, b1, b2, b3 = (v[fast] for v in (a0, a1, a2, a3, b0, b1, b2, b3))
        scale = np.maximum.reduce([np.abs(a0), np.abs(a1), np.abs(a2), np.abs(b0), np.abs(b1), np.abs(b2),
                                   np.full(a0.shape, MIN_SCALE)])  # fmt: skip
        err = np.maximum(np.maximum(np.abs(a0 - b0), np.abs(a1 - b1)), np.abs(a2 - b2)) / scale
        err = np.where(a3 != b3, np.maximum(err, np.abs(a3 - b3) / np.maximum(np.abs(b3), MIN_SCALE)), err)
        out[fast] = err
        todo = ~fast
    for i in np.flatnonzero(todo).tolist():
        value = row_error(rows[i], pos, mode)
        out[i] = np.nan if value is None else value
    return out


def row_error(row: CompareRow, pos: Mapping[str, int], mode: CompareMode) -> float | None:
    """One row's relative error the row-at-a-time way (see ``row_errors``; None = cannot be judged)."""
    if row.status in _UNKNOWN_STATUS:
        return None
    cells = row.cells
    if mode is CompareMode.MD5:
        result = cells[pos["Result"]]
        return 0.0 if result == "pass" else math.inf if result == "Different" else None
    npu_stats = [_num(cells[pos[c]]) for c in _NPU_STATS] if "NPU max" in pos else []
    bench_stats = [_num(cells[pos[c]]) for c in _BENCH_STATS] if "Bench max" in pos else []
    from_stats = stats_error(npu_stats, bench_stats)
    if mode is CompareMode.STATISTICS:
        return from_stats
    return _tensor_error(cells, pos, npu_stats, bench_stats, from_stats)


def _tensor_error(cells: Sequence[Cell], pos: Mapping[str, int], npu_stats: Sequence[float | None],
                  bench_stats: Sequence[float | None], from_stats: float | None) -> float | None:  # fmt: skip
    """Tensor mode: ``EucDist / max(norms)`` where the fused pass gave a distance (identical NaN/Inf
    positions count as equal there), MaxAbsErr against the magnitude for a 0-d tensor, the statistics for
    a value without a data file."""
    message = str(cells[pos["Err_message"]] or "")
    if MSG_STATISTICS_ONLY in message:  # a planned dump's call without tensor files: its statistics speak
        return from_stats
    if "position of inf or nan" in message:
        return math.inf
    if cells[pos["Cosine"]] == "shape unmatched":
        return None
    dist = _num(cells[pos["EucDist"]])
    if dist is not None and math.isfinite(dist):
        if dist == 0.0:
            return 0.0
        norms = [v for v in (npu_stats[3], bench_stats[3]) if v is not None]
        if norms and all(math.isfinite(v) for v in norms) and max(norms) > 0.0:
            return dist / max(norms)
        # Identical NaN/Inf positions (the distance leaves them out) make the norm non-finite: judge the
        # finite values by the largest difference against their magnitude instead.
        max_abs = _num(cells[pos["MaxAbsErr"]])
        magnitude = _magnitude(npu_stats, bench_stats)
        if max_abs is not None and math.isfinite(max_abs) and magnitude > 0.0:
            return max_abs / magnitude
        return from_stats if from_stats is not None else math.inf
    max_abs = _num(cells[pos["MaxAbsErr"]])
    if max_abs is not None and math.isfinite(max_abs):
        if max_abs == 0.0:
            return 0.0
        scale = _magnitude(npu_stats, bench_stats)
        return max_abs / scale if scale > 0.0 else math.inf
    if "not found or read failed" in message or "does not have data file" in message:
        return None if from_stats != 0.0 else 0.0
    return from_stats


@dataclass(frozen=True, slots=True)
class CallColumns:
    """The calls of a table, one array element per call (NaN: cannot be judged)."""

    apis: list[str]
    first_row: np.ndarray  # index of each call's first row
    stop_row: np.ndarray  # one past its last row
    worst_row: np.ndarray  # its output row with the largest error (-1: none judged)
    input_err: np.ndarray  # the largest error of its inputs (NaN: an input could not be judged)
    output_err: np.ndarray  # its outputs together, each weighted by its norm (NaN: none judged)


def group_calls(rows: Sequence[CompareRow], states: Sequence[str], errors: np.ndarray,
                norms: np.ndarray) -> CallColumns:  # fmt: skip
    """Consecutive rows of one entry make one call; bench-only rows (appended after the NPU rows) are no
    call of the NPU run.

    Inputs: the largest error of any input (one damaged input is enough); an input that cannot be judged
    because it is unmatched makes the call's input error unknown. Outputs: the normwise error of all
    outputs together (``sqrt(sum (err_k * norm_k)^2 / sum norm_k^2)``), so an output that is nearly zero
    by construction (the bias gradient of a conv followed by batch norm) weighs by its size; outputs
    without a finite positive norm, or with an infinite error, count by their own error.
    """
    n = len(rows)
    apis: list[str] = list(map(_api, rows))
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return CallColumns([], empty, empty, empty, np.zeros(0), np.zeros(0))
    # map() over C-level methods: no Python frame per row (60,000 rows).
    changes = np.fromiter(map(str.__ne__, apis[1:], apis[:-1]), dtype=bool, count=n - 1)
    first = np.concatenate(([0], np.flatnonzero(changes) + 1)).astype(np.int64)
    stop = np.append(first[1:], n)
    status = list(map(_status, rows))
    keep = np.fromiter((status[s] is not RowStatus.BENCH_ONLY for s in first.tolist()), dtype=bool,
                       count=first.size)  # fmt: skip
    unknown = np.fromiter(map(_UNKNOWN_STATUS.__contains__, status), dtype=bool, count=n)
    is_out = np.fromiter(map(STATE_OUTPUT.__eq__, states), dtype=bool, count=n)
    is_in = np.fromiter(map(JUDGED_INPUTS.__contains__, states), dtype=bool, count=n)
    judged = ~np.isnan(errors)

    in_err = np.maximum.reduceat(np.where(is_in & judged, errors, 0.0), first)
    in_err[np.logical_or.reduceat(is_in & ~judged & unknown, first)] = np.nan

    out = is_out & judged
    with np.errstate(invalid="ignore", over="ignore"):
        weighted = out & (norms > 0.0) & np.isfinite(errors)
        num = np.add.reduceat(np.where(weighted, (errors * norms) ** 2, 0.0), first)
        den = np.add.reduceat(np.where(weighted, norms * norms, 0.0), first)
        out_err = np.where(den > 0.0, np.sqrt(num / np.where(den > 0.0, den, 1.0)), np.nan)
    loose = out & ~weighted
    loose_err = np.maximum.reduceat(np.where(loose, errors, -np.inf), first)
    has_loose = np.logical_or.reduceat(loose, first)
    out_err = np.where(has_loose, np.fmax(out_err, loose_err), out_err)

    # The worst output row: the first row holding the call's largest output error.
    ranked = np.where(out, errors, -np.inf)
    top = np.maximum.reduceat(ranked, first)
    hits = np.flatnonzero(out & (ranked == np.repeat(top, stop - first)))
    worst = np.full(first.size, -1, dtype=np.int64)
    owner = np.searchsorted(first, hits, side="right") - 1
    calls_hit, first_hit = np.unique(owner, return_index=True)
    worst[calls_hit] = hits[first_hit]

    kept = np.flatnonzero(keep)
    return CallColumns([apis[s] for s in first[kept].tolist()], first[kept], stop[kept], worst[kept],
                       in_err[kept], out_err[kept])  # fmt: skip
