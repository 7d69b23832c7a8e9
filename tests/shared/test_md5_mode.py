"""md5 mode (compare.md §6) and mode detection (§1.4)."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pytest
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.headers import CompareMode
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import CompareResult, RowStatus
from parity.shared.errors import CompareInputError

from tests.factories import stats_leaf, write_raw_dump


def _md5(value: str, **kw: Any) -> dict[str, Any]:
    return stats_leaf(1.0, 0.0, 0.5, 1.0, md5=value, **kw)


def _compare(tmp_path: Path, npu: dict[str, Any], bench: dict[str, Any], **kw: Any) -> CompareResult:
    return compare_dumps(
        write_raw_dump(tmp_path / "npu", npu, **kw),
        write_raw_dump(tmp_path / "bench", bench),
        CompareOptions(),
    )


def _cell(result: CompareResult, row: int, column: str) -> Any:
    return result.rows[row].cells[result.header.index(column)]


def test_md5_header_has_no_err_message(tmp_path: Path) -> None:
    result = _compare(
        tmp_path, {"T.f.0.forward": {"output": [_md5("aa")]}}, {"T.f.0.forward": {"output": [_md5("aa")]}}
    )
    assert result.mode is CompareMode.MD5
    assert "Err_message" not in result.header and result.header[-4:-2] == ["Parity Status", "Parity API"]


def test_equal_checksums_pass(tmp_path: Path) -> None:
    result = _compare(
        tmp_path, {"T.f.0.forward": {"output": [_md5("aa")]}}, {"T.f.0.forward": {"output": [_md5("aa")]}}
    )
    assert _cell(result, 0, "Result") == "pass" and result.rows[0].status is RowStatus.PASS


def test_different_checksums(tmp_path: Path) -> None:
    result = _compare(
        tmp_path, {"T.f.0.forward": {"output": [_md5("aa")]}}, {"T.f.0.forward": {"output": [_md5("bb")]}}
    )
    assert (_cell(result, 0, "NPU MD5"), _cell(result, 0, "BENCH MD5")) == ("aa", "bb")
    assert _cell(result, 0, "Result") == "Different" and result.rows[0].status is RowStatus.FAIL
    assert result.advice.line == 0


def test_unmatched_is_na(tmp_path: Path) -> None:
    result = _compare(
        tmp_path,
        {"T.f.0.forward": {"output": [_md5("aa")]}, "T.g.0.forward": {"output": [_md5("cc")]}},
        {"T.f.0.forward": {"output": [_md5("aa")]}},
    )
    assert _cell(result, 1, "Result") == "N/A" and _cell(result, 1, "BENCH MD5") == "N/A"
    assert result.rows[1].status is RowStatus.UNMATCHED


def test_shape_is_not_checked(tmp_path: Path) -> None:
    result = _compare(
        tmp_path,
        {"T.f.0.forward": {"output": [_md5("aa", shape=(1, 4))]}},
        {"T.f.0.forward": {"output": [_md5("aa", shape=(4,))]}},
    )
    assert _cell(result, 0, "Result") == "pass"


def test_scalar_checksum_is_crc_of_its_str(tmp_path: Path) -> None:
    entry = {"input_args": [{"type": "int", "value": 7}], "output": [_md5("aa")]}
    result = _compare(tmp_path, {"T.f.0.forward": entry}, {"T.f.0.forward": entry})
    assert _cell(result, 0, "NPU MD5") == f"{zlib.crc32(b'7'):08x}"


def test_md5_on_one_side_only_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CompareInputError, match="md5"):
        _compare(
            tmp_path,
            {"T.f.0.forward": {"output": [_md5("aa")]}},
            {"T.f.0.forward": {"output": [stats_leaf(1.0, 0.0, 0.5, 1.0)]}},
        )


def test_tasks_must_match(tmp_path: Path) -> None:
    with pytest.raises(CompareInputError, match="different tasks"):
        _compare(tmp_path, {}, {}, task="structure")


def test_a_tensor_dump_against_a_statistics_dump_is_compared_in_statistics_mode(tmp_path: Path) -> None:
    """A tensor dump records each tensor's statistics: asked to, the engine compares them with a statistics
    dump's."""
    import numpy as np

    from tests.factories import DumpBuilder

    x = np.linspace(-1, 1, 8, dtype=np.float32)
    tensor = DumpBuilder("tensor").api("Torch.relu.0.forward", inputs=[x], outputs=[np.maximum(x, 0) * 1.6])
    stats = DumpBuilder("statistics").api("Torch.relu.0.forward", inputs=[x], outputs=[np.maximum(x, 0)])
    npu, bench = tensor.write(tmp_path / "npu"), stats.write(tmp_path / "bench")
    with pytest.raises(CompareInputError, match="different tasks"):  # msprobe's rule, kept by parity compare
        compare_dumps(npu, bench, CompareOptions())
    result = compare_dumps(npu, bench, CompareOptions(mixed_tasks=True))  # the server's comparisons
    assert result.mode.value == "statistics"
    assert result.failing_apis() == ["Torch.relu.0.forward"]  # its Max is 60% off: the statistics say so


def test_unknown_task_is_refused(tmp_path: Path) -> None:
    npu = write_raw_dump(tmp_path / "npu", {}, task="structure")
    bench = write_raw_dump(tmp_path / "bench", {}, task="structure")
    with pytest.raises(CompareInputError, match="cannot be compared"):
        compare_dumps(npu, bench, CompareOptions())
