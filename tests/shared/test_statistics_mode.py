"""Statistics mode (compare.md §5, msprobe v1 column) and the worked example of §12."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import CompareResult, RowStatus
from parity.shared.compare.statistics import stat_diff, statistics_cells

from tests.factories import DumpBuilder, stats_leaf, write_raw_dump

INF = math.inf
NAN = math.nan


@pytest.mark.parametrize(
    ("npu", "bench", "diff", "rel"),
    [
        (4.0, 4.1, 4.0 - 4.1, f"{abs((4.0 - 4.1) / 4.1 * 100)}%"),  # both numbers, bench != 0
        (1.0, 0.0, 1.0, "N/A"),  # bench 0, NPU not
        (2.0, 2.0, 0.0, "0.0%"),  # identical
        (0.0, 0.0, 0.0, "N/A"),  # identical, bench 0
        (NAN, NAN, "Nan", "Nan"),  # identical NaN
        (INF, INF, "Nan", "Nan"),  # identical inf: inf - inf is NaN
        (NAN, 1.0, "Nan", "Nan"),  # NaN on one side
        (1.0, NAN, "Nan", "Nan"),
        (INF, 2.0, "inf", "inf%"),  # NPU inf
        (2.0, INF, "-inf", "nan%"),  # bench inf
        (INF, -INF, "inf", "nan%"),  # +inf vs -inf: a difference, not "equal"
        (True, True, "N/A", "N/A"),  # bools are not numbers
        (True, False, "N/A", "N/A"),
        ("a", "b", "N/A", "N/A"),
        (None, 1.0, "N/A", "N/A"),
        (3, 2, 1, "50.0%"),  # Python ints (scalar arguments)
    ],
)
def test_stat_diff_cases(npu: Any, bench: Any, diff: Any, rel: str) -> None:
    got_diff, got_rel, _ = stat_diff(npu, bench)
    assert got_diff == diff and type(got_diff) is type(diff)
    assert got_rel == rel


@pytest.mark.parametrize(
    ("npu", "bench", "warn"),
    [(1.0, 3.0, True), (3.0, 1.0, True), (1.0, 1.9, False), (-1.0, -3.0, True), (NAN, 1.0, False)],
)
def test_v1_warning_rule_uses_the_signed_max(npu: float, bench: float, warn: bool) -> None:
    assert stat_diff(npu, bench)[2] is warn


def test_fast_path_matches_the_general_rule() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        a = tuple(float(x) for x in rng.normal(size=4))
        b = tuple(float(x) for x in rng.normal(size=4))
        cells, warn = statistics_cells(a, b)
        slow = [stat_diff(x, y) for x, y in zip(a, b, strict=True)]
        assert cells == [s[0] for s in slow] + [s[1] for s in slow]
        assert warn == any(s[2] for s in slow)


def _compare(tmp_path: Path, npu: dict[str, Any], bench: dict[str, Any]) -> CompareResult:
    return compare_dumps(
        write_raw_dump(tmp_path / "npu", npu), write_raw_dump(tmp_path / "bench", bench), CompareOptions()
    )


def _cell(result: CompareResult, row: int, column: str) -> Any:
    return result.rows[row].cells[result.header.index(column)]


def test_worked_example_to_the_printed_digits(tmp_path: Path) -> None:
    same = np.array([1.0, 2.0], dtype=np.float64)
    for side, out in (("npu", [1, 2, 3, 4, 0]), ("bench", [1.0008, 2, 2.99, 4.1, 0])):
        builder = DumpBuilder("statistics")
        builder.api("Torch.example.0.forward", inputs=[same], outputs=[np.array(out, dtype=np.float64)])
        builder.write(tmp_path / side)
    result = compare_dumps(tmp_path / "npu/dump.json", tmp_path / "bench/dump.json", CompareOptions())
    assert _cell(result, 1, "Max diff") == pytest.approx(-0.1)
    assert _cell(result, 1, "Min diff") == 0.0
    assert _cell(result, 1, "MaxRelativeErr") == "2.439024390243894%"
    assert _cell(result, 1, "MinRelativeErr") == "N/A"
    assert _cell(result, 1, "MeanRelativeErr") == "0.8998295477068198%"
    assert _cell(result, 1, "NormRelativeErr") == "1.2297715590884055%"
    assert _cell(result, 1, "Result") == ""
    assert [row.status for row in result.rows] == [RowStatus.PASS, RowStatus.PASS]
    assert result.advice.line is None
    assert result.advice.text == "All data in comparison result meets the accuracy requirements."


def test_warning_row_fails_with_its_message(tmp_path: Path) -> None:
    result = _compare(
        tmp_path,
        {"Torch.f.0.forward": {"output": [stats_leaf(1.0, 0.0, 0.5, 1.0)]}},
        {"Torch.f.0.forward": {"output": [stats_leaf(3.0, 0.0, 0.5, 1.0)]}},
    )
    assert _cell(result, 0, "Result") == "Warning"
    assert _cell(result, 0, "Err_message").startswith("Need double check api accuracy.")
    assert result.rows[0].status is RowStatus.FAIL


def test_unmatched_row(tmp_path: Path) -> None:
    result = _compare(tmp_path, {"Torch.f.0.forward": {"output": [stats_leaf(1.0, 0.0, 0.5, 1.0)]}}, {})
    assert _cell(result, 0, "Result") == "N/A"
    assert _cell(result, 0, "Max diff") == "N/A" and _cell(result, 0, "Bench max") == "N/A"
    assert _cell(result, 0, "Requires_grad Consistent") is False  # "False" against the bench's N/A
    assert _cell(result, 0, "Err_message") == (
        "No bench data matched.Requires_grad inconsistent. \nrequires_grad is inconsistent")  # msprobe's text
    assert result.rows[0].status is RowStatus.UNMATCHED


def test_nan_and_inf_cells_are_spelled_out(tmp_path: Path) -> None:
    result = _compare(
        tmp_path,
        {"Torch.f.0.forward": {"output": [stats_leaf(NAN, -INF, 0.5, INF)]}},
        {"Torch.f.0.forward": {"output": [stats_leaf(1.0, 0.0, 0.5, 1.0)]}},
    )
    assert [_cell(result, 0, c) for c in ("NPU max", "NPU min", "NPU l2norm")] == ["Nan", "-inf", "inf"]
    assert _cell(result, 0, "L2norm diff") == "inf"


def test_requires_grad_inconsistent_is_reported(tmp_path: Path) -> None:
    result = _compare(
        tmp_path,
        {"Torch.f.0.forward": {"output": [stats_leaf(1.0, 0.0, 0.5, 1.0, requires_grad=True)]}},
        {"Torch.f.0.forward": {"output": [stats_leaf(1.0, 0.0, 0.5, 1.0, requires_grad=False)]}},
    )
    assert _cell(result, 0, "Requires_grad Consistent") is False
    assert "Requires_grad inconsistent." in _cell(result, 0, "Err_message")
    assert result.rows[0].status is RowStatus.WARNING


def test_changed_scalar_argument_fails(tmp_path: Path) -> None:
    out = stats_leaf(1.0, 0.0, 0.5, 1.0)
    result = _compare(
        tmp_path,
        {"Torch.f.0.forward": {"input_kwargs": {"dim": {"type": "int", "value": 1}}, "output": [out]}},
        {"Torch.f.0.forward": {"input_kwargs": {"dim": {"type": "int", "value": 2}}, "output": [out]}},
    )
    assert result.rows[0].status is RowStatus.FAIL
    assert "The scalar parameters of NPU and Bench are inconsistent." in _cell(result, 0, "Err_message")


def test_every_message_appears_once(tmp_path: Path) -> None:
    npu = stats_leaf(1.0, 0.0, 0.5, 1.0, dtype="torch.int32", requires_grad=True)
    bench = stats_leaf(9.0, 0.0, 0.5, 1.0, requires_grad=False)
    result = _compare(
        tmp_path, {"Torch.f.0.forward": {"output": [npu]}}, {"Torch.f.0.forward": {"output": [bench]}}
    )
    message = _cell(result, 0, "Err_message")
    for fragment in (
        "Need double check api accuracy.",
        "Dtype of NPU and bench do not match.",
        "Requires_grad inconsistent.",
    ):
        assert message.count(fragment) == 1
