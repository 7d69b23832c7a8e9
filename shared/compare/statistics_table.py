"""The statistics-mode table (compare.md §5) built column-wise: NumPy for the arithmetic, lists for the cells.

A statistics compare is ~60k rows of eight subtractions, eight divisions and eight ``"x%"`` strings. Row
by row in Python that was most of the engine's time; here the common row (a matched tensor pair with the
same dtype and requires_grad, eight finite float statistics, no zero in the bench) is computed for all rows
at once, and every other row (unmatched, NaN, inf, ints, strings, zeros, dtype or requires_grad mismatches)
goes through the row-at-a-time rules of ``parity.shared.compare.statistics`` and ``cells``. Both give the
same cells: the vector path does the same IEEE operations in the same order, and formats each relative
error as Python's ``repr`` does (see ``percent_strings``).

The builder also says which entries the highlight rules can skip: an entry whose every row is common, with
``|Max diff| <= 1`` and a MaxRelativeErr of at most 10 %, cannot trigger any rule of §7.2.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import eq

import numpy as np
import orjson
from parity.shared.compare import statistics as stats_mode
from parity.shared.compare import verdicts as v
from parity.shared.compare.cells import PairFacts, Table
from parity.shared.compare.result import Cell, CompareRow, RowStatus
from parity.shared.compare.rows import SideRows
from parity.shared.dump.columns import Leaf

NA = "N/A"
_PASS_TEXT, _FAIL_TEXT = RowStatus.PASS.value, RowStatus.FAIL.value
_DOUBLE_CHECK_TEXT = v.join_messages([stats_mode.NEED_DOUBLE_CHECK])

#: a requires_grad cell: ``N/A`` for a leaf without one (``get(rg, rg)``: a C-level pass, not a Python loop)
_NA_FOR_NONE: dict[str | None, str] = {None: NA}

#: where orjson's float text equals ``repr``: outside it one of them switches to exponent notation
_PLAIN_LOW, _PLAIN_HIGH = 1e-4, 1e16


def percent_strings(values: np.ndarray) -> list[str]:
    """``[f"{x}%" for x in values]`` for a 1-d array of non-negative float64 values, about 4x faster.

    orjson writes the same shortest round-trip digits as ``repr`` and, for 1e-4 <= x < 1e16, the same
    layout; values outside that range (exponent notation in one or both, ``inf``) are formatted by Python.
    """
    if values.ndim != 1:
        raise ValueError(f"percent_strings takes a 1-d array, not {values.ndim}-d")
    if values.size == 0:
        return []
    values = np.ascontiguousarray(values, dtype=np.float64)  # orjson serialises contiguous arrays only
    text = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].replace(b",", b"%,")
    out = (text.decode() + "%").split(",")
    outside = np.flatnonzero(~((values >= _PLAIN_LOW) & (values < _PLAIN_HIGH)))
    if outside.size:
        for k, x in zip(outside.tolist(), values[outside].tolist(), strict=True):
            out[k] = f"{x}%"
    return out


#: the Parity Pairing cell of a row the builder pairs (by name, or not at all); the engine writes the others
_BASIS: dict[bool, Cell] = {True: "name", False: None}

def statistics_row(name: str, n: Leaf, b_name: str | None, b: Leaf | None, fuzzy: bool,
                   ) -> tuple[list[Cell], list[str], RowStatus]:  # fmt: skip
    """One row the row-at-a-time way: its cells up to Err_message (left ``None``), messages and status."""
    facts = PairFacts(name, n, b_name, b, fuzzy)
    msgs, status = facts.messages, facts.status
    if b is None:
        metric: list[Cell] = [NA] * 8
        result: Cell = NA
        msgs.insert(0, stats_mode.NO_BENCH)  # msprobe: "No bench data matched." then "Requires_grad ..."
    else:
        metric, warn = stats_mode.statistics_cells(
            (n.max, n.min, n.mean, n.norm), (b.max, b.min, b.mean, b.norm)
        )
        if warn or status is RowStatus.FAIL:
            result = stats_mode.WARNING
            msgs.insert(0, stats_mode.NEED_DOUBLE_CHECK)
            status = RowStatus.FAIL
        else:
            result = ""
    return [*facts.prefix, *metric, *facts.stats, facts.rg_consistent, result, None], msgs, status


def build_statistics_rows(npu: SideRows, bench: SideRows, bench_index: Sequence[int], *, fuzzy: bool,
                          stack: list[Cell] | None) -> Table:  # fmt: skip
    """One row per NPU leaf, cells in the statistics header order; ``stack`` is the NPU_Stack_Info column
    when it is shown. ``Err_message`` and ``Parity Status`` are written as they stand before the highlight
    rules, which can change them only on the rows of ``highlight_ranges``."""
    out = Table()
    out.highlight_ranges = []
    n_rows, m_rows = len(npu), len(bench)
    if n_rows == 0:
        return out
    nc, bc = npu.columns, bench.columns
    idx = np.asarray(bench_index, dtype=np.intp)
    matched = idx >= 0
    safe = np.where(matched, idx, 0)
    a = np.frombuffer(nc.stats, dtype=np.float64).reshape(n_rows, 4)
    if m_rows:
        b = np.frombuffer(bc.stats, dtype=np.float64).reshape(m_rows, 4)[safe]
        b_plain = np.frombuffer(bc.plain, dtype=np.bool_)[safe]
        b_tensor = np.frombuffer(bc.is_tensor, dtype=np.bool_)[safe]
    else:
        b = np.ones((n_rows, 4))
        b_plain = b_tensor = np.zeros(n_rows, dtype=np.bool_)

    # Bench columns gathered into NPU order; a trailing N/A answers the index -1 of an unmatched row.
    def gather(column: list) -> list:  # type: ignore[type-arg]
        return list(map([*column, NA].__getitem__, bench_index))

    b_names, b_dtypes = gather(bench.names), gather(bc.dtypes)
    b_shapes, b_rgs = gather(bc.shapes), gather(bc.requires_grads)
    common = (matched & np.frombuffer(nc.is_tensor, dtype=np.bool_) & b_tensor
              & np.fromiter(map(eq, nc.dtypes, b_dtypes), np.bool_, n_rows)
              & np.fromiter(map(eq, nc.requires_grads, b_rgs), np.bool_, n_rows))  # fmt: skip
    if fuzzy:
        common &= np.fromiter(map(eq, npu.names, b_names), np.bool_, n_rows)
    with np.errstate(all="ignore"):
        d = a - b
        rel = np.abs(d / b * 100)
        warn = (np.abs(d) / (np.abs(np.maximum(a, b)) + 1e-10) > 0.5).any(axis=1)
    fast = (common & np.frombuffer(nc.plain, dtype=np.bool_) & b_plain & np.isfinite(d).all(axis=1)
            & (b != 0).all(axis=1))  # fmt: skip
    quiet = fast & (np.abs(d[:, 0]) <= 1.0) & (rel[:, 0] <= 10.0)
    rel[~fast] = 1.0  # slow rows are rebuilt below: keep their placeholders cheap to format
    percents = percent_strings(np.ascontiguousarray(rel.T).ravel())
    warn_fast = warn & fast

    # Err_message and Parity Status are final here for every row the highlight rules cannot reach (see
    # ``_noisy_ranges``); the engine finishes the rows of the highlight ranges only.
    warned = np.flatnonzero(warn_fast).tolist()
    results: list[Cell] = [""] * n_rows
    status = [RowStatus.PASS] * n_rows
    status_text: list[Cell] = [_PASS_TEXT] * n_rows
    messages: list[list[str]] = list(map(list, repeat((), n_rows)))
    err_message: list[Cell] = [""] * n_rows
    for i in warned:
        results[i] = stats_mode.WARNING
        status[i] = RowStatus.FAIL
        status_text[i] = _FAIL_TEXT
        messages[i] = [stats_mode.NEED_DOUBLE_CHECK]
        err_message[i] = _DOUBLE_CHECK_TEXT
    columns: list[list[Cell]] = [
        npu.names, b_names, nc.dtypes, b_dtypes, nc.shapes, b_shapes,  # type: ignore[list-item]
        list(map(_NA_FOR_NONE.get, nc.requires_grads, nc.requires_grads)),
        list(map(_NA_FOR_NONE.get, b_rgs, b_rgs)),
        *d.T.tolist(), *(percents[k * n_rows : (k + 1) * n_rows] for k in range(4)),
        *a.T.tolist(), *b.T.tolist(), [True] * n_rows, results, err_message,
    ]  # fmt: skip
    if stack is not None:
        columns.append(stack)
    status_col = len(columns)
    columns += (status_text, npu.apis, list(map(_BASIS.__getitem__, matched.tolist())), [None] * n_rows)
    cells = list(map(list, zip(*columns, strict=True)))
    for i in np.flatnonzero(~fast).tolist():
        j = bench_index[i]
        head, msgs, row_status = statistics_row(
            npu.names[i],
            nc.leaf(i),
            bench.names[j] if j >= 0 else None,
            bc.leaf(j) if j >= 0 else None,
            fuzzy,
        )
        row = cells[i]
        row[: len(head)] = head
        row[len(head) - 1] = v.join_messages(msgs) if msgs else ""
        row[status_col] = row_status.value
        messages[i], status[i] = msgs, row_status
    out.rows = list(map(CompareRow, cells, npu.apis, status))
    out.states = list(nc.states)  # the engine appends bench-only rows' states: not to the dump's list
    out.messages = messages
    out.highlight_ranges = _noisy_ranges(np.frombuffer(nc.entry_of, dtype=np.intc), quiet)
    return out


def _noisy_ranges(entry_of: np.ndarray, quiet: np.ndarray) -> list[tuple[int, int]]:
    """The row range of every entry holding a row that is not quiet (rows of an entry are consecutive)."""
    noisy = np.unique(entry_of[~quiet])
    if noisy.size == 0:
        return []
    starts = np.searchsorted(entry_of, noisy, side="left")
    stops = np.searchsorted(entry_of, noisy, side="right")
    return list(zip(starts.tolist(), stops.tolist(), strict=True))
