"""A rank compared as K slices of its calls gives the rows, the xlsx and the summary of the whole compare."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from openpyxl import load_workbook
from parity.shared.compare.job import RankPair, compare_rank, compare_slice, finish_rank, slice_tensor_files
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.slices import CallSlice, decode_part, encode_part
from parity.shared.errors import CompareInputError

from tests.factories import DumpBuilder

pytest.importorskip("parity.shared.metrics.parallel")  # tensor mode needs the metric workers

OPTIONS = CompareOptions()


def _pair(root: Path, task: str) -> RankPair:
    """Eight calls (forwards and their backwards) with a drift that grows from the fourth on, an NPU-only
    call in the middle and a bench-only one at the end: every rule that could cross a slice's edge."""
    rng = np.random.default_rng(7)
    sides: dict[str, np.ndarray] = {}
    for side in ("npu", "bench"):
        builder = DumpBuilder(task)
        x = rng.standard_normal(32).astype(np.float32) if side == "npu" else sides["x"]
        sides.setdefault("x", x)
        for i in range(4):
            noise = 0.0 if side == "npu" or i < 2 else 0.05 * (i - 1)
            y = np.tanh(x) + noise
            builder.api(f"Torch.tanh.{i}.forward", inputs=[x], outputs=[y])
            if side == "npu" and i == 1:
                builder.api("Torch.npu_only.0.forward", inputs=[y], outputs=[y * 2])
            x = y
        for i in reversed(range(4)):
            g = np.full(32, 0.5 + i, dtype=np.float32) * (1.0 if side == "npu" else 1.0 + 0.01 * i)
            builder.api(f"Torch.tanh.{i}.backward", inputs=[g], outputs=[g * 0.9])
        if side == "bench":
            builder.api("Torch.bench_only.0.forward", inputs=[x], outputs=[x])
        builder.write(root / side)
    return RankPair(0, root / "npu" / "dump.json", root / "bench" / "dump.json")


def _xlsx_values(path: Path) -> list[list[Any]]:
    book = load_workbook(path)
    return [[[c.value, c.fill.fgColor.rgb] for c in row] for sheet in book for row in sheet.iter_rows()]


def _sliced(pair: RankPair, slices: int, out: Path) -> Any:
    # Each part goes through its stored form, as it does between a slice's task and the rank's merge.
    parts = [decode_part(encode_part(compare_slice(pair, OPTIONS, CallSlice(k, slices))))
             for k in range(slices)]  # fmt: skip
    xlsx, advisor = out / f"sliced{slices}.xlsx", out / f"advisor{slices}.txt"
    return finish_rank(pair, parts, xlsx_path=xlsx, advisor_path=advisor)


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_the_same_rows_xlsx_and_summary_whatever_the_slicing(tmp_path: Path, task: str) -> None:
    pair = _pair(tmp_path, task)
    whole = compare_rank(pair, OPTIONS, xlsx_path=tmp_path / "whole.xlsx", advisor_path=tmp_path / "a.txt")
    assert any(r.status.value == "fail" for r in whole.result.rows)  # the slices have something to agree on
    for slices in (2, 3, 5, 9, 14):  # 9 calls on the NPU side: 14 slices leave some empty
        sliced = _sliced(pair, slices, tmp_path)
        assert [(r.cells, r.status, r.highlight, r.api) for r in sliced.result.rows] == [
            (r.cells, r.status, r.highlight, r.api) for r in whole.result.rows
        ], slices
        assert sliced.result.row_scores == whole.result.row_scores
        assert sliced.result.suspects == whole.result.suspects
        assert _xlsx_values(sliced.xlsx) == _xlsx_values(whole.xlsx)
        assert sliced.advisor is not None and whole.advisor is not None
        assert sliced.advisor.read_text() == whole.advisor.read_text()
        doc = {**sliced.summary, "files": whole.summary["files"]}
        assert doc == whole.summary


def test_slice_bounds_cover_every_call_once_and_never_split_one() -> None:
    apis = ["a", "a", "b", "c", "c", "c", "d"]
    rows = [CallSlice(k, 3).rows(apis) for k in range(3)]
    assert [r[:2] for r in rows] == [(0, 2), (2, 3), (3, 7)]  # calls [0,1) [1,2) [2,4) of 4
    assert [r[2] for r in rows] == [(0, 1, 4), (1, 2, 4), (2, 4, 4)]
    with pytest.raises(CompareInputError, match="slice 3 of 3"):
        CallSlice(3, 3)


def test_a_slice_reads_only_its_own_tensor_files(tmp_path: Path) -> None:
    pair = _pair(tmp_path / "full", "tensor")
    whole = compare_slice(pair, OPTIONS, None)
    seen: list[str] = []
    for k in range(3):
        npu_files, bench_files = slice_tensor_files(pair, OPTIONS, CallSlice(k, 3))
        assert npu_files and bench_files
        seen += npu_files
        # A copy of the rank holding only this slice's tensor files compares as the full folder does.
        only = tmp_path / f"slice{k}"
        for side, files in (("npu", npu_files), ("bench", bench_files)):
            (only / side / "dump_tensor_data").mkdir(parents=True)
            shutil.copy(tmp_path / "full" / side / "dump.json", only / side / "dump.json")
            for name in files:
                shutil.copy(tmp_path / "full" / side / "dump_tensor_data" / name,
                            only / side / "dump_tensor_data" / name)  # fmt: skip
        part = compare_slice(RankPair(0, only / "npu" / "dump.json", only / "bench" / "dump.json"), OPTIONS,
                             CallSlice(k, 3))  # fmt: skip
        assert part.missing_tensor_files == []
        first, stop, _ = part.calls
        full_part = compare_slice(pair, OPTIONS, CallSlice(k, 3))
        assert [r.cells[:-3] for r in part.rows] == [r.cells[:-3] for r in full_part.rows]
        assert first < stop
    assert sorted(seen) == sorted(set(seen))  # no file read by two slices
    # every paired row's file (the target-only call is a gap: its input pairs, by provenance, with the bench
    # output it reads)
    assert len(seen) == sum(1 for r in whole.rows if r.cells[0] != "N/A" and r.cells[1] != "N/A")


def test_a_damaged_part_is_named() -> None:
    with pytest.raises(CompareInputError, match="rank3/slice1: not a slice's rows"):
        decode_part(b"\x00garbage", source="rank3/slice1")
