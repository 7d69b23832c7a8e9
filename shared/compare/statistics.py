"""Statistics mode (compare.md §5, msprobe v1 column): diffs of the dumped Max/Min/Mean/Norm, NPU − bench.

Per statistic ``s`` the diff is ``s(N) - s(B)`` and the relative error the string
``f"{abs(d / s(B) * 100)}%"`` (Python float repr, no rounding). The table cases fall out of IEEE arithmetic:
a NaN diff (NaN on a side, or the same infinity on both) is ``Nan``/``Nan``; a zero bench gives ``N/A``; an
infinite NPU gives ``inf%``; an infinite bench ``nan%``; +inf vs -inf gives an infinite diff (a difference,
not "equal" as msprobe's tensor path thinks). Bool, strings and None are not numbers: ``N/A``/``N/A``.
"""

from __future__ import annotations

from typing import Any

from parity.shared.compare.result import Cell

NA = "N/A"
NAN = "Nan"
WARNING = "Warning"
#: Err_message of a v1 ``Warning`` row
NEED_DOUBLE_CHECK = "Need double check api accuracy. "  # msprobe's spelling, trailing space included
NO_BENCH = "No bench data matched."

_INF = float("inf")


def finite_cell(value: Any) -> Cell:
    """A float as a table cell: NaN → ``Nan``, ±inf → ``inf``/``-inf`` (xlsx and JSON cannot hold them)."""
    if type(value) is float and value - value != 0.0:  # nan - nan and inf - inf are both nan
        if value != value:
            return NAN
        return "inf" if value > 0 else "-inf"
    return value  # type: ignore[no-any-return]


def stat_cells(a: Any, b: Any, c: Any, d: Any) -> list[Cell]:
    """Four dumped statistics as table cells (NaN/inf spelled out), with a fast path for finite floats."""
    if type(a) is float and type(b) is float and type(c) is float and type(d) is float:
        if (a + b + c + d) * 0.0 == 0.0:
            return [a, b, c, d]
    return [_stat_cell(a), _stat_cell(b), _stat_cell(c), _stat_cell(d)]


def _stat_cell(value: Any) -> Cell:
    # msprobe writes a missing statistic (a null leaf, an empty tensor) as the text None, not an empty cell
    return "None" if value is None else finite_cell(value)


def stat_diff(npu: Any, bench: Any) -> tuple[Cell, Cell, bool]:
    """``(diff cell, relative-error cell, v1 warning)`` for one statistic of one row pair.

    The warning is v1's Result rule: ``|d| / (|max(n, b)| + 1e-10) > 0.5`` (the signed max, as msprobe).
    """
    tn, tb = type(npu), type(bench)
    if (tn is float or tn is int) and (tb is float or tb is int):
        diff = npu - bench
        if diff != diff:
            return NAN, NAN, False
        warn = abs(diff) / (abs(max(npu, bench)) + 1e-10) > 0.5
        if bench == 0:
            return finite_cell(diff), NA, warn
        try:
            rel = abs(diff / bench * 100)
        except OverflowError:  # int / int beyond float range
            rel = _INF
        return finite_cell(diff), f"{rel}%", warn
    return NA, NA, False


def statistics_cells(npu_stats: tuple[Any, Any, Any, Any], bench_stats: tuple[Any, Any, Any, Any] | None,
                     ) -> tuple[list[Cell], bool]:  # fmt: skip
    """The 8 metric cells (4 diffs, then 4 relative errors) and whether v1 says ``Warning``."""
    if bench_stats is None:
        return [NA] * 8, False
    a0, a1, a2, a3 = npu_stats
    b0, b1, b2, b3 = bench_stats
    # Fast path, the common row: eight floats, finite diffs, no zero in the bench. Same formulas as
    # stat_diff, unrolled, because this runs once per row of a 60k-row table.
    f = float
    if (type(a0) is f and type(a1) is f and type(a2) is f and type(a3) is f
            and type(b0) is f and type(b1) is f and type(b2) is f and type(b3) is f):  # fmt: skip
        d0, d1, d2, d3 = a0 - b0, a1 - b1, a2 - b2, a3 - b3
        if (d0 + d1 + d2 + d3) * 0.0 == 0.0 and b0 and b1 and b2 and b3:
            warn = (
                abs(d0) / (abs(a0 if a0 >= b0 else b0) + 1e-10) > 0.5
                or abs(d1) / (abs(a1 if a1 >= b1 else b1) + 1e-10) > 0.5
                or abs(d2) / (abs(a2 if a2 >= b2 else b2) + 1e-10) > 0.5
                or abs(d3) / (abs(a3 if a3 >= b3 else b3) + 1e-10) > 0.5
            )
            return [d0, d1, d2, d3, f"{abs(d0 / b0 * 100)}%", f"{abs(d1 / b1 * 100)}%",
                    f"{abs(d2 / b2 * 100)}%", f"{abs(d3 / b3 * 100)}%"], warn  # fmt: skip
    d0, r0, w0 = stat_diff(npu_stats[0], bench_stats[0])
    d1, r1, w1 = stat_diff(npu_stats[1], bench_stats[1])
    d2, r2, w2 = stat_diff(npu_stats[2], bench_stats[2])
    d3, r3, w3 = stat_diff(npu_stats[3], bench_stats[3])
    return [d0, d1, d2, d3, r0, r1, r2, r3], (w0 or w1 or w2 or w3)
