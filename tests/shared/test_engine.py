"""The engine end to end: tensor mode, the stack column, Parity's columns, multi-rank, progress."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.headers import CompareMode
from parity.shared.compare.job import compare_rank, plan_ranks
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import CompareResult, Highlight, RowStatus
from parity.shared.errors import CompareInputError, DumpError

from tests.factories import DumpBuilder, stats_leaf, write_raw_dump

pytest.importorskip("parity.shared.metrics.parallel")  # tensor mode needs the metric workers

N = np.array([1, 2, 3, 4, 0], dtype=np.float64)
B = np.array([1.0008, 2, 2.99, 4.1, 0], dtype=np.float64)
X = np.array([1.0, 2.0], dtype=np.float64)


def _tensor_pair(
    tmp_path: Path,
    npu_apis: list[tuple[str, list[Any], list[Any]]],
    bench_apis: list[tuple[str, list[Any], list[Any]]],
) -> tuple[Path, Path]:
    paths = []
    for side, apis in (("npu", npu_apis), ("bench", bench_apis)):
        builder = DumpBuilder("tensor")
        for name, inputs, outputs in apis:
            builder.api(name, inputs=inputs, outputs=outputs)
        paths.append(builder.write(tmp_path / side))
    return paths[0], paths[1]


def _cell(result: CompareResult, row: int, column: str) -> Any:
    return result.rows[row].cells[result.header.index(column)]


def test_tensor_mode_worked_example(tmp_path: Path) -> None:
    npu, bench = _tensor_pair(
        tmp_path, [("Torch.example.0.forward", [X], [N])], [("Torch.example.0.forward", [X], [B])]
    )
    result = compare_dumps(npu, bench, CompareOptions())
    assert result.mode is CompareMode.TENSOR
    assert _cell(result, 1, "Cosine") == 0.99991
    assert _cell(result, 1, "EucDist") == pytest.approx(0.10050194027977731, rel=1e-12)
    assert _cell(result, 1, "MaxAbsErr") == 0.1
    assert _cell(result, 1, "MaxRelativeErr") == 0.024390243902
    assert (_cell(result, 1, "One Thousandth Err Ratio"), _cell(result, 1, "Five Thousandths Err Ratio")) == (
        0.6,
        0.8,
    )
    assert _cell(result, 1, "Accuracy Reached or Not") == "Yes"
    assert result.rows[1].highlight is Highlight.YELLOW  # 1.0 - 0.6 > 0.1, and 0.6 is not < 0.6
    assert result.rows[1].status is RowStatus.WARNING
    assert _cell(result, 1, "Data_name") == repr(["Torch.example.0.forward.output.0.pt"] * 2)
    # msprobe's verdict passes the row, but the call's inputs are identical and its output is not: the
    # localization names it, and the three advisor lines follow the same judgement (issue 10).
    assert result.advice.line == 1 and result.suspects[0].api == "Torch.example.0.forward"


def test_tensor_mode_failing_output_is_the_advice_and_the_suspect(tmp_path: Path) -> None:
    npu, bench = _tensor_pair(
        tmp_path,
        [("Torch.f.0.forward", [X], [np.array([1.0, -5.0])])],
        [("Torch.f.0.forward", [X], [np.array([1.0, 5.0])])],
    )
    result = compare_dumps(npu, bench, CompareOptions())
    assert _cell(result, 1, "Accuracy Reached or Not") == "No"
    assert result.rows[1].status is RowStatus.FAIL
    assert (result.advice.line, result.advice.suspect_node) == (1, "Torch.f.0.forward.output.0")
    assert [s.api for s in result.suspects] == ["Torch.f.0.forward"]


def test_tensor_mode_unmatched_row(tmp_path: Path) -> None:
    npu, bench = _tensor_pair(
        tmp_path,
        [("Torch.f.0.forward", [], [X]), ("Torch.g.0.forward", [], [X])],
        [("Torch.f.0.forward", [], [X])],
    )
    result = compare_dumps(npu, bench, CompareOptions())
    assert _cell(result, 1, "Cosine") == "unsupported"
    assert _cell(result, 1, "Accuracy Reached or Not") == "None"  # msprobe 8.3.3's cell
    assert _cell(result, 1, "Err_message") == (
        "Requires_grad inconsistent. Bench api/module unmatched.\nrequires_grad is inconsistent")
    assert _cell(result, 1, "Data_name") == repr(["Torch.g.0.forward.output.0.pt", "N/A"])
    assert result.rows[1].status is RowStatus.UNMATCHED


def test_tensor_mode_int_vs_float_is_a_dtype_mismatch(tmp_path: Path) -> None:
    npu, bench = _tensor_pair(
        tmp_path,
        [("Torch.f.0.forward", [], [np.array([1, 2], dtype=np.int64)])],
        [("Torch.f.0.forward", [], [X])],
    )
    result = compare_dumps(npu, bench, CompareOptions())
    assert _cell(result, 0, "Accuracy Reached or Not") == "No"
    assert _cell(result, 0, "Err_message") == "Dtype of NPU and bench do not match. "
    assert result.rows[0].status is RowStatus.FAIL


def test_tensor_mode_shape_mismatch_is_uncomparable(tmp_path: Path) -> None:
    npu, bench = _tensor_pair(
        tmp_path, [("Torch.f.0.forward", [], [np.ones(3)])], [("Torch.f.0.forward", [], [np.ones(4)])]
    )
    result = compare_dumps(npu, bench, CompareOptions())
    assert _cell(result, 0, "Cosine") == "shape unmatched"
    assert _cell(result, 0, "Accuracy Reached or Not") == "Unmatched"
    assert result.rows[0].status is RowStatus.UNCOMPARABLE


def test_tensor_mode_scalar_argument_has_no_data_file(tmp_path: Path) -> None:
    npu, bench = _tensor_pair(tmp_path, [("Torch.f.0.forward", [2], [X])], [("Torch.f.0.forward", [2], [X])])
    result = compare_dumps(npu, bench, CompareOptions())
    assert _cell(result, 0, "Data_name") == repr(["-1", "-1"])
    assert "NPU does not have data file." in _cell(result, 0, "Err_message")
    assert result.rows[0].status is RowStatus.UNCOMPARABLE


def test_tensor_progress_counts_pairs(tmp_path: Path) -> None:
    npu, bench = _tensor_pair(tmp_path, [("Torch.f.0.forward", [X], [X])], [("Torch.f.0.forward", [X], [X])])
    seen: list[tuple[int, int]] = []
    compare_dumps(
        npu, bench, CompareOptions(), progress=lambda done, total: seen.append((done, total))
    )
    # (0, 0) between the phases reports nothing: only a point where the caller may stop the compare
    assert [s for s in seen if s != (0, 0)] == [(1, 2), (2, 2)] and (0, 0) in seen


def test_parity_columns_close_every_row(tmp_path: Path) -> None:
    result = compare_dumps(
        write_raw_dump(tmp_path / "n", {"T.f.0.forward": {"output": [stats_leaf(1.0, 0, 1, 1)]}}),
        write_raw_dump(tmp_path / "b", {}),
        CompareOptions(),
    )
    assert result.header[-4:] == ["Parity Status", "Parity API", "Parity Pairing", "Parity Gap"]
    # a call without a partner is a gap (its own, no bench call)
    gap = "target T.f.0.forward ~ bench (no call)"
    assert result.rows[0].cells[-4:] == ["unmatched", "T.f.0.forward", "gap", gap]
    assert all(len(row.cells) == len(result.header) for row in result.rows)


# -------------------------------------------------------------------------------------------- stack column

STACK = {"0": [["T.f.0.forward"], ["File /w/m.py, line 3, in forward, \n y = f(x)"]]}


def _stats_pair(tmp_path: Path) -> tuple[Path, Path]:
    data = {
        "T.f.0.forward": {"input_args": [stats_leaf(1.0, 0, 1, 1)], "output": [stats_leaf(1.0, 0, 1, 1)]},
        "T.g.0.forward": {"output": [stats_leaf(1.0, 0, 1, 1)]},
    }
    return write_raw_dump(tmp_path / "npu", data), write_raw_dump(tmp_path / "bench", data)


def test_stack_json_next_to_npu_dump_turns_the_column_on(tmp_path: Path) -> None:
    npu, bench = _stats_pair(tmp_path)
    (npu.parent / "stack.json").write_text(json.dumps(STACK))
    result = compare_dumps(npu, bench, CompareOptions(stack_mode=False))
    assert result.stack_mode and "NPU_Stack_Info" in result.header
    column = [row.cells[result.header.index("NPU_Stack_Info")] for row in result.rows]
    assert column == [repr(STACK["0"][1]), "N/A", "N/A"]  # first row of each API; g has no stack


def test_no_stack_json_no_column(tmp_path: Path) -> None:
    result = compare_dumps(*_stats_pair(tmp_path), CompareOptions(stack_mode=True))
    assert not result.stack_mode and "NPU_Stack_Info" not in result.header


def test_explicit_stack_path_follows_the_flag(tmp_path: Path) -> None:
    npu, bench = _stats_pair(tmp_path)
    stack = tmp_path / "elsewhere.json"
    stack.write_text(json.dumps(STACK))
    assert not compare_dumps(npu, bench, CompareOptions(), stack_path=stack).stack_mode
    assert compare_dumps(npu, bench, CompareOptions(stack_mode=True), stack_path=stack).stack_mode


def test_explicit_stack_path_missing(tmp_path: Path) -> None:
    with pytest.raises(DumpError, match="stack.json not found"):
        compare_dumps(*_stats_pair(tmp_path), CompareOptions(), stack_path=tmp_path / "nope.json")


# ------------------------------------------------------------------------------------------------ multi-rank


def _step(root: Path, ranks: dict[str, float]) -> Path:
    for rank, value in ranks.items():
        write_raw_dump(root / rank, {"T.f.0.forward": {"output": [stats_leaf(value, 0.0, 0.5, 1.0)]}})
    return root


def test_ranks_pair_by_number_not_position(tmp_path: Path) -> None:
    npu = _step(tmp_path / "npu", {"rank0": 1.0, "rank2": 5.0})
    bench = _step(tmp_path / "bench", {"rank1": 1.0, "rank2": 5.0})
    plan = plan_ranks(npu, bench)
    assert [p.rank for p in plan.pairs] == [2]
    assert plan.npu_only_ranks == [0] and plan.bench_only_ranks == [1]
    report = compare_rank(plan.pairs[0], CompareOptions(), xlsx_path=tmp_path / "r.xlsx", advisor_path=None)
    assert report.result.rank == 2 and report.result.rows[0].status is RowStatus.PASS
    assert report.summary["rank"] == 2 and report.summary["files"] == {"xlsx": "r.xlsx", "advisor": None}


def test_rank_without_dump_json_is_skipped(tmp_path: Path) -> None:
    npu = _step(tmp_path / "npu", {"rank0": 1.0, "rank1": 1.0})
    bench = _step(tmp_path / "bench", {"rank0": 1.0})
    (bench / "rank1").mkdir()
    plan = plan_ranks(npu, bench)
    assert [p.rank for p in plan.pairs] == [0] and plan.skipped_ranks == [1]


def test_step_dir_without_ranks(tmp_path: Path) -> None:
    (tmp_path / "npu").mkdir()
    with pytest.raises(CompareInputError, match="no rank"):
        plan_ranks(tmp_path / "npu", tmp_path / "npu")


def test_fuzzy_match_in_tensor_mode(tmp_path: Path) -> None:
    npu, bench = _tensor_pair(
        tmp_path, [("Torch.add.4.forward", [X], [X])], [("Torch.add.0.forward", [X], [X])]
    )
    result = compare_dumps(npu, bench, CompareOptions(fuzzy_match=True))
    assert _cell(result, 1, "Bench Name") == "Torch.add.0.forward.output.0"
    assert _cell(result, 1, "Cosine") == 1.0 and _cell(result, 1, "Accuracy Reached or Not") == "Yes"
    assert "Fuzzy matching data, the comparison accuracy may be affected." in _cell(result, 1, "Err_message")


def test_the_engine_leaves_the_garbage_collector_alone(tmp_path: Path) -> None:
    """The collector is the entry point's business (parity.process_policy), never the library's."""
    import gc

    assert gc.isenabled()
    compare_dumps(*_stats_pair(tmp_path), CompareOptions())
    assert gc.isenabled()
    gc.disable()
    try:
        compare_dumps(*_stats_pair(tmp_path / "again"), CompareOptions())
        assert not gc.isenabled()
    finally:
        gc.enable()
