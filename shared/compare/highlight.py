"""msprobe v1's red/yellow row colouring (compare.md §7.2), always computed; reports decide whether to paint.

Rules run per API (consecutive rows of one dump entry); "in" rows are inputs, kwargs and parameters, "out"
rows are outputs. Fixed on purpose: NaN and ±inf in NPU max/min are caught whatever their spelling (msprobe
compares against ``"nan"`` while its table says ``Nan``, so NaN was never red), and each reason is recorded
once per row, not once per input row compared. Unmatched rows are yellow (msprobe reaches the same colour
through ``Requires_grad Consistent = False``) without a misleading requires_grad reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from parity.shared.compare.headers import CompareMode
from parity.shared.compare.result import Cell, CompareRow, Highlight, RowStatus
from parity.shared.dump.columns import STATE_INPUT, STATE_OUTPUT, STATE_PARAMETERS

RED_NAN_INF = "maximum or minimum is nan, -inf, or inf"
RED_HUGE_ERR = "maximum absolute error exceeds 1e+10"
RED_ONE_THOUSANDTH = ("The input/parameter's one thousandth err ratio exceeds 0.9, "
                      "while the output's is below 0.6")  # fmt: skip
YELLOW_ONE_THOUSANDTH = ("The output's one thousandth err ratio decreases by more than 0.1 "
                         "compared to the input/parameter's")  # fmt: skip
YELLOW_COSINE = "The output's cosine decreases by more than 0.1 compared to the input/parameter's"
RED_MAX_REL = "maximum relative error exceeds 0.5"
YELLOW_MAX_REL = "The output's maximum relative error exceeds 0.1, while the input/parameter's is below 0.01"
YELLOW_MAGNITUDE = ("maximum absolute error of both input/parameters and output exceed 1, "
                    "with the output larger by an order of magnitude")  # fmt: skip
YELLOW_REQUIRES_GRAD = "requires_grad is inconsistent"
#: every reason a rule can give: Err_message puts each on a line of its own, after the compare's own words
REASONS = frozenset({RED_NAN_INF, RED_HUGE_ERR, RED_ONE_THOUSANDTH, YELLOW_ONE_THOUSANDTH, YELLOW_COSINE,
                     RED_MAX_REL, YELLOW_MAX_REL, YELLOW_MAGNITUDE, YELLOW_REQUIRES_GRAD})  # fmt: skip

HUGE_ERR = 1e10
_NON_FINITE_WORDS = frozenset({"nan", "inf", "-inf", "+inf"})
_IN_STATES = frozenset({STATE_INPUT, STATE_PARAMETERS})


def number(cell: Cell) -> float | None:
    """A numeric cell as float (``Nan``/``inf`` strings included); None for sentinels, bools and blanks."""
    kind = type(cell)
    if kind is float or kind is int:
        return float(cell)  # type: ignore[arg-type]
    if kind is str and cell.lower() in _NON_FINITE_WORDS:  # type: ignore[union-attr]
        return float(cell)  # type: ignore[arg-type]
    return None


def percent(cell: Cell) -> float | None:
    """A ``"12.5%"`` cell as the fraction 0.125; None otherwise."""
    if type(cell) is str and cell.endswith("%"):  # type: ignore[union-attr]
        try:
            return float(cell[:-1]) / 100.0  # type: ignore[index]
        except ValueError:
            return None
    return None


def _identical(cells: Sequence[Cell], pairs: Sequence[tuple[int, int]]) -> bool:
    """Whether every statistic equals the other side's (NaN equal to NaN): an identical ``-inf`` fill
    (T5's relative position buckets, a causal mask) is no loss of precision, on either side."""
    for n, b in pairs:
        x, y = number(cells[n]), number(cells[b])
        if x is None or y is None or not (x == y or (math.isnan(x) and math.isnan(y))):
            return False
    return bool(pairs)


def _non_finite(cell: Cell) -> bool:
    value = number(cell)
    return value is not None and not math.isfinite(value)


class _Columns:
    def __init__(self, header: Sequence[str], mode: CompareMode) -> None:
        pos = {name: i for i, name in enumerate(header)}
        self.rg = pos["Requires_grad Consistent"]
        self.npu_max = pos.get("NPU max", -1)
        self.npu_min = pos.get("NPU min", -1)
        self.bench_max = pos.get("Bench max", -1)
        # the statistics of both sides, side by side: identical non-finite values are no finding
        self.stats = [(pos[f"NPU {k}"], pos[f"Bench {k}"]) for k in ("max", "min", "mean", "l2norm")
                      if f"NPU {k}" in pos and f"Bench {k}" in pos]  # fmt: skip
        if mode is CompareMode.TENSOR:
            self.err = pos["MaxAbsErr"]
            self.one = pos["One Thousandth Err Ratio"]
            self.cos = pos["Cosine"]
            self.rel = -1
        elif mode is CompareMode.STATISTICS:
            self.err = pos["Max diff"]
            self.rel = pos["MaxRelativeErr"]
            self.one = self.cos = -1
        else:
            self.err = self.rel = self.one = self.cos = -1


def apply_highlights(
    rows: Sequence[CompareRow],
    states: Sequence[str],
    mode: CompareMode,
    header: Sequence[str],
    messages: Sequence[list[str]],
    ranges: Iterable[tuple[int, int]] | None = None,
) -> None:
    """Set ``row.highlight`` and append each reason to ``messages[i]`` (once), on every row or, with
    ``ranges``, on the rows of those ``(start, stop)`` ranges only (each starting on an entry's first row):
    the caller vouches that no rule can fire elsewhere. md5 mode has no highlighting, as in msprobe."""
    if mode is CompareMode.MD5:
        return
    cols = _Columns(header, mode)
    for first, last in ranges if ranges is not None else [(0, len(rows))]:
        start = first
        while start < last:
            api = rows[start].api
            stop = start + 1
            while stop < last and rows[stop].api == api:
                stop += 1
            _highlight_api(rows, states, messages, range(start, stop), cols, mode)
            start = stop


def _mark(rows: Sequence[CompareRow], messages: Sequence[list[str]], i: int, colour: Highlight | None,
          reason: str) -> None:  # fmt: skip
    row = rows[i]
    if colour is Highlight.RED or (colour is not None and row.highlight is None):
        row.highlight = colour
    if reason and reason not in messages[i]:
        messages[i].append(reason)


def _highlight_api(rows: Sequence[CompareRow], states: Sequence[str], messages: Sequence[list[str]],
                   span: range, cols: _Columns, mode: CompareMode) -> None:  # fmt: skip
    red, yellow = Highlight.RED, Highlight.YELLOW
    unmatched, bench_only = RowStatus.UNMATCHED, RowStatus.BENCH_ONLY
    in_rows: list[int] = []
    out_rows: list[int] = []
    for i in span:
        row = rows[i]
        cells = row.cells
        status = row.status
        if status is bench_only:
            row.highlight = yellow  # Parity's own row (msprobe drops it): flagged, with no rule's reason
        elif cells[cols.rg] is False:  # an unmatched row too, unless neither side has a requires_grad
            _mark(rows, messages, i, yellow, YELLOW_REQUIRES_GRAD)
        if cols.npu_max >= 0 and status is not bench_only:
            mx, mn = cells[cols.npu_max], cells[cols.npu_min]
            # a finite float (the common cell) is settled by one subtraction; anything else goes the long way
            if (not (type(mx) is float and mx - mx == 0.0) and _non_finite(mx)) or (
                not (type(mn) is float and mn - mn == 0.0) and _non_finite(mn)
            ):
                # both sides hold the same nan/inf: said (no fill, no failure), not a finding
                same = _identical(cells, cols.stats)
                _mark(rows, messages, i, None if same else red, RED_NAN_INF)
            elif cols.err >= 0:
                err = cells[cols.err]
                value = err if type(err) is float else number(err)
                if value is not None and abs(value) > HUGE_ERR:
                    _mark(rows, messages, i, red, RED_HUGE_ERR)
        if status is unmatched or status is bench_only:
            continue
        state = states[i]
        if state in _IN_STATES:
            in_rows.append(i)
        elif state == STATE_OUTPUT:
            out_rows.append(i)
    if not in_rows or not out_rows or mode is CompareMode.MD5:
        return
    for o in out_rows:
        out = rows[o].cells
        if rows[o].highlight is red:
            continue
        if number(out[cols.npu_max]) is None or number(out[cols.bench_max]) is None:
            continue
        out_err = number(out[cols.err])
        if out_err is None:
            continue
        if mode is CompareMode.TENSOR:
            _tensor_rules(rows, messages, o, in_rows, cols)
        else:
            out_rel = percent(out[cols.rel])
            if out_rel is not None and out_rel > 0.5:
                _mark(rows, messages, o, red, RED_MAX_REL)
                continue
            if out_rel is not None and out_rel > 0.1:
                in_rels = [r for r in (percent(rows[i].cells[cols.rel]) for i in in_rows) if r is not None]
                if in_rels and min(in_rels) < 0.01:
                    _mark(rows, messages, o, yellow, YELLOW_MAX_REL)
        _magnitude_rule(rows, messages, o, in_rows, cols, abs(out_err))


def _tensor_rules(rows: Sequence[CompareRow], messages: Sequence[list[str]], o: int, in_rows: list[int],
                  cols: _Columns) -> None:  # fmt: skip
    out = rows[o].cells
    out_one = number(out[cols.one])
    out_cos = number(out[cols.cos])
    for i in in_rows:
        cells = rows[i].cells
        in_one = number(cells[cols.one])
        if in_one is not None and out_one is not None:
            if in_one > 0.9 and out_one < 0.6:
                _mark(rows, messages, o, Highlight.RED, RED_ONE_THOUSANDTH)
            elif in_one - out_one > 0.1:
                _mark(rows, messages, o, Highlight.YELLOW, YELLOW_ONE_THOUSANDTH)
        in_cos = number(cells[cols.cos])
        if in_cos is not None and out_cos is not None and in_cos - out_cos > 0.1:
            _mark(rows, messages, o, Highlight.YELLOW, YELLOW_COSINE)


def _magnitude_rule(rows: Sequence[CompareRow], messages: Sequence[list[str]], o: int, in_rows: list[int],
                    cols: _Columns, d_out: float) -> None:  # fmt: skip
    if not d_out > 1 or not math.isfinite(d_out):
        return
    for i in in_rows:
        d_in = number(rows[i].cells[cols.err])
        if d_in is None:
            continue
        d_in = abs(d_in)
        if 1 < d_in <= d_out and math.log10(d_out) - math.log10(d_in) >= 1:
            _mark(rows, messages, o, Highlight.YELLOW, YELLOW_MAGNITUDE)
            return
