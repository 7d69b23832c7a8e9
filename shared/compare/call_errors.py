"""Each row's relative error, and each call's input and output error: the numbers localization judges.

A statistics table has ~60,000 rows in ~20,000 calls: every rule here is column-wise over the rows' typed
facts (``facts.RowFacts``: statistics as numbers, metrics as numbers, flags), never over display cells, and
calls are cut and reduced with ``np.*.reduceat``. ``stats_error`` states the statistics rule for one row.

Errors are float64 arrays with NaN for "cannot be judged" (unmatched, no data file, shapes differ): a
relative error itself is never NaN (identical NaN statistics count as equal, a NaN on one side is ``inf``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np
from parity.shared.compare.facts import (
    F_NO_FILE,
    F_POSITIONS,
    F_SHAPE,
    F_STATISTICS_ONLY,
    F_UNINITIALISED,
    RowFacts,
    fill_limits,
)
from parity.shared.compare.headers import CompareMode
from parity.shared.compare.result import CompareRow, RowStatus
from parity.shared.dump.columns import STATE_INPUT, STATE_OUTPUT, STATE_PARAMETERS

__all__ = [
    "JUDGED_INPUTS",
    "MIN_SCALE",
    "CallColumns",
    "group_calls",
    "row_errors",
    "row_norms",
    "statistics_errors",
    "stats_error",
]

#: The smallest scale a difference is divided by (float64 rounding of a normwise error).
MIN_SCALE = 1e-12
JUDGED_INPUTS = frozenset({STATE_INPUT, STATE_PARAMETERS, "kwargs", "input_kwargs"})
_UNKNOWN_STATUS = frozenset({RowStatus.UNMATCHED, RowStatus.BENCH_ONLY})  # uncomparable: a None argument
_NPU_STATS = ("NPU max", "NPU min", "NPU mean", "NPU l2norm")
_BENCH_STATS = ("Bench max", "Bench min", "Bench mean", "Bench l2norm")
_cells, _api, _status = attrgetter("cells"), attrgetter("api"), attrgetter("status")


def _same(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


def _magnitude(npu: Sequence[float | None], bench: Sequence[float | None]) -> float:
    """The largest finite |max|, |min| or |mean| on either side: the scale of a tensor's values."""
    return max((abs(v) for v in (*npu[:3], *bench[:3]) if v is not None and math.isfinite(v)), default=0.0)


def stats_error(npu: Sequence[float | None], bench: Sequence[float | None]) -> float | None:
    """Relative error from (max, min, mean, norm) on both sides: 0 when all four are identical (NaN equal to
    NaN), infinite when a statistic is non-finite on one side only or differs in sign of infinity, else the
    largest change of max/min/mean against the tensor's finite magnitude and of the norm against the norm.
    None when neither side has statistics. (The one-row statement of ``statistics_errors``' rule, which the
    tests hold it to; masked statistics aside.)"""
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


#: A statistic this large, equal on both sides, is a fill, not data (``facts.fill_limits``).
_mask_limits = fill_limits


def statistics_errors(facts: RowFacts) -> np.ndarray:
    """Each row's relative error from its four statistics on both sides, column-wise (``stats_error``'s
    rule): NaN where neither side has a statistic. A statistic equal on both sides that is a fill value
    (``facts.FILL_FRACTION``: an attention mask's float32 minimum, -inf) is no data: it sets no magnitude, and
    the Mean and Norm it swamps are left out of the error."""
    a, b = facts.npu.stats_array(), facts.bench.stats_array()
    na, nb = facts.npu.numeric_array(), facts.bench.numeric_array()
    n = len(facts)
    with np.errstate(invalid="ignore", over="ignore"):
        both_nan = np.isnan(a) & np.isnan(b) & na & nb
        same = ((a == b) & na & nb) | both_nan | (~na & ~nb)
        limit = _mask_limits(facts.npu.dtype)[:, None]
        mask = (a == b) & na & nb & (np.abs(a) >= limit)
        masked = mask[:, 0] | mask[:, 1]
        finite = np.isfinite(a) & np.isfinite(b) & na & nb
        broken = (~same & ~finite).any(axis=1)
        scale_values = np.where(na & np.isfinite(a) & ~mask, np.abs(a), 0.0)[:, :3]
        scale_values = np.maximum(scale_values, np.where(nb & np.isfinite(b) & ~mask, np.abs(b), 0.0)[:, :3])
        scale_values[masked, 2] = 0.0  # a masked tensor's Mean is the mask's: no scale of its values
        magnitude = scale_values.max(axis=1)
        diff = np.where(same | ~finite, 0.0, np.abs(a - b))
        rel = diff[:, :3] / np.maximum(magnitude, MIN_SCALE)[:, None]
        norm_rel = diff[:, 3] / np.maximum(np.abs(np.where(finite[:, 3], b[:, 3], 0.0)), MIN_SCALE)
        rel[masked, 2] = 0.0  # a masked tensor's Mean and Norm are the mask's
        norm_rel[masked] = 0.0
        err = np.maximum(rel.max(axis=1), norm_rel) if n else np.zeros(0)
    err = np.where(broken & ~masked, np.inf, err)
    none = ~(na.any(axis=1) | nb.any(axis=1))
    return np.where(none, np.nan, err)


def row_norms(facts: RowFacts) -> np.ndarray:
    """Each row's bench norm where it is a finite number (NaN otherwise): how much an output counts when a
    call's output errors are combined (a bias gradient that is ~0 by construction must not speak for it)."""
    norms = facts.bench.stats_array()[:, 3].copy()
    norms[~np.isfinite(norms) | ~facts.bench.numeric_array()[:, 3]] = np.nan
    return norms


def row_errors(rows: Sequence[CompareRow], facts: RowFacts, mode: CompareMode) -> np.ndarray:
    """Each row's relative error (0 = identical, ``inf`` = NaN/Inf positions, md5 or shapes differ, NaN =
    cannot be judged: unmatched, no data file), from the rows' facts."""
    n = len(rows)
    unknown = np.fromiter(map(_UNKNOWN_STATUS.__contains__, map(_status, rows)), dtype=bool, count=n)
    if mode is CompareMode.MD5:
        err = _md5_errors(facts)
    else:
        err = statistics_errors(facts)
        if mode is CompareMode.TENSOR:
            err = _tensor_errors(facts, err)
    shape = facts.has(F_SHAPE)
    err = np.where(shape, np.inf, err)  # another shape: never "identical", never a gain to learn from
    err[unknown | facts.has(F_UNINITIALISED)] = np.nan  # uninitialised memory: no value to judge
    return err


def _md5_errors(facts: RowFacts) -> np.ndarray:
    """md5 mode: 0 where both checksums are present and equal, inf where they differ, NaN where one lacks."""
    out = np.full(len(facts), np.nan)
    for i, (x, y) in enumerate(zip(facts.npu.md5, facts.bench.md5, strict=True)):
        if x is not None and y is not None:
            out[i] = 0.0 if x == y else math.inf
    return out


def _tensor_errors(facts: RowFacts, from_stats: np.ndarray) -> np.ndarray:
    """Tensor mode: ``EucDist / max(norms)`` where the fused pass gave a distance (identical NaN/Inf
    positions count as equal there), MaxAbsErr against the magnitude for a 0-d tensor or where the norms
    are not finite (or swamped by a mask), the statistics for a value without a data file."""
    metrics = facts.metrics_array()
    dist, max_abs = metrics[:, 1], metrics[:, 2]
    a, b = facts.npu.stats_array(), facts.bench.stats_array()
    na, nb = facts.npu.numeric_array(), facts.bench.numeric_array()
    limit = _mask_limits(facts.npu.dtype)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        mask = ((a == b) & na & nb & (np.abs(a) >= limit[:, None]))[:, :2].any(axis=1)
        norms_known = (na[:, 3] | nb[:, 3])
        norm_ok = norms_known & ~((na[:, 3] & ~np.isfinite(a[:, 3])) | (nb[:, 3] & ~np.isfinite(b[:, 3])))
        top_norm = np.fmax(np.where(na[:, 3], a[:, 3], np.nan), np.where(nb[:, 3], b[:, 3], np.nan))
        by_norm = norm_ok & (top_norm > 0.0) & ~mask
        fill = (a == b) & (np.abs(a) >= limit[:, None])
        values = np.maximum(np.where(np.isfinite(a) & na & ~fill, np.abs(a), 0.0),
                            np.where(np.isfinite(b) & nb & ~fill, np.abs(b), 0.0))  # fmt: skip
        values[mask, 2] = 0.0  # a masked tensor's Mean is the mask's
        magnitude = values[:, :3].max(axis=1)
        has_dist = np.isfinite(dist)
        has_max = np.isfinite(max_abs)
        by_max = np.where(magnitude > 0.0, max_abs / magnitude, np.inf)
        dist_rule = np.select(
            [dist == 0.0, by_norm, has_max & (magnitude > 0.0), ~np.isnan(from_stats)],
            [0.0, dist / top_norm, max_abs / magnitude, from_stats], np.inf)
        max_rule = np.where(max_abs == 0.0, 0.0, by_max)
    no_file = facts.has(F_NO_FILE)
    file_rule = np.where(from_stats == 0.0, 0.0, np.nan)
    out = np.select([facts.has(F_STATISTICS_ONLY), facts.has(F_POSITIONS), has_dist, has_max, no_file],
                    [from_stats, np.inf, dist_rule, max_rule, file_rule], from_stats)
    return out


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
                norms: np.ndarray, arguments: np.ndarray | None = None) -> CallColumns:  # fmt: skip
    """Consecutive rows of one entry make one call; bench-only rows (appended after the NPU rows) are no
    call of the NPU run. ``arguments``: the rows that are a call's non-tensor arguments, which are what the
    call was asked to do (``choices``), not an input it inherited: they count neither as an input error nor,
    unmatched, as an input that cannot be judged.

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
    if arguments is not None:
        is_in &= ~arguments
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
