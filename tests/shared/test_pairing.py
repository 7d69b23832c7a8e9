"""Pairing (compare.md §3): exact names, backward renumbering, fuzzy, bench-only rows, the dtype gate."""

from __future__ import annotations

from pathlib import Path

from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.pairing import (
    dtypes_compatible,
    fuzzy_entry_name,
    pair_exact,
    pair_fuzzy,
    renumber_backward,
)
from parity.shared.compare.result import RowStatus
from parity.shared.compare.rows import SideRows

from tests.factories import stats_leaf, write_raw_dump

T = stats_leaf(1.0, 0.0, 0.5, 1.0)


def _side(*apis: str, suffix: str = ".output.0") -> SideRows:
    rows = SideRows()
    for api in apis:
        rows.names.append(api + suffix)
        rows.apis.append(api)
    return rows


def test_exact_pairs_by_name_not_position() -> None:
    pairing = pair_exact(
        _side("Torch.a.0.forward", "Torch.b.0.forward"), _side("Torch.b.0.forward", "Torch.a.0.forward")
    )
    assert pairing.bench_index == [1, 0] and pairing.bench_only == []


def test_exact_unmatched_and_bench_only() -> None:
    pairing = pair_exact(
        _side("Torch.a.0.forward", "Torch.x.0.forward"), _side("Torch.a.0.forward", "Torch.y.0.forward")
    )
    assert pairing.bench_index == [0, -1] and pairing.bench_only == [1]


def test_backward_renumbering_by_occurrence_per_op() -> None:
    renamed = renumber_backward(
        [
            "Functional.linear.1.backward",
            "Functional.relu.4.backward",
            "Functional.linear.3.backward",
            "Module.fc.Linear.backward.2",
            "Functional.linear.2.forward",
        ]
    )
    assert renamed == {
        "Functional.linear.1.backward": "Functional.linear.0.backward",
        "Functional.relu.4.backward": "Functional.relu.0.backward",
        "Functional.linear.3.backward": "Functional.linear.1.backward",
        "Module.fc.Linear.backward.2": "Module.fc.Linear.backward.0",
    }


def test_recomputed_backward_still_pairs() -> None:
    npu = _side("Functional.linear.0.forward", "Functional.linear.1.forward", "Functional.linear.1.backward")
    bench = _side("Functional.linear.0.forward", "Functional.linear.0.backward")
    assert pair_exact(npu, bench).bench_index == [0, -1, 1]


def test_fuzzy_name_drops_the_counter_only() -> None:
    assert fuzzy_entry_name("Torch.add.3.forward") == "Torch.add.forward"
    assert fuzzy_entry_name("Module.feedforward.Linear.forward.2") == "Module.feedforward.Linear.forward"
    assert fuzzy_entry_name("Module.fc.Linear.parameters_grad.1") == "Module.fc.Linear.parameters_grad"


def test_fuzzy_pairs_shifted_call_counts_in_order() -> None:
    npu = _side("Torch.add.5.forward", "Torch.mul.0.forward", "Torch.add.6.forward")
    bench = _side("Torch.add.0.forward", "Torch.mul.0.forward", "Torch.add.1.forward")
    assert pair_fuzzy(npu, bench).bench_index == [0, 1, 2]


def test_fuzzy_skips_an_extra_npu_row_and_reports_bench_only() -> None:
    npu = _side("Torch.relu.0.forward", "Torch.add.0.forward", "Torch.mul.0.forward")
    bench = _side("Torch.add.0.forward", "Torch.mul.0.forward", "Torch.sub.0.forward")
    pairing = pair_fuzzy(npu, bench)
    assert pairing.bench_index == [-1, 0, 1] and pairing.bench_only == [2]


def test_fuzzy_greedy_hit_drops_older_npu_rows() -> None:
    # step 1 pairs npu b with bench b (newest vs newest); npu a, queued before it, is left unmatched
    npu = _side("Torch.a.0.forward", "Torch.b.0.forward")
    bench = _side("Torch.x.0.forward", "Torch.b.0.forward", "Torch.a.0.forward")
    assert pair_fuzzy(npu, bench).bench_index == [-1, 1]


def test_fuzzy_newest_npu_finds_an_older_bench_row() -> None:
    npu = _side("Torch.x.0.forward", "Torch.y.0.forward", "Torch.a.0.forward")
    bench = _side("Torch.a.0.forward", "Torch.p.0.forward", "Torch.q.0.forward")
    assert pair_fuzzy(npu, bench).bench_index == [-1, -1, 0]


def test_dtype_gate_float_family() -> None:
    assert dtypes_compatible("torch.float16", "torch.bfloat16")
    assert dtypes_compatible("torch.int64", "torch.int64")
    assert not dtypes_compatible("torch.int64", "torch.float32")


def _compare(tmp_path: Path, npu: dict, bench: dict, **options: bool):  # type: ignore[no-untyped-def]
    return compare_dumps(
        write_raw_dump(tmp_path / "npu", npu),
        write_raw_dump(tmp_path / "bench", bench),
        CompareOptions(**options),
    )


def test_int_vs_float_is_a_dtype_mismatch_not_unmatched(tmp_path: Path) -> None:
    result = _compare(
        tmp_path,
        {"Torch.f.0.forward": {"output": [stats_leaf(1.0, 0.0, 0.5, 1.0, dtype="torch.int64")]}},
        {"Torch.f.0.forward": {"output": [T]}},
    )
    (row,) = result.rows
    header = result.header
    assert row.status is RowStatus.FAIL
    assert row.cells[header.index("Bench Dtype")] == "torch.float32"
    assert "Dtype of NPU and bench do not match." in row.cells[header.index("Err_message")]


def test_bench_only_rows_follow_the_npu_rows(tmp_path: Path) -> None:
    result = _compare(
        tmp_path,
        {"Torch.a.0.forward": {"output": [T]}},
        {"Torch.z.0.forward": {"output": [T]}, "Torch.a.0.forward": {"output": [T]}},
    )
    assert [r.status for r in result.rows] == [RowStatus.PASS, RowStatus.BENCH_ONLY]
    bench_only = result.rows[1].cells
    header = result.header
    assert bench_only[header.index("NPU Name")] == "N/A"
    assert bench_only[header.index("Bench Name")] == "Torch.z.0.forward.output.0"
    assert bench_only[header.index("Result")] == "N/A"


def test_fuzzy_works_in_statistics_mode_and_says_so(tmp_path: Path) -> None:
    result = _compare(
        tmp_path,
        {"Torch.add.7.forward": {"output": [T]}},
        {"Torch.add.0.forward": {"output": [T]}},
        fuzzy_match=True,
    )
    (row,) = result.rows
    assert row.cells[1] == "Torch.add.0.forward.output.0"
    assert "Fuzzy matching data" in row.cells[result.header.index("Err_message")]


def test_fuzzy_works_in_md5_mode(tmp_path: Path) -> None:
    leaf = stats_leaf(1.0, 0.0, 0.5, 1.0, md5="00000001")
    result = _compare(
        tmp_path,
        {"Torch.add.7.forward": {"output": [leaf]}},
        {"Torch.add.0.forward": {"output": [leaf]}},
        fuzzy_match=True,
    )
    (row,) = result.rows
    assert row.cells[result.header.index("Result")] == "pass"
