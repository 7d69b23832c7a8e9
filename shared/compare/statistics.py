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
NEED_DOUBLE_CHECK = "Need double check api accuracy."
NO_BENCH = "No bench data matched."

_INF = float("inf")


def finite_cell(value: Any) -> Cell:
    """A float as a table cell: NaN → ``Nan``, ±inf → ``inf``/``-inf`` (xlsx and JSON cannot hold them)."""
    if type(value) is float and value - value != 0.0:  # nan - nan and inf - inf are both nan
        if value != value:
            return NAN
        return "inf" if value > 0 else "-inf"
    return value  # type: ignore[no-any-return]


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
    d0, r0, w0 = stat_diff(npu_stats[0], bench_stats[0])
    d1, r1, w1 = stat_diff(npu_stats[1], bench_stats[1])
    d2, r2, w2 = stat_diff(npu_stats[2], bench_stats[2])
    d3, r3, w3 = stat_diff(npu_stats[3], bench_stats[3])
    return [d0, d1, d2, d3, r0, r1, r2, r3], (w0 or w1 or w2 or w3)
