"""Verdicts (compare.md §7.1) and highlight rules (§7.2), with msprobe's bugs fixed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from parity.shared.compare import highlight as hl
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.headers import CompareMode, full_header
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import CompareRow, Highlight, RowStatus
from parity.shared.compare.verdicts import escalate, join_messages, tensor_accuracy

from tests.factories import stats_leaf, write_raw_dump


@pytest.mark.parametrize(
    ("cosine", "max_abs", "verdict"),
    [
        ("shape unmatched", "shape unmatched", "Unmatched"),
        ("None", 0.0, "None"),
        ("N/A", "N/A", "No"),
        ("Nan", 0.5, "No"),  # msprobe: "Yes" (Nan is float-convertible)
        (0.999, "Nan", "No"),
        ("unsupported", 0.5, "None"),  # 0-d tensor, small error
        ("unsupported", 2.0, "No"),  # 0-d tensor whose error alone exceeds the hard limit
        ("unsupported", "unsupported", "None"),
        (0.98, 0.002, "No"),  # cos < 0.99 and err > 0.001
        (0.98, 0.0005, "Yes"),
        (0.85, 0.0001, "No"),  # cos < 0.9
        (0.9999, 1.5, "No"),  # err > 1
        (0.99991, 0.1, "Yes"),  # the worked example
    ],
)
def test_tensor_accuracy(cosine: Any, max_abs: Any, verdict: str) -> None:
    assert tensor_accuracy(cosine, max_abs) == verdict


def test_unmatched_and_bench_only_never_change_status() -> None:
    assert escalate(RowStatus.UNMATCHED, RowStatus.PASS) is RowStatus.UNMATCHED
    assert escalate(RowStatus.BENCH_ONLY, RowStatus.FAIL) is RowStatus.BENCH_ONLY
    assert escalate(RowStatus.PASS, RowStatus.WARNING) is RowStatus.WARNING
    assert escalate(RowStatus.FAIL, RowStatus.WARNING) is RowStatus.FAIL


def test_join_messages_appends_as_msprobe_reasons_on_lines_of_their_own() -> None:
    # msprobe 8.3.3: the compare's fragments appended as spelled, each highlight reason after a newline
    assert join_messages(["No bench data matched.", "Requires_grad inconsistent. "]) == (
        "No bench data matched.Requires_grad inconsistent. ")
    reasons = frozenset({"r1", "r2"})
    assert join_messages(["b. ", "r1", "a.", "b. ", "", "r2", "r1"], reasons) == "b. a.\nr1\nr2"
    assert join_messages(["r1", "r2"], reasons) == "r1\nr2"  # no leading newline without a fragment
    assert join_messages(["Need double check api accuracy. "]) == "Need double check api accuracy. "


# ------------------------------------------------------------------------------------------------ highlight

TENSOR_HEADER = full_header(CompareMode.TENSOR, stack=False)
STATS_HEADER = full_header(CompareMode.STATISTICS, stack=False)
TENSOR_DEFAULTS = {
    "NPU max": 1.0,
    "NPU min": 0.0,
    "Bench max": 1.0,
    "MaxAbsErr": 0.0,
    "Cosine": 1.0,
    "One Thousandth Err Ratio": 1.0,
    "Requires_grad Consistent": True,
}
STATS_DEFAULTS = {
    "NPU max": 1.0,
    "NPU min": 0.0,
    "Bench max": 1.0,
    "Max diff": 0.0,
    "MaxRelativeErr": "0.0%",
    "Requires_grad Consistent": True,
}


def _highlight(
    mode: CompareMode, *specs: tuple[str, dict[str, Any]], status: RowStatus = RowStatus.PASS
) -> tuple[list[CompareRow], list[list[str]]]:
    header = TENSOR_HEADER if mode is CompareMode.TENSOR else STATS_HEADER
    defaults = TENSOR_DEFAULTS if mode is CompareMode.TENSOR else STATS_DEFAULTS
    rows, states = [], []
    for state, values in specs:
        cells: list[Any] = [None] * len(header)
        for column, value in {**defaults, **values}.items():
            cells[header.index(column)] = value
        rows.append(CompareRow(cells, "Torch.f.0.forward", status))
        states.append(state)
    messages: list[list[str]] = [[] for _ in rows]
    hl.apply_highlights(rows, states, mode, header, messages)
    return rows, messages


@pytest.mark.parametrize("value", ["Nan", "inf", "-inf", math.nan])
def test_red_nan_or_inf_in_npu_max_or_min(value: Any) -> None:
    rows, messages = _highlight(CompareMode.TENSOR, ("output", {"NPU min": value}))
    assert rows[0].highlight is Highlight.RED and messages[0] == [hl.RED_NAN_INF]


def test_red_huge_max_abs_err() -> None:
    rows, messages = _highlight(CompareMode.TENSOR, ("output", {"MaxAbsErr": 2e10}))
    assert rows[0].highlight is Highlight.RED and messages[0] == [hl.RED_HUGE_ERR]


def test_red_one_thousandth_collapse() -> None:
    rows, messages = _highlight(
        CompareMode.TENSOR,
        ("input", {"One Thousandth Err Ratio": 0.95}),
        ("output", {"One Thousandth Err Ratio": 0.5}),
    )
    assert (rows[0].highlight, rows[1].highlight) == (None, Highlight.RED)
    assert hl.RED_ONE_THOUSANDTH in messages[1]


def test_yellow_one_thousandth_drop() -> None:
    rows, messages = _highlight(
        CompareMode.TENSOR,
        ("input", {"One Thousandth Err Ratio": 1.0}),
        ("output", {"One Thousandth Err Ratio": 0.85}),
    )
    assert rows[1].highlight is Highlight.YELLOW and messages[1] == [hl.YELLOW_ONE_THOUSANDTH]


def test_worked_example_output_is_yellow_not_red() -> None:
    rows, _ = _highlight(
        CompareMode.TENSOR,
        ("input", {"One Thousandth Err Ratio": 1.0}),
        ("output", {"One Thousandth Err Ratio": 0.6, "Cosine": 0.99991, "MaxAbsErr": 0.1}),
    )
    assert rows[1].highlight is Highlight.YELLOW


def test_yellow_cosine_drop() -> None:
    rows, messages = _highlight(CompareMode.TENSOR, ("input", {}), ("output", {"Cosine": 0.85}))
    assert rows[1].highlight is Highlight.YELLOW and messages[1] == [hl.YELLOW_COSINE]


def test_yellow_order_of_magnitude() -> None:
    rows, messages = _highlight(
        CompareMode.TENSOR, ("input", {"MaxAbsErr": 2.0}), ("output", {"MaxAbsErr": 30.0})
    )
    assert rows[1].highlight is Highlight.YELLOW and messages[1] == [hl.YELLOW_MAGNITUDE]


def test_no_magnitude_rule_below_one() -> None:
    rows, _ = _highlight(CompareMode.TENSOR, ("input", {"MaxAbsErr": 0.5}), ("output", {"MaxAbsErr": 0.9}))
    assert rows[1].highlight is None


def test_yellow_requires_grad_inconsistent() -> None:
    rows, messages = _highlight(CompareMode.TENSOR, ("output", {"Requires_grad Consistent": False}))
    assert rows[0].highlight is Highlight.YELLOW and messages[0] == [hl.YELLOW_REQUIRES_GRAD]


def test_unmatched_rows_are_yellow_only_with_a_requires_grad_reason() -> None:
    # msprobe compares the NPU's requires_grad with the bench's N/A: yellow, with the reason, when they differ
    rows, messages = _highlight(
        CompareMode.TENSOR, ("output", {"Requires_grad Consistent": False}), status=RowStatus.UNMATCHED
    )
    assert rows[0].highlight is Highlight.YELLOW and messages[0] == [hl.YELLOW_REQUIRES_GRAD]
    rows, messages = _highlight(
        CompareMode.TENSOR, ("output", {"Requires_grad Consistent": True}), status=RowStatus.UNMATCHED
    )
    assert rows[0].highlight is None and messages[0] == []


def test_md5_mode_is_never_highlighted() -> None:
    rows, messages = _highlight(CompareMode.MD5, ("output", {"Requires_grad Consistent": False}))
    assert rows[0].highlight is None and messages[0] == []


def test_red_wins_over_yellow_and_reasons_appear_once() -> None:
    rows, messages = _highlight(
        CompareMode.TENSOR,
        ("input", {"One Thousandth Err Ratio": 0.95}),
        ("input", {"One Thousandth Err Ratio": 0.95}),
        ("output", {"One Thousandth Err Ratio": 0.5, "Cosine": 0.5}),
    )
    assert rows[2].highlight is Highlight.RED
    assert messages[2].count(hl.RED_ONE_THOUSANDTH) == 1 and messages[2].count(hl.YELLOW_COSINE) == 1


def test_output_rule_skipped_when_bench_max_is_not_numeric() -> None:
    rows, _ = _highlight(CompareMode.TENSOR, ("input", {}), ("output", {"Cosine": 0.5, "Bench max": "N/A"}))
    assert rows[1].highlight is None


def test_statistics_red_max_relative_error() -> None:
    rows, messages = _highlight(
        CompareMode.STATISTICS, ("input", {}), ("output", {"MaxRelativeErr": "60.0%"})
    )
    assert rows[1].highlight is Highlight.RED and messages[1] == [hl.RED_MAX_REL]


def test_statistics_yellow_relative_error_appears_in_output() -> None:
    rows, messages = _highlight(
        CompareMode.STATISTICS, ("input", {"MaxRelativeErr": "0.5%"}), ("output", {"MaxRelativeErr": "20.0%"})
    )
    assert rows[1].highlight is Highlight.YELLOW and messages[1] == [hl.YELLOW_MAX_REL]


def test_statistics_no_yellow_when_input_already_off() -> None:
    rows, _ = _highlight(
        CompareMode.STATISTICS, ("input", {"MaxRelativeErr": "5.0%"}), ("output", {"MaxRelativeErr": "20.0%"})
    )
    assert rows[1].highlight is None


def _engine_row(tmp_path: Path, npu: dict[str, Any], bench: dict[str, Any]) -> CompareRow:
    result = compare_dumps(
        write_raw_dump(tmp_path / "npu", {"T.f.0.forward": {"output": [npu]}}),
        write_raw_dump(tmp_path / "bench", {"T.f.0.forward": {"output": [bench]}}),
        CompareOptions(),
    )
    return result.rows[0]


def test_plus_inf_vs_minus_inf_is_red(tmp_path: Path) -> None:
    row = _engine_row(tmp_path, stats_leaf(1.0, math.inf, 0.5, 1.0), stats_leaf(1.0, -math.inf, 0.5, 1.0))
    assert row.highlight is Highlight.RED and row.status is RowStatus.FAIL


def test_bench_inf_against_finite_npu_is_red(tmp_path: Path) -> None:
    row = _engine_row(tmp_path, stats_leaf(1.0, 0.0, 0.5, 1.0), stats_leaf(math.inf, 0.0, 0.5, 1.0))
    assert row.highlight is Highlight.RED


def test_nan_in_npu_statistics_is_red_and_fails(tmp_path: Path) -> None:
    row = _engine_row(tmp_path, stats_leaf(math.nan, 0.0, 0.5, 1.0), stats_leaf(1.0, 0.0, 0.5, 1.0))
    assert row.highlight is Highlight.RED and row.status is RowStatus.FAIL
