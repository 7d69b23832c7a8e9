"""The xlsx report read back with openpyxl: header, order, values, fills, injection safety, sheet split."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import openpyxl
import pytest
from openpyxl.utils.escape import unescape
from parity.shared.compare.headers import CompareMode, full_header, msprobe_header
from parity.shared.compare.result import Advice, Cell, CompareResult, CompareRow, Highlight, RowStatus
from parity.shared.errors import ReportError
from parity.shared.report.xlsx import RED_FILL, YELLOW_FILL, excel_value, plan_sheets, write_xlsx

HAS_RUST = importlib.util.find_spec("rustpy_xlsxwriter") is not None
ENGINES = [
    pytest.param("rust", marks=pytest.mark.skipif(not HAS_RUST, reason="rustpy-xlsxwriter not installed")),
    "xlsxwriter",
]
NO_ADVICE = Advice(
    line=None, suspect_node=None, text="All data in comparison result meets the accuracy requirements."
)


def make_row(
    mode: CompareMode,
    name: str,
    values: dict[str, Cell] | None = None,
    *,
    status: RowStatus = RowStatus.PASS,
    highlight: Highlight | None = None,
    stack: bool = False,
) -> CompareRow:
    header = full_header(mode, stack=stack)
    cells: list[Cell] = [None] * len(header)
    cells[header.index("NPU Name")] = name
    cells[header.index("Bench Name")] = name
    cells[header.index("Parity Status")] = status.value
    api = name.rsplit(".", 2)[0]
    cells[header.index("Parity API")] = api
    for column, value in (values or {}).items():
        cells[header.index(column)] = value
    return CompareRow(cells=cells, api=api, status=status, highlight=highlight)


def make_result(rows: list[CompareRow], mode: CompareMode = CompareMode.STATISTICS, stack: bool = False):
    return CompareResult(mode=mode, stack_mode=stack, rows=rows, advice=NO_ADVICE)


def read_sheet(path: Path, name: str) -> list[list[openpyxl.cell.cell.Cell]]:
    workbook = openpyxl.load_workbook(path)
    return [list(row) for row in workbook[name].iter_rows()]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("mode", list(CompareMode))
@pytest.mark.parametrize("stack", [False, True])
def test_header_is_msprobe_v1_order_then_parity_columns(tmp_path, engine, mode, stack):
    result = make_result([make_row(mode, "Torch.add.0.forward.input.0", stack=stack)], mode, stack)
    sheets = write_xlsx(result, tmp_path / "r.xlsx", engine=engine)
    assert sheets == ["Sheet"]  # msprobe -hl's sheet (openpyxl's default)
    header = [c.value for c in read_sheet(tmp_path / "r.xlsx", "Sheet")[0]]
    assert header == result.header
    n = len(msprobe_header(mode, stack=stack))
    assert header[:n] == msprobe_header(mode, stack=stack)
    assert header[n:] == ["Parity Status", "Parity API", "Parity Pairing", "Parity Gap"]


@pytest.mark.parametrize("engine", ENGINES)
def test_rows_keep_order_and_value_types(tmp_path, engine):
    names = [f"Functional.linear.{i}.forward.output.0" for i in range(5)]
    rows = [
        make_row(
            CompareMode.STATISTICS,
            name,
            {
                "Max diff": i * 0.5 - 1,
                "NPU max": i,
                "MaxRelativeErr": f"{i}.5%",
                "Requires_grad Consistent": i % 2 == 0,
            },
        )  # fmt: skip
        for i, name in enumerate(names)
    ]
    for highlight, sheet, booleans in ((True, "Sheet", ("True", "False")), (False, "Sheet1", (True, False))):
        # msprobe -hl writes every non-number as text, booleans included; without -hl they stay booleans
        write_xlsx(make_result(rows), tmp_path / "r.xlsx", engine=engine, highlight=highlight)
        table = read_sheet(tmp_path / "r.xlsx", sheet)
        header = [c.value for c in table[0]]
        col = {name: header.index(name) for name in header}
        assert [r[col["NPU Name"]].value for r in table[1:]] == names
        for i, row in enumerate(table[1:]):
            assert row[col["Max diff"]].data_type == "n" and row[col["Max diff"]].value == i * 0.5 - 1
            assert row[col["NPU max"]].value == i
            assert row[col["MaxRelativeErr"]].value == f"{i}.5%"
            assert row[col["Requires_grad Consistent"]].value == booleans[i % 2]
            assert row[col["Err_message"]].value is None


@pytest.mark.parametrize("engine", ENGINES)
def test_highlight_fills_whole_row_red_or_yellow(tmp_path, engine):
    rows = [
        make_row(CompareMode.TENSOR, "Torch.a.0.forward.input.0"),
        make_row(
            CompareMode.TENSOR, "Torch.a.0.forward.output.0", status=RowStatus.FAIL, highlight=Highlight.RED
        ),
        make_row(
            CompareMode.TENSOR,
            "Torch.b.0.forward.output.0",
            status=RowStatus.WARNING,
            highlight=Highlight.YELLOW,
        ),  # fmt: skip
    ]
    write_xlsx(make_result(rows, CompareMode.TENSOR), tmp_path / "r.xlsx", engine=engine)
    sheet = openpyxl.load_workbook(tmp_path / "r.xlsx")["Sheet"]
    table = [list(r) for r in sheet.iter_rows()]
    assert all(c.fill.fill_type is None for c in table[0] + table[1])
    assert sheet.row_dimensions[2].fill.fill_type is None
    # Every written cell carries the fill, and so does the row itself (the style Excel gives its blank cells).
    for excel_row, rgb in ((3, RED_FILL), (4, "FF" + YELLOW_FILL)):
        written = [c for c in table[excel_row - 1] if c.value is not None]
        assert len(written) >= 3
        assert {(c.fill.fill_type, c.fill.fgColor.rgb) for c in written} == {("solid", rgb)}
        dims = sheet.row_dimensions[excel_row]
        assert dims.customFormat and (dims.fill.fill_type, dims.fill.fgColor.rgb) == ("solid", rgb)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_parity_status_decides_the_fill(tmp_path, engine):
    """Issue 36: an unmatched row was red on the page and white in the workbook, and a failing row without
    msprobe's highlight white: the fill follows the Parity Status column, as the page's colours do."""
    statuses = [(RowStatus.PASS, None), (RowStatus.UNMATCHED, None), (RowStatus.FAIL, None),
                (RowStatus.WARNING, None), (RowStatus.FAIL, Highlight.YELLOW), (RowStatus.UNCOMPARABLE, None),
                (RowStatus.BENCH_ONLY, None)]  # fmt: skip
    rows = [make_row(CompareMode.TENSOR, f"Torch.a.{k}.forward.output.0", status=status, highlight=hl)
            for k, (status, hl) in enumerate(statuses)]  # fmt: skip
    write_xlsx(make_result(rows, CompareMode.TENSOR), tmp_path / "r.xlsx", engine=engine)
    sheet = openpyxl.load_workbook(tmp_path / "r.xlsx")["Sheet"]
    fills = [r[0].fill.fgColor.rgb if r[0].fill.fill_type else None for r in sheet.iter_rows(min_row=2)]
    yellow = "FF" + YELLOW_FILL
    assert fills == [None, RED_FILL, RED_FILL, yellow, RED_FILL, None, None]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_header_is_frozen_and_filtered_and_columns_have_widths(tmp_path, engine):
    rows = [make_row(CompareMode.STATISTICS, f"Torch.a.{k}.forward.output.0") for k in range(3)]
    write_xlsx(make_result(rows, CompareMode.STATISTICS), tmp_path / "r.xlsx", engine=engine)
    sheet = openpyxl.load_workbook(tmp_path / "r.xlsx")["Sheet"]
    assert sheet.freeze_panes == "A2"
    header = full_header(CompareMode.STATISTICS, stack=False)
    last = openpyxl.utils.get_column_letter(len(header))
    assert sheet.auto_filter.ref == f"A1:{last}4"
    width = {name: sheet.column_dimensions[openpyxl.utils.get_column_letter(i)].width
             for i, name in enumerate(header, 1)}  # fmt: skip
    assert width["NPU Name"] >= 40 and width["Err_message"] >= 30
    assert 10 <= width["Max diff"] < width["NPU Name"]
    assert all(w and w >= 10 for w in width.values()), width


@pytest.mark.parametrize("engine", ENGINES)
def test_highlight_off_writes_no_fill(tmp_path, engine):
    rows = [make_row(CompareMode.TENSOR, "Torch.a.0.forward.output.0", status=RowStatus.FAIL,
                     highlight=Highlight.RED)]  # fmt: skip
    write_xlsx(make_result(rows, CompareMode.TENSOR), tmp_path / "r.xlsx", highlight=False, engine=engine)
    sheet = openpyxl.load_workbook(tmp_path / "r.xlsx")["Sheet1"]
    assert all(c.fill.fill_type is None for c in next(sheet.iter_rows(min_row=2, max_row=2)))
    assert sheet.row_dimensions[2].fill.fill_type is None


INJECTIONS = ["=1+1", "+SUM(A1:A2)", "-2+3", "@SUM(A1)", "\t=cmd", "\r=cmd", "＝1", "＋1", "－1", "＠x",
              "=HYPERLINK(\"http://x\",\"y\")"]  # fmt: skip


@pytest.mark.parametrize("engine", ENGINES)
def test_formula_like_strings_are_text_never_formulas(tmp_path, engine):
    rows = [
        make_row(CompareMode.STATISTICS, f"Torch.x.{i}.forward.input.0", {"Err_message": text})
        for i, text in enumerate(INJECTIONS)
    ]
    rows.append(make_row(CompareMode.STATISTICS, "=evil.0.forward.input.0"))
    write_xlsx(make_result(rows), tmp_path / "r.xlsx", engine=engine)
    table = read_sheet(tmp_path / "r.xlsx", "Sheet")
    col = [c.value for c in table[0]].index("Err_message")
    for text, row in zip(INJECTIONS, table[1:], strict=False):
        cell = row[col]
        # A CR is stored as OOXML's _x000D_ escape, which Excel decodes and openpyxl leaves as is.
        assert cell.data_type == "s" and unescape(cell.value) == text
        assert cell.quotePrefix  # retyping the cell in Excel keeps it text
    assert table[-1][0].value == "=evil.0.forward.input.0" and table[-1][0].data_type == "s"
    # No formula anywhere in the sheet XML.
    import zipfile

    with zipfile.ZipFile(tmp_path / "r.xlsx") as archive:
        xml = archive.read("xl/worksheets/sheet1.xml").decode()
    assert "<f>" not in xml and "<f " not in xml


@pytest.mark.parametrize("engine", ENGINES)
def test_special_floats_are_text_and_numbers_stay_numbers(tmp_path, engine):
    values: dict[str, Cell] = {"Max diff": math.nan, "Min diff": math.inf, "Mean diff": -math.inf,
                               "L2norm diff": 0.25, "NPU max": 3, "NPU min": "Nan"}  # fmt: skip
    # msprobe's highlighted workbook writes "nan\t", "inf\t", "-inf\t"; without -hl Parity writes the words
    for highlight, sheet, tail in ((True, "Sheet", "\t"), (False, "Sheet1", "")):
        write_xlsx(make_result([make_row(CompareMode.STATISTICS, "Torch.x.0.forward.input.0", values)]),
                   tmp_path / "r.xlsx", engine=engine, highlight=highlight)  # fmt: skip
        table = read_sheet(tmp_path / "r.xlsx", sheet)
        header = [c.value for c in table[0]]
        got = {name: table[1][header.index(name)] for name in values}
        assert (got["Max diff"].value, got["Max diff"].data_type) == ("nan" + tail, "s")
        assert (got["Min diff"].value, got["Min diff"].data_type) == ("inf" + tail, "s")
        assert (got["Mean diff"].value, got["Mean diff"].data_type) == ("-inf" + tail, "s")
        assert got["Mean diff"].quotePrefix
        assert (got["L2norm diff"].value, got["L2norm diff"].data_type) == (0.25, "n")
        assert (got["NPU max"].value, got["NPU max"].data_type) == (3, "n")
        assert got["NPU min"].value == "Nan"


@pytest.mark.parametrize("engine", ENGINES)
def test_split_into_parts_past_the_row_limit(tmp_path, engine):
    rows = [make_row(CompareMode.MD5, f"Torch.add.{i}.forward.input.0",
                     status=RowStatus.FAIL if i == 5 else RowStatus.PASS) for i in range(7)]  # fmt: skip
    sheets = write_xlsx(make_result(rows, CompareMode.MD5), tmp_path / "r.xlsx", row_limit=3, engine=engine)
    assert sheets == ["part_0", "part_1", "part_2"]
    workbook = openpyxl.load_workbook(tmp_path / "r.xlsx")
    assert workbook.sheetnames == sheets
    names = []
    for sheet in sheets:
        table = [list(r) for r in workbook[sheet].iter_rows()]
        assert [c.value for c in table[0]] == full_header(CompareMode.MD5, stack=False)
        names += [r[0].value for r in table[1:]]
    assert names == [f"Torch.add.{i}.forward.input.0" for i in range(7)]
    # Row 5 is the 3rd row of part_1: its fill moved with it.
    part_1 = [list(r) for r in workbook["part_1"].iter_rows()]
    assert part_1[3][0].fill.fgColor.rgb == RED_FILL and part_1[1][0].fill.fill_type is None


def test_exactly_the_limit_stays_one_sheet():
    assert [s.name for s in plan_sheets(3, 3)] == ["Sheet1"]
    assert [(s.name, s.start, s.stop) for s in plan_sheets(4, 3)] == [("part_0", 0, 3), ("part_1", 3, 4)]
    with pytest.raises(ValueError):
        plan_sheets(1, 0)


def test_empty_table_writes_the_header(tmp_path):
    result = make_result([], CompareMode.TENSOR)
    assert write_xlsx(result, tmp_path / "r.xlsx") == ["Sheet"]
    table = read_sheet(tmp_path / "r.xlsx", "Sheet")
    assert len(table) == 1 and [c.value for c in table[0]] == result.header


def test_replaces_an_existing_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "r.xlsx"
    target.write_text("old")
    write_xlsx(make_result([make_row(CompareMode.MD5, "Torch.a.0.forward.input.0")], CompareMode.MD5), target)
    assert openpyxl.load_workbook(target).sheetnames == ["Sheet"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.xlsx"]


def test_a_row_of_the_wrong_width_is_refused_and_nothing_is_published(tmp_path):
    row = make_row(CompareMode.MD5, "Torch.a.0.forward.input.0")
    row.cells.pop()
    with pytest.raises(ReportError, match=r"row 0 \(Torch.a.0.forward\)"):
        write_xlsx(make_result([row], CompareMode.MD5), tmp_path / "r.xlsx")
    assert list(tmp_path.iterdir()) == []


def test_excel_value_conversions():
    assert excel_value(True) == (True, False)
    assert excel_value(2) == (2.0, False)
    assert excel_value(-1.5) == (-1.5, False)
    assert excel_value(float("nan")) == ("nan", False)
    assert excel_value(float("-inf")) == ("-inf", True)
    assert excel_value("-1") == ("-1", True)
    assert excel_value("1-") == ("1-", False)
    assert excel_value("x" * 40_000)[0] == "x" * 32_767
