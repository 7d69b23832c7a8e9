"""``parity overflow-check`` and ``parity merge-result`` on bad input: one line naming the file or field, exit
2, nothing written; and a merged workbook never holds a formula (msprobe aborts on such cells)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from parity.shared.compare.headers import CompareMode
from parity.shared.report.msprobe26 import header_26
from parity.shared.report.xlsx import write_sheets_xlsx

from parity.cli import main
from tests.interop.multirank_dumps import scenarios


def fails(args: list[str], capsys: pytest.CaptureFixture[str], *words: str) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def test_overflow_check_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    fails(["overflow-check", "-i", str(tmp_path / "nope"), "-o", str(out)], capsys, "nope", "not a directory")
    fails(["overflow_check", "-i", str(tmp_path / "nope")], capsys, "nope")  # msprobe's spelling
    step = scenarios(tmp_path / "dumps")["at"]
    (step / "rank1" / "stack.json").unlink()
    fails(["overflow-check", "-i", str(step), "-o", str(out)], capsys, "rank1/stack.json", "not found")
    step = scenarios(tmp_path / "dumps2")["at"]
    (step / "rank1" / "dump.json").write_text('{"framework": "pytorch", "data": {')
    fails(["overflow-check", "-i", str(step), "-o", str(out)], capsys, "rank1/dump.json", "malformed JSON",
          "line 1")  # fmt: skip
    step = scenarios(tmp_path / "dumps3")["at"]
    dump = step / "rank0" / "dump.json"
    doc = json.loads(dump.read_text())
    dump.write_text(json.dumps({**doc, "framework": "mindspore"}))
    fails(["overflow-check", "-i", str(step), "-o", str(out)], capsys, "rank0/dump.json", "'mindspore'")
    doc["data"]["Distributed.all_reduce.0.forward"]["input_kwargs"]["group"]["group_ranks"] = "0,1"
    dump.write_text(json.dumps(doc))
    fails(["overflow-check", "-i", str(step), "-o", str(out)], capsys, "Distributed.all_reduce.0.forward",
          "group_ranks")  # fmt: skip
    assert not out.exists()


def result_book(path: Path, rows: list[list[object]]) -> Path:
    """A statistics-mode compare result in msprobe 26's columns, ``rows`` given by their first cells."""
    header = header_26(CompareMode.STATISTICS, stack=False)
    full = [[*row, *[""] * (len(header) - len(row))] for row in rows]
    write_sheets_xlsx([("Sheet1", header, full)], path)  # type: ignore[list-item]
    return path


def test_merge_result_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results, out = tmp_path / "results", tmp_path / "out"
    row = ["Torch.add.0.forward.output.0", "Torch.add.0.forward.output.0", *["x"] * 6, 0.5]
    result_book(results / "compare_result_rank0_20260101000000.xlsx", [row])
    config = tmp_path / "merge.yaml"
    config.write_text("api: [Torch.add]\n")
    args = ["merge-result", "-i", str(results), "-o", str(out), "-config", str(config)]
    fails(args, capsys, str(results), "1 multi-rank compare results", "at least 2")
    result_book(results / "compare_result_rank1_20260101000000.xlsx", [row])
    config.write_text("compare_index: [Max diff]\n")
    fails(args, capsys, "merge.yaml", "field 'api'")
    config.write_text("api: Torch.add\n")
    fails(args, capsys, "merge.yaml", "field 'api' must be a list")
    config.write_text("api: [Torch.add]\ncompare_index: [Cosine]\n")
    fails(args, capsys, "merge.yaml", "'Cosine'", "statistics mode")
    config.write_text("api: [Torch.add\n")
    fails(args, capsys, "merge.yaml", "not valid YAML")
    config.write_text("api: [Torch.add]\n")
    (results / "compare_result_rank2_20260101000000.xlsx").write_bytes(b"not a zip")
    fails(args, capsys, "compare_result_rank2_20260101000000.xlsx", "not a readable xlsx")
    (results / "compare_result_rank2_20260101000000.xlsx").rename(results / "notes.xlsx")
    fails(args, capsys, "notes.xlsx", "not a compare result name")
    assert not out.exists()


def test_merge_result_writes_no_formula(tmp_path: Path) -> None:
    import openpyxl

    results = tmp_path / "results"
    evil = "=HYPERLINK(\"http://x\").Torch.add.0.forward.output.0"
    for rank in (0, 1):
        rows = [[evil, evil, *["x"] * 6, "@SUM(A1)"],
                ["Torch.add.0.forward.input.0", "b", *["x"] * 6, "-1+1"]]  # fmt: skip
        result_book(results / f"compare_result_rank{rank}_20260101000000.xlsx", rows)
    config = tmp_path / "merge.yaml"
    config.write_text("api: [Torch.add]\ncompare_index: [Max diff]\n")
    out = tmp_path / "out"
    assert main(["merge-result", "-i", str(results), "-o", str(out), "-config", str(config)]) == 0
    (book,) = out.glob("multi_ranks_compare_merge_*.xlsx")
    sheet = openpyxl.load_workbook(book)["Max diff"]
    cells = [c for row in sheet.iter_rows(min_row=2) for c in row]
    want = [evil, "@SUM(A1)", "@SUM(A1)", "Torch.add.0.forward.input.0", "-1+1", "-1+1"]
    assert [c.value for c in cells] == want
    for cell in cells:
        assert cell.data_type == "s"
        assert cell.quotePrefix == (cell.value[0] in "=@-"), cell.value
