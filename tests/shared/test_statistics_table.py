"""``statistics_table``: ``percent_strings``, the column-wise table and its highlight ranges.

``percent_strings`` must format exactly as Python does. ``build_statistics_rows`` (and the engine built on
it) must give the cells, messages and status ``statistics_row`` gives one row at a time, on a hand-made dump
pair holding every kind of leaf a statistics dump can hold. Its ``highlight_ranges`` may skip only entries
where no highlight rule can fire: colouring and Err_message must equal a highlight pass over every row.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from parity.shared.compare import highlight as hl
from parity.shared.compare import statistics as stats_mode
from parity.shared.compare import verdicts as v
from parity.shared.compare.alignment import pair_calls
from parity.shared.compare.cells import Table, stack_cells
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.headers import CompareMode, full_header
from parity.shared.compare.highlight import apply_highlights
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.pairing import pair_rows
from parity.shared.compare.result import CompareResult, Highlight, RowStatus
from parity.shared.compare.rows import SideRows, side_rows
from parity.shared.compare.statistics_table import build_statistics_rows, percent_strings, statistics_row
from parity.shared.dump.reader import Dump, load_dump

from tests.factories import scalar_leaf, stats_leaf

HEADER = full_header(CompareMode.STATISTICS, stack=False)
RESULT_COL = HEADER.index("Result")
MSG_COL = HEADER.index("Err_message")
NAN, INF = math.nan, math.inf

# ----------------------------------------------------------------------------------------------------------
# percent_strings


def _python(values: np.ndarray) -> list[str]:
    return [f"{x}%" for x in values.tolist()]


EDGE_VALUES = [
    0.0, 5e-324, 1e-323, 2.2250738585072014e-308, 1e-300, 1e-5, 9.99999999999999e-05,
    9.999999999999999e-05, 1e-4, 1.0000000000000002e-4, 0.00012345678901234567, 0.1, 0.30000000000000004,
    1.0, 2.0, 12.5, 100.0, 123456789.0, 2.0**53, 2.0**53 + 2, 1e15, 9999999999999998.0, 1e16,
    1.0000000000000002e16, 12345678901234568.0, 1e17, 1e22, 1e300, 1.7976931348623157e308, math.inf,
]  # fmt: skip


@pytest.mark.parametrize("value", EDGE_VALUES)
def test_percent_strings_of_one_edge_value(value: float) -> None:
    assert percent_strings(np.array([value], dtype=np.float64)) == [f"{value}%"]


def test_percent_strings_keep_positions_when_plain_and_exponent_values_interleave() -> None:
    values = np.array(EDGE_VALUES + EDGE_VALUES[::-1] + [3.5, 1e-7, 7.25, math.inf, 0.0, 42.0])
    assert percent_strings(values) == _python(values)


def test_percent_strings_of_nothing() -> None:
    assert percent_strings(np.array([], dtype=np.float64)) == []


def test_percent_strings_next_to_every_power_of_ten() -> None:
    # Where repr and orjson switch layouts; the neighbours of each power of ten, a few ulps either side.
    powers = 10.0 ** np.arange(-8, 20, dtype=np.float64)
    around = [powers]
    for direction in (0.0, np.inf):
        step = powers
        for _ in range(3):
            step = np.nextafter(step, direction)
            around.append(step)
    values = np.concatenate(around)
    assert percent_strings(values) == _python(values)


_near_boundaries = st.one_of(
    st.floats(min_value=0.0, allow_nan=False, allow_infinity=True),
    st.floats(min_value=5e-5, max_value=2e-4),
    st.floats(min_value=5e15, max_value=2e16),
    st.integers(min_value=0, max_value=2**60).map(float),
    st.floats(min_value=0.0, max_value=1e-300),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0, allow_nan=False, allow_infinity=True), max_size=300))
def test_percent_strings_equal_python_formatting(values: list[float]) -> None:
    array = np.array(values, dtype=np.float64)
    assert percent_strings(array) == _python(array)


@settings(max_examples=300, deadline=None)
@given(st.lists(_near_boundaries, min_size=1, max_size=100))
def test_percent_strings_equal_python_formatting_near_the_layout_switches(values: list[float]) -> None:
    array = np.array(values, dtype=np.float64)
    assert percent_strings(array) == _python(array)


def test_percent_strings_of_a_strided_view() -> None:
    values = np.arange(10.0)[::2]
    assert percent_strings(values) == _python(values)


# ----------------------------------------------------------------------------------------------------------
# a dump pair with every kind of leaf


def _kinds(non_finite: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """NPU and bench ``data`` of a statistics dump pair: one entry per kind of row the table must handle."""
    f32, i32 = "torch.float32", "torch.int32"
    npu: dict[str, Any] = {}
    bench: dict[str, Any] = {}

    def entry(name: str, n: dict[str, Any] | None, b: dict[str, Any] | None) -> None:
        if n is not None:
            npu[name] = n
        if b is not None:
            bench[name] = b

    entry(
        "Functional.linear.0.forward",
        {
            "input_args": [
                stats_leaf(1.0, -1.0, 0.1, 2.0),
                stats_leaf(2.0, 0.5, 1.0, 3.0),
                stats_leaf(1.0, 1e-3, 0.5, 1.0),
                stats_leaf(1e308, -1e308, 1e308, 1e308),
                stats_leaf(1.0, 5e-324, 0.5, 1.0),
                stats_leaf(1e300, 1.0, 1.0, 1.0),
            ],
            "parameters": {"weight": stats_leaf(0.5, -0.5, 0.0, 4.0, requires_grad=True),
                           "bias": stats_leaf(0.1, -0.1, 0.01, 0.2, requires_grad=True)},
            "output": [stats_leaf(10.0, -3.0, 2.0, 30.0)],
        },
        {
            "input_args": [
                stats_leaf(1.001, -0.999, 0.1001, 2.002),
                stats_leaf(2.0, 0.0, 1.0, 3.0),  # a zero bench Min
                stats_leaf(1.0, -0.0, 0.5, 1.0),  # a negative zero bench Min
                stats_leaf(-1e308, 1e308, 1e307, 1e-308),  # diffs and relative errors overflow
                stats_leaf(5e-324, 1.0, 0.5, 1.0),  # a subnormal bench
                stats_leaf(1e-10, 1.0, 1.0, 1.0),  # a finite diff whose relative error overflows
            ],
            "parameters": {"weight": stats_leaf(0.5, -0.5, 1e-9, 4.0, requires_grad=True),
                           "bias": stats_leaf(0.1, -0.1, 0.01, 0.2, requires_grad=True)},
            "output": [stats_leaf(2.0, -3.0, 2.0, 30.0)],  # Max off by 400 %: Warning
        },
    )  # fmt: skip
    entry(
        "Torch.add.0.forward",
        {
            "input_args": [
                stats_leaf(3, 0, 1.5, 4.0, dtype="torch.int64"),
                stats_leaf(True, False, None, None, dtype="torch.bool"),
                scalar_leaf(3), scalar_leaf(0.5), scalar_leaf("mean"), scalar_leaf(True), None,
                {"type": "torch.Size", "value": [2, 3]},
                stats_leaf(None, None, None, None, shape=(0,)),  # an empty tensor
            ],
            "input_kwargs": {"alpha": scalar_leaf(2), "beta": {"type": "float", "value": 0.0}},
            "output": [stats_leaf(4.0, 0.0, 2.0, 8.0)],
        },
        {
            "input_args": [
                stats_leaf(4, 0, 1.5, 4.0, dtype="torch.int64"),
                stats_leaf(True, True, None, None, dtype="torch.bool"),
                scalar_leaf(4), scalar_leaf(0.5), scalar_leaf("sum"), scalar_leaf(True), None,
                {"type": "torch.Size", "value": [2, 3]},
                stats_leaf(None, None, None, None, shape=(0,)),
            ],
            "input_kwargs": {"alpha": scalar_leaf(2), "beta": {"type": "float", "value": 0.0}},
            "output": [stats_leaf(4.0, 1.0, 2.0, 8.0)],
        },
    )  # fmt: skip
    entry(
        "Tensor.__mul__.0.forward",
        {
            "input_args": [
                stats_leaf(1.0, 0.0, 0.5, 1.0, requires_grad=True),
                stats_leaf(1.0, 0.0, 0.5, 1.0, dtype=f32),
                stats_leaf(1.0, 0.0, 0.5, 1.0, dtype="torch.float16"),
                stats_leaf(1.5, 0.5, 1.0, 2.0, requires_grad=None),
                stats_leaf("a", "b", "c", "d"),
            ],
            "output": [stats_leaf(2.0, 1.0, 1.5, 3.0, requires_grad=True)],
        },
        {
            "input_args": [
                stats_leaf(1.0, 0.0, 0.5, 1.0, requires_grad=False),  # requires_grad mismatch
                stats_leaf(1.0, 0.0, 0.5, 1.0, dtype=i32),  # dtype mismatch
                stats_leaf(1.1, 0.0, 0.5, 1.0, dtype=f32),  # compatible float dtypes, not equal
                stats_leaf(1.5, 0.5, 1.0, 2.5, requires_grad=None),
                stats_leaf("a", "x", "c", "d"),
            ],
            "output": [stats_leaf(2.0, 1.0, 1.5, 3.0, requires_grad=True)],
        },
    )  # fmt: skip
    entry("Torch.npu_only.0.forward", {"input_args": [stats_leaf(1.0, 0.0, 0.5, 1.0)],
                                       "output": [stats_leaf(2.0, 0.0, 1.0, 2.0)]}, None)  # fmt: skip
    entry("Torch.bench_only.0.forward", None, {"input_args": [stats_leaf(1.0, 0.0, 0.5, 1.0)],
                                               "output": [stats_leaf(2.0, 0.0, 1.0, 2.0)]})  # fmt: skip
    entry(
        "Torch.cat.0.forward",
        {"input_args": [stats_leaf(1.0, 0.0, 0.5, 1.0), stats_leaf(2.0, 0.0, 1.0, 2.0),
                        stats_leaf(3.0, 0.0, 1.5, 3.0)],  # the third input has no bench row
         "output": [stats_leaf(3.0, 0.0, 1.0, 4.0)]},
        {"input_args": [stats_leaf(1.0, 0.0, 0.5, 1.0), stats_leaf(2.0, 0.0, 1.0, 2.0)],
         "output": [stats_leaf(3.0, 0.0, 1.0, 4.0), stats_leaf(9.0, 0.0, 1.0, 9.0)]},  # a bench-only output
    )  # fmt: skip
    # Backward renumbering pairs NPU relu.1.backward with bench relu.0.backward: names differ, no fuzzy.
    entry("Functional.relu.1.backward",
          {"input": [stats_leaf(1.0, 0.0, 0.5, 1.0)], "output": [stats_leaf(1.0, 0.0, 0.25, 1.0)]},
          None)  # fmt: skip
    relu_backward = {"input": [stats_leaf(1.0, 0.0, 0.5, 1.0)], "output": [stats_leaf(1.5, 0.0, 0.25, 1.0)]}
    entry("Functional.relu.0.backward", None, relu_backward)
    # Fuzzy matching pairs sub.3 with sub.5; exact matching leaves both unpaired.
    entry("Torch.sub.3.forward", {"input_args": [stats_leaf(1.0, 0.0, 0.5, 1.0)]}, None)
    entry("Torch.sub.5.forward", None, {"input_args": [stats_leaf(1.0, 0.0, 0.5, 1.2)]})
    p2p = {"class_type": "torch.distributed.P2POp", "op": "isend", "peer": 1, "tag": 0}
    entry("Distributed.isend.0.forward", {"input_args": [p2p | {"tensor": stats_leaf(1.0, 0.0, 0.5, 1.0)}]},
          {"input_args": [p2p | {"tensor": stats_leaf(1.0, 0.0, 0.5, 1.5)}]})  # fmt: skip
    entry("Module.fc.Linear.parameters_grad", {"weight": [stats_leaf(0.1, -0.1, 0.0, 0.3)]},
          {"weight": [stats_leaf(0.1, -0.1, 0.0, 0.4)]})  # fmt: skip
    entry("Torch.empty.0.forward", {"input_args": [], "output": []}, {"input_args": [], "output": []})
    if non_finite:
        entry(
            "Torch.exp.0.forward",
            {"input_args": [stats_leaf(NAN, 0.0, NAN, 1.0), stats_leaf(INF, -INF, 1.0, INF),
                            stats_leaf(INF, 1.0, 1.0, 2.0), stats_leaf(2.0, 1.0, 1.0, 2.0),
                            stats_leaf(INF, -INF, 0.0, 1.0)],
             "output": [stats_leaf(NAN, NAN, NAN, NAN), stats_leaf(1.0, -INF, 0.5, 2.0)]},
            {"input_args": [stats_leaf(NAN, 0.0, NAN, 1.0), stats_leaf(INF, -INF, 1.0, INF),
                            stats_leaf(2.0, 1.0, 1.0, 2.0), stats_leaf(INF, 1.0, 1.0, 2.0),
                            stats_leaf(-INF, INF, 0.0, 1.0)],
             "output": [stats_leaf(1.0, 0.0, 0.5, 2.0), stats_leaf(1.0, -INF, 0.5, 2.0)]},
        )  # fmt: skip
    # Many common rows, so most of the table goes through the vector path.
    rng = np.random.default_rng(11)
    for k in range(60):
        n_leaves, b_leaves = [], []
        for _ in range(3):
            base = rng.standard_normal(4) * 10.0 ** rng.integers(-6, 9)
            factor = 1 + rng.choice([0.0, 1e-7, 1e-3, 0.05, 0.3, 0.8, -2.0], size=4)
            n_leaves.append(stats_leaf(*map(float, base * factor)))
            b_leaves.append(stats_leaf(*map(float, base)))
        entry(f"Torch.matmul.{k}.forward", {"input_args": n_leaves[:2], "output": n_leaves[2:]},
              {"input_args": b_leaves[:2], "output": b_leaves[2:]})  # fmt: skip
    return npu, bench


def _write(path: Path, data: dict[str, Any], *, allow_nan: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}
    path.write_text(json.dumps(doc, indent=1, allow_nan=allow_nan))
    return path


def _kinds_pair(tmp_path: Path, non_finite: bool) -> tuple[Path, Path]:
    npu, bench = _kinds(non_finite)
    paths = (_write(tmp_path / "npu" / "dump.json", npu, allow_nan=non_finite),
             _write(tmp_path / "bench" / "dump.json", bench, allow_nan=non_finite))  # fmt: skip
    raw = paths[0].read_bytes() + paths[1].read_bytes()
    assert (b"NaN" in raw and b"Infinity" in raw) is non_finite  # bare tokens exactly when asked for
    return paths


def _sides(npu_path: Path, bench_path: Path) -> tuple[Dump, Dump, SideRows, SideRows]:
    npu, bench = load_dump(npu_path), load_dump(bench_path)
    return npu, bench, side_rows(npu, tensor_mode=False), side_rows(bench, tensor_mode=False)


def _row_at_a_time(npu: Dump, bench: Dump, npu_rows: SideRows, bench_rows: SideRows, bench_index: list[int],
                   fuzzy: bool) -> list[tuple[list[Any], list[str], RowStatus]]:  # fmt: skip
    out = []
    for i in range(len(npu_rows)):
        j = bench_index[i]
        b_name, b_leaf = (bench_rows.names[j], bench.columns.leaf(j)) if j >= 0 else (None, None)
        out.append(statistics_row(npu_rows.names[i], npu.columns.leaf(i), b_name, b_leaf, fuzzy))
    return out


def _reprs(cells: list[Any]) -> list[str]:
    return [repr(c) for c in cells]


@pytest.mark.parametrize("fuzzy", [False, True])
@pytest.mark.parametrize("non_finite", [True, False])
def test_engine_cells_equal_the_row_at_a_time_rules(tmp_path: Path, non_finite: bool, fuzzy: bool) -> None:
    npu_path, bench_path = _kinds_pair(tmp_path, non_finite)
    result = compare_dumps(npu_path, bench_path, CompareOptions(fuzzy_match=fuzzy))
    npu, bench, npu_rows, bench_rows = _sides(npu_path, bench_path)
    pairing = pair_calls(npu_rows, bench_rows, fuzzy=fuzzy)[0]  # the engine's pairing (aligned: issue 24)
    expected = _row_at_a_time(npu, bench, npu_rows, bench_rows, pairing.bench_index, fuzzy)
    assert result.header == HEADER
    assert len(result.rows) == len(npu_rows) + len(pairing.bench_only)
    for i, (cells, messages, _status) in enumerate(expected):
        got = result.rows[i].cells
        assert _reprs(got[: RESULT_COL + 1]) == _reprs(cells[: RESULT_COL + 1]), npu_rows.names[i]
        assert result.rows[i].api == npu_rows.apis[i]
        for fragment in messages:  # highlights may add reasons, never drop the pair's own
            assert fragment.strip() in str(got[MSG_COL])
    for row in result.rows[len(npu_rows) :]:
        assert row.status is RowStatus.BENCH_ONLY
    # The pair really mixes the vector path's floats with every sentinel of the row-at-a-time rules.
    shown = {c for row in result.rows for c in row.cells[8 : RESULT_COL + 1] if isinstance(c, str)}
    assert {"N/A", "inf%", stats_mode.WARNING} <= shown
    assert ({"Nan", "inf", "-inf", "nan%"} <= shown) is non_finite
    kinds = {type(c) for row in result.rows for c in row.cells[8:24]}
    assert {float, int, str, bool} <= kinds


def _by_name(result: CompareResult) -> dict[str, list[Any]]:
    return {str(row.cells[0]): row.cells for row in result.rows if row.status is not RowStatus.BENCH_ONLY}


def test_engine_cells_of_hand_checked_rows(tmp_path: Path) -> None:
    # Independent of statistics_row: what the compare.md §5 formulas give, worked out here.
    result = compare_dumps(*_kinds_pair(tmp_path, non_finite=True), CompareOptions())
    rows = _by_name(result)
    col = HEADER.index

    def cells(name: str, first: str, count: int) -> list[Any]:
        start = col(first)
        return rows[name][start : start + count]

    lin = "Functional.linear.0.forward"
    assert cells(f"{lin}.input.0", "Max diff", 8) == [
        1.0 - 1.001, -1.0 - -0.999, 0.1 - 0.1001, 2.0 - 2.002,
        f"{abs((1.0 - 1.001) / 1.001 * 100)}%", f"{abs((-1.0 + 0.999) / -0.999 * 100)}%",
        f"{abs((0.1 - 0.1001) / 0.1001 * 100)}%", f"{abs((2.0 - 2.002) / 2.002 * 100)}%",
    ]  # fmt: skip
    assert rows[f"{lin}.input.0"][RESULT_COL] == ""
    assert cells(f"{lin}.input.1", "MinRelativeErr", 1) == ["N/A"]  # zero bench
    assert cells(f"{lin}.input.2", "MinRelativeErr", 1) == ["N/A"]  # negative zero bench
    assert cells(f"{lin}.input.3", "Max diff", 1) == ["inf"]  # 1e308 - -1e308 overflows
    assert cells(f"{lin}.input.4", "MaxRelativeErr", 1) == ["inf%"]  # 1.0 / 5e-324
    assert cells(f"{lin}.input.5", "Max diff", 5) == [1e300 - 1e-10, 0.0, 0.0, 0.0, "inf%"]
    assert rows[f"{lin}.input.5"][RESULT_COL] == stats_mode.WARNING
    assert cells(f"{lin}.output.0", "Max diff", 5) == [8.0, 0.0, 0.0, 0.0, "400.0%"]
    assert rows[f"{lin}.output.0"][RESULT_COL] == stats_mode.WARNING
    add = "Torch.add.0.forward"
    assert cells(f"{add}.input.0", "Max diff", 5) == [-1, 0, 0.0, 0.0, "25.0%"]  # int statistics
    assert type(rows[f"{add}.input.0"][col("Max diff")]) is int
    assert cells(f"{add}.input.1", "Max diff", 8) == ["N/A"] * 8  # bools are not numbers
    assert rows[f"{add}.input.2"][RESULT_COL] == stats_mode.WARNING  # scalar 3 vs 4
    assert v.MSG_SCALAR_MISMATCH in rows[f"{add}.input.2"][MSG_COL]
    mul = "Tensor.__mul__.0.forward"
    assert rows[f"{mul}.input.0"][col("Requires_grad Consistent")] is False
    assert v.MSG_REQUIRES_GRAD in rows[f"{mul}.input.0"][MSG_COL]
    assert v.MSG_DTYPE_MISMATCH in rows[f"{mul}.input.1"][MSG_COL]
    assert rows[f"{mul}.input.1"][RESULT_COL] == stats_mode.WARNING
    assert rows["Torch.cat.0.forward.input.2"][col("Bench Name")] == "N/A"
    assert rows["Torch.cat.0.forward.input.2"][RESULT_COL] == "N/A"
    assert (
        rows["Functional.relu.1.backward.output.0"][col("Bench Name")]
        == "Functional.relu.0.backward.output.0"
    )
    assert cells("Torch.exp.0.forward.input.0", "Max diff", 5) == ["Nan", 0.0, "Nan", 0.0, "Nan"]
    assert cells("Torch.exp.0.forward.input.3", "Max diff", 5) == ["-inf", 0.0, 0.0, 0.0, "nan%"]


@pytest.mark.parametrize("fuzzy", [False, True])
@pytest.mark.parametrize("non_finite", [True, False])
def test_table_rows_messages_and_status_equal_the_row_at_a_time_rules(tmp_path: Path, non_finite: bool,
                                                                      fuzzy: bool) -> None:  # fmt: skip
    npu, bench, npu_rows, bench_rows = _sides(*_kinds_pair(tmp_path, non_finite))
    index = pair_rows(npu_rows, bench_rows, fuzzy=fuzzy).bench_index
    table = build_statistics_rows(npu_rows, bench_rows, index, fuzzy=fuzzy, stack=None)
    expected = _row_at_a_time(npu, bench, npu_rows, bench_rows, index, fuzzy)
    assert len(table.rows) == len(table.messages) == len(npu_rows)
    for i, (cells, messages, status) in enumerate(expected):
        row = table.rows[i]
        assert _reprs(row.cells[:MSG_COL]) == _reprs(cells[:MSG_COL]), npu_rows.names[i]
        # Err_message, Parity Status (as they stand before the highlight rules) and Parity API
        err_message = v.join_messages(messages) if messages else ""
        basis = "name" if index[i] >= 0 else None
        expected_tail = [err_message, status.value, npu_rows.apis[i], basis, None]
        assert row.cells[MSG_COL:] == expected_tail, npu_rows.names[i]
        assert table.messages[i] == messages, npu_rows.names[i]
        assert row.status is status, npu_rows.names[i]
        assert (row.api, row.highlight) == (npu_rows.apis[i], None)
    assert table.states == npu.columns.states
    statuses = {row.status for row in table.rows}
    assert {RowStatus.PASS, RowStatus.FAIL, RowStatus.UNMATCHED} <= statuses


def test_table_with_the_stack_column(tmp_path: Path) -> None:
    npu, bench, npu_rows, bench_rows = _sides(*_kinds_pair(tmp_path, non_finite=False))
    index = pair_rows(npu_rows, bench_rows, fuzzy=False).bench_index
    stacks = {"Functional.linear.0.forward": ["model.py:3 forward"], "Torch.add.0.forward": ["a.py:1 f"]}
    stack = stack_cells(npu_rows.apis, stacks)
    header = full_header(CompareMode.STATISTICS, stack=True)
    with_stack = build_statistics_rows(npu_rows, bench_rows, index, fuzzy=False, stack=stack)
    without = build_statistics_rows(npu_rows, bench_rows, index, fuzzy=False, stack=None)
    stack_col = header.index("NPU_Stack_Info")
    for i, (a, b) in enumerate(zip(with_stack.rows, without.rows, strict=True)):
        assert len(a.cells) == len(header)
        assert _reprs(a.cells[:stack_col]) == _reprs(b.cells[:stack_col])
        # Parity Status, Parity API, Parity Pairing, Parity Gap
        assert a.cells[stack_col:] == [stack[i], *b.cells[stack_col:]]
    assert with_stack.rows[0].cells[stack_col] == repr(["model.py:3 forward"])


def test_a_bench_dump_without_rows(tmp_path: Path) -> None:
    npu_data, _ = _kinds(non_finite=False)
    npu_path = _write(tmp_path / "npu" / "dump.json", npu_data, allow_nan=False)
    bench_path = _write(tmp_path / "bench" / "dump.json", {}, allow_nan=False)
    npu, bench, npu_rows, bench_rows = _sides(npu_path, bench_path)
    index = pair_rows(npu_rows, bench_rows, fuzzy=False).bench_index
    table = build_statistics_rows(npu_rows, bench_rows, index, fuzzy=False, stack=None)
    expected = _row_at_a_time(npu, bench, npu_rows, bench_rows, index, False)
    assert [_reprs(r.cells[:MSG_COL]) for r in table.rows] == [_reprs(c[:MSG_COL]) for c, _m, _s in expected]
    assert [r.cells[MSG_COL] for r in table.rows] == [v.join_messages(m) for _c, m, _s in expected]
    assert all(row.status is RowStatus.UNMATCHED for row in table.rows)
    # Every entry is noisy (its rows are unmatched): the ranges cover the table, entry by entry.
    assert table.highlight_ranges is not None
    starts = [start for start, _stop in table.highlight_ranges]
    assert starts == [i for i in range(len(npu_rows)) if i == 0 or npu_rows.apis[i - 1] != npu_rows.apis[i]]
    assert table.highlight_ranges[-1][1] == len(npu_rows)
    assert all(a[1] == b[0] for a, b in zip(table.highlight_ranges, table.highlight_ranges[1:], strict=False))


# ----------------------------------------------------------------------------------------------------------
# highlight ranges


def _noisy_data(seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Entries of a few rows each, most quiet, others built to trip one highlight rule each."""
    rng = np.random.default_rng(seed)
    npu: dict[str, Any] = {}
    bench: dict[str, Any] = {}
    kinds = ["quiet"] * 6 + ["red_rel", "yellow_rel", "magnitude", "huge", "nan_max", "requires_grad",
                             "edge_quiet", "edge_noisy", "unmatched", "tiny_in_diff"]  # fmt: skip

    def pair(n_max: float, b_max: float, *, n_rg: bool = False, b_rg: bool = False
             ) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
        rest = rng.uniform(1.0, 2.0, size=3)
        mn, mean, norm = (float(x) for x in rest)
        return (stats_leaf(n_max, -mn, mean, norm, requires_grad=n_rg),
                stats_leaf(b_max, -mn, mean, norm, requires_grad=b_rg))  # fmt: skip

    def close(base: float) -> tuple[dict[str, Any], dict[str, Any]]:
        return pair(base * (1 + float(rng.uniform(-1e-3, 1e-3))), base)

    for k in range(300):
        kind = str(rng.choice(kinds))
        name = f"{rng.choice(['Torch.add', 'Functional.linear', 'Tensor.__mul__'])}.{k}.forward"
        base = float(rng.uniform(0.5, 5.0))
        ins = [close(base) for _ in range(int(rng.integers(1, 4)))]
        outs = [close(base) for _ in range(int(rng.integers(1, 3)))]
        if kind == "red_rel":  # output MaxRelativeErr > 50 %
            outs[0] = pair(base * float(rng.uniform(1.6, 3.0)), base)
        elif kind == "yellow_rel":  # output in (10 %, 50 %], inputs below 1 %
            outs[-1] = pair(base * float(rng.uniform(1.15, 1.45)), base)
        elif kind == "magnitude":  # |Max diff| above 1 on both sides, the output's 10x+ larger, small rel
            ins[0] = pair(1000.0 + float(rng.uniform(1.5, 3.0)), 1000.0)
            outs[0] = pair(100000.0 + float(rng.uniform(40.0, 90.0)), 100000.0)
        elif kind == "huge":  # |Max diff| above 1e10 with a MaxRelativeErr of 2 %
            outs[0] = pair(1.02e12, 1e12)
        elif kind == "nan_max":
            ins[-1] = pair(NAN, base)
        elif kind == "requires_grad":
            ins[0] = pair(base, base, n_rg=True)
        elif kind == "edge_quiet":  # exactly 10 % and |Max diff| exactly 1: quiet, and no rule fires
            outs[0] = pair(11.0, 10.0)
        elif kind == "edge_noisy":  # just above 10 %: the yellow rule fires
            outs[0] = pair(11.000000000000002, 10.0)
        elif kind == "tiny_in_diff":  # |Max diff| just above 1 in, 10x+ out: not quiet, magnitude fires
            ins[0] = pair(1e6 + 1.5, 1e6)
            outs[0] = pair(1e6 + 20.0, 1e6)
        n_entry = {"input_args": [n for n, _b in ins], "output": [n for n, _b in outs]}
        b_entry = {"input_args": [b for _n, b in ins], "output": [b for _n, b in outs]}
        if kind == "unmatched":
            b_entry["input_args"] = b_entry["input_args"][:-1]  # the last input has no bench row
        npu[name] = n_entry
        bench[name] = b_entry
    bench["Torch.bench_extra.0.forward"] = {"input_args": [stats_leaf(1.0, 0.0, 0.5, 1.0)]}
    return npu, bench


def _noisy_pair(tmp_path: Path, seed: int) -> tuple[Path, Path]:
    npu, bench = _noisy_data(seed)
    return (_write(tmp_path / "npu" / "dump.json", npu, allow_nan=True),
            _write(tmp_path / "bench" / "dump.json", bench, allow_nan=True))  # fmt: skip


def _highlighted(npu_rows: SideRows, bench_rows: SideRows, index: list[int], *, ranged: bool
                 ) -> Table:  # fmt: skip
    table = build_statistics_rows(npu_rows, bench_rows, index, fuzzy=False, stack=None)
    ranges = table.highlight_ranges if ranged else None
    apply_highlights(table.rows, table.states, CompareMode.STATISTICS, HEADER, table.messages, ranges)
    return table


ALL_REASONS = [hl.RED_NAN_INF, hl.RED_HUGE_ERR, hl.RED_MAX_REL, hl.YELLOW_MAX_REL, hl.YELLOW_MAGNITUDE,
               hl.YELLOW_REQUIRES_GRAD]  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_highlight_ranges_change_no_highlight_and_no_message(tmp_path: Path, seed: int) -> None:
    _npu, _bench, npu_rows, bench_rows = _sides(*_noisy_pair(tmp_path, seed))
    index = pair_rows(npu_rows, bench_rows, fuzzy=False).bench_index
    ranged = _highlighted(npu_rows, bench_rows, index, ranged=True)
    full = _highlighted(npu_rows, bench_rows, index, ranged=False)
    assert [r.highlight for r in ranged.rows] == [r.highlight for r in full.rows]
    assert ranged.messages == full.messages
    assert [r.status for r in ranged.rows] == [r.status for r in full.rows]
    # The data trips every rule, and the ranges really leave rows out.
    said = {m for msgs in full.messages for m in msgs}
    assert set(ALL_REASONS) <= said
    assert {Highlight.RED, Highlight.YELLOW} <= {r.highlight for r in full.rows}
    assert ranged.highlight_ranges is not None
    covered = sum(stop - start for start, stop in ranged.highlight_ranges)
    assert 0 < covered < len(full.rows)


@pytest.mark.parametrize("seed", [3])
def test_highlight_ranges_are_whole_entries_in_order(tmp_path: Path, seed: int) -> None:
    _npu, _bench, npu_rows, bench_rows = _sides(*_noisy_pair(tmp_path, seed))
    index = pair_rows(npu_rows, bench_rows, fuzzy=False).bench_index
    ranges = build_statistics_rows(npu_rows, bench_rows, index, fuzzy=False, stack=None).highlight_ranges
    assert ranges
    apis = npu_rows.apis
    previous_stop = 0
    for start, stop in ranges:
        assert previous_stop <= start < stop <= len(apis)
        assert start == 0 or apis[start - 1] != apis[start]  # starts on an entry's first row
        assert stop == len(apis) or apis[stop - 1] != apis[stop]  # ends on its last
        assert len(set(apis[start:stop])) == 1
        previous_stop = stop


def test_the_ten_percent_edge_is_skipped_only_when_quiet(tmp_path: Path) -> None:
    def entry(out_max: float) -> dict[str, Any]:
        return {
            "input_args": [stats_leaf(2.0, 1.0, 1.5, 3.0)],
            "output": [stats_leaf(out_max, 1.0, 1.5, 3.0)],
        }

    npu = {"Torch.quiet.0.forward": entry(11.0), "Torch.noisy.0.forward": entry(11.000000000000002)}
    bench = {"Torch.quiet.0.forward": entry(10.0), "Torch.noisy.0.forward": entry(10.0)}
    npu_path = _write(tmp_path / "n" / "dump.json", npu, allow_nan=False)
    bench_path = _write(tmp_path / "b" / "dump.json", bench, allow_nan=False)
    npu_rows, bench_rows = _sides(npu_path, bench_path)[2:]
    index = pair_rows(npu_rows, bench_rows, fuzzy=False).bench_index
    ranged = _highlighted(npu_rows, bench_rows, index, ranged=True)
    full = _highlighted(npu_rows, bench_rows, index, ranged=False)
    assert ranged.highlight_ranges == [(2, 4)]
    assert [r.highlight for r in full.rows] == [None, None, None, Highlight.YELLOW]
    assert [r.highlight for r in ranged.rows] == [r.highlight for r in full.rows]
    assert ranged.messages == full.messages == [[], [], [], [hl.YELLOW_MAX_REL]]


@pytest.mark.parametrize("seed", [0, 5])
def test_engine_highlights_and_messages_equal_a_pass_over_every_row(tmp_path: Path, seed: int) -> None:
    npu_path, bench_path = _noisy_pair(tmp_path, seed)
    result = compare_dumps(npu_path, bench_path, CompareOptions())
    _npu, _bench, npu_rows, bench_rows = _sides(npu_path, bench_path)
    pairing = pair_rows(npu_rows, bench_rows, fuzzy=False)
    full = _highlighted(npu_rows, bench_rows, pairing.bench_index, ranged=False)
    n = len(npu_rows)
    assert len(result.rows) == n + len(pairing.bench_only) and pairing.bench_only
    assert [r.highlight for r in result.rows[:n]] == [r.highlight for r in full.rows]
    assert [r.cells[MSG_COL] for r in result.rows[:n]] == [
        v.join_messages(m, hl.REASONS) if m else "" for m in full.messages
    ]
    for row in result.rows[n:]:
        assert row.highlight is Highlight.YELLOW
        assert row.cells[MSG_COL] == v.MSG_NPU_UNMATCHED
    assert any(r.highlight is Highlight.RED for r in result.rows)
