"""The compare table as an xlsx workbook, laid out as msprobe v1 writes it (compare.md §8).

What the sheet guarantees:

* the header is ``result.header`` (msprobe v1's exact order, then Parity's extra columns);
* a row's fill is decided by its ``Parity Status``, the one verdict the page and REST show too: ``fail`` and
  ``unmatched`` red ``FFFF0000``, ``warning`` yellow ``FFFF00``, over its whole width. msprobe fills by its
  own highlight rules alone (§7.2), which Parity's status includes (a red highlight is ``fail``, a yellow
  one ``warning`` at least), so every row msprobe fills is filled here too; Parity also fills the failing
  rows msprobe leaves white (an unmatched row, an accuracy ``No`` without a highlight, an md5 mismatch).
  msprobe's own columns (``Accuracy Reached or Not``, ``Result``) keep msprobe's values;
* the header row is frozen and carries an autofilter, and each column is as wide as what it holds reads
  (names and messages wide, metrics narrow): the sheet reads at a glance without a resize;
* cells are typed as msprobe 8.3.3 types them: with highlighting on (Parity's default, msprobe's ``-hl``)
  every cell that is not a number is text, booleans included (``True``/``False``), and NaN/±Inf are
  ``nan\t``/``inf\t``/``-inf\t`` as msprobe's highlighted workbook writes them, on one sheet named ``Sheet``;
  without highlighting (msprobe without ``-hl``) booleans stay booleans, NaN/±Inf are ``nan``/``inf``/``-inf``
  and the sheet is ``Sheet1``;
* no cell is ever a formula: strings are written as text cells whatever they start with, and a string that
  a spreadsheet would read as a formula when retyped (``= + - @``, tab, CR, and the full-width ``＝＋－＠``)
  also carries Excel's quote prefix, so editing the cell keeps it text (msprobe aborts on such values; Parity
  escapes them instead, compare.md §14.7);
* numbers stay numbers (a workbook cannot hold NaN and ±Inf as numbers: see above for their text);
* past ``row_limit`` data rows the table is split over sheets ``part_0, part_1, ...``, each with the header.

Two engines write the same workbook. ``rust`` (rustpy-xlsxwriter, a binding of rust_xlsxwriter) is the
default because it measured about four times faster than the next best on the 60,000-row statistics table
(``benchmarks/bench_xlsx.py``), and the xlsx writer is what caps the end-to-end statistics-mode figure.
``xlsxwriter`` in constant-memory mode is the fallback when the Rust wheel is not installed, and writes
header-only sheets (the Rust writer derives the header from the first record, so it cannot write none).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from parity.shared.compare.result import (
    Cell,
    CompareResult,
    CompareRow,
    Highlight,
    RowStatus,
    non_finite_text,
)
from parity.shared.errors import ReportError
from parity.shared.report import publish_atomically

logger = logging.getLogger(__name__)

#: msprobe splits a sheet past this many data rows (Excel's limit is 1,048,576 rows including the header).
EXCEL_DATA_ROW_LIMIT = 1_048_500
#: Excel's limit on the characters of one cell; longer text is cut (and logged) rather than refused.
EXCEL_CELL_CHAR_LIMIT = 32_767

RED_FILL = "FFFF0000"
YELLOW_FILL = "FFFF00"
_FILL_HEX = {Highlight.RED: "#FF0000", Highlight.YELLOW: "#FFFF00"}
#: The fill of each Parity status (the page colours its rows the same: ``tr.rs-{status}``).
STATUS_FILL = {RowStatus.FAIL: Highlight.RED, RowStatus.UNMATCHED: Highlight.RED,
               RowStatus.WARNING: Highlight.YELLOW}  # fmt: skip

#: Column widths (Excel's character units) by header name; the rest by :func:`column_width`.
_WIDE = {"NPU Name": 48, "Bench Name": 48, "Err_message": 40, "NPU_Stack_Info": 60, "Data_name": 36,
         "Parity API": 40, "NPU MD5": 12, "BENCH MD5": 12}  # fmt: skip

#: First characters that make a spreadsheet treat typed text as a formula (or DDE), incl. full-width forms.
FORMULA_PREFIXES = frozenset("=+-@\t\r＝＋－＠")

Engine = Literal["auto", "rust", "xlsxwriter"]
XlsxValue = str | float | bool | None


@dataclass(frozen=True, slots=True)
class _Sheet:
    name: str
    start: int  # index into result.rows of the sheet's first data row
    stop: int


def row_fill(row: CompareRow) -> Highlight | None:
    """A row's fill: its Parity status's (:data:`STATUS_FILL`), or none."""
    return STATUS_FILL.get(row.status)


def column_width(name: str) -> float:
    """How wide a column is drawn: a name or message column wide, a metric as wide as its header reads."""
    return float(_WIDE.get(name, min(max(len(name) + 2, 10), 26)))


def is_formula_like(text: str) -> bool:
    """True when ``text`` would start a formula if typed into a spreadsheet cell."""
    return bool(text) and text[0] in FORMULA_PREFIXES


def excel_value(value: Cell, msprobe_hl: bool = False) -> tuple[XlsxValue, bool]:
    """The value to store for one table cell, and whether it is text that needs the quote prefix.

    Finite numbers stay numbers, NaN/±Inf become ``nan``/``inf``/``-inf`` text, anything else is its
    ``str``; booleans stay booleans unless ``msprobe_hl``, which writes what msprobe's highlighted workbook
    holds (``True``/``False`` text, ``nan\t``). Over-long text is cut to Excel's cell limit.
    """
    if value is None:
        return value, False
    if isinstance(value, bool):
        return (str(value) if msprobe_hl else value), False
    if isinstance(value, (int, float)):
        number = float(value)
        if math.isfinite(number):
            return (value if isinstance(value, float) else number), False
        text = non_finite_text(number)
        return (text + "\t" if msprobe_hl else text), text[0] == "-"
    text = value if isinstance(value, str) else str(value)
    if len(text) > EXCEL_CELL_CHAR_LIMIT:
        logger.warning("cell text of %d characters cut to Excel's %d", len(text), EXCEL_CELL_CHAR_LIMIT)
        text = text[:EXCEL_CELL_CHAR_LIMIT]
    return text, is_formula_like(text)


def _needs_quote(cells: Sequence[Cell]) -> bool:
    """Whether any cell of a row is written as formula-like text (the Rust engine formats whole rows)."""
    for cell in cells:
        if isinstance(cell, str):
            if cell and cell[0] in FORMULA_PREFIXES:
                return True
        elif isinstance(cell, float) and cell == -math.inf:
            return True
    return False


def plan_sheets(n_rows: int, row_limit: int = EXCEL_DATA_ROW_LIMIT, name: str = "Sheet1") -> list[_Sheet]:
    """How ``n_rows`` data rows spread over sheets: ``name`` when they fit, else ``part_0, part_1, ...``."""
    if row_limit < 1:
        raise ValueError(f"row_limit must be at least 1, got {row_limit}")
    if n_rows <= row_limit:
        return [_Sheet(name, 0, n_rows)]
    return [
        _Sheet(f"part_{i}", start, min(start + row_limit, n_rows))
        for i, start in enumerate(range(0, n_rows, row_limit))
    ]


def _check_rows(result: CompareResult) -> list[str]:
    header = result.header
    for index, row in enumerate(result.rows):
        if len(row.cells) != len(header):
            raise ReportError(
                f"compare table row {index} ({row.api}): {len(row.cells)} cells for {len(header)} columns"
            )
    return header


def write_xlsx(
    result: CompareResult,
    path: Path,
    *,
    highlight: bool = True,
    row_limit: int = EXCEL_DATA_ROW_LIMIT,
    engine: Engine = "auto",
) -> list[str]:
    """Write ``result`` as an xlsx workbook at ``path`` (atomically); returns the sheet names in order.

    Rows are filled by their Parity status (:func:`row_fill`); the header is frozen and filtered.
    ``highlight=False`` writes no fills (the rows keep their status in the ``Parity Status`` column) and
    the cells as msprobe writes them without ``-hl`` (see the module docstring). ``row_limit`` is the number
    of data rows per sheet before splitting (msprobe's 1,048,500 by default).
    """
    header = _check_rows(result)
    return write_table_xlsx(header, result.rows, path, highlight=highlight, row_limit=row_limit,
                            engine=engine)  # fmt: skip


def write_table_xlsx(
    header: list[str],
    rows: list[CompareRow],
    path: Path,
    *,
    highlight: bool = True,
    row_limit: int = EXCEL_DATA_ROW_LIMIT,
    engine: Engine = "auto",
) -> list[str]:
    """Write a table of ``header`` and ``rows`` (cells in header order) as :func:`write_xlsx` does; the
    writer of both report forms (8.3.3's columns, msprobe 26's)."""
    sheets = plan_sheets(len(rows), row_limit, "Sheet" if highlight else "Sheet1")
    chosen = _choose_engine(engine, header, len(rows))
    writer = _write_rust if chosen == "rust" else _write_xlsxwriter
    with publish_atomically(Path(path)) as tmp:
        try:
            writer(tmp, header, rows, sheets, highlight)
        except ReportError:
            raise
        except Exception as exc:  # a writer library failing on odd data must name the report, not crash
            raise ReportError(f"{path}: the {chosen} xlsx writer failed: {exc}") from exc
    logger.debug("wrote %s (%d rows, sheets %s, engine %s)", path, len(rows), sheets, chosen)
    return [sheet.name for sheet in sheets]


def _choose_engine(engine: Engine, header: Sequence[str], n_rows: int) -> str:
    if engine == "xlsxwriter":
        return engine
    try:
        import rustpy_xlsxwriter  # noqa: F401
    except ImportError:
        if engine == "rust":
            raise ReportError("the rust xlsx engine needs the rustpy-xlsxwriter package") from None
        return "xlsxwriter"
    # The Rust writer takes rows as dicts keyed by column name and takes its header from the first row.
    if n_rows == 0 or len(set(header)) != len(header):
        if engine == "rust":
            raise ReportError("the rust xlsx engine cannot write an empty table or repeated column names")
        return "xlsxwriter"
    return "rust"


def _write_rust(
    tmp: Path, header: list[str], rows: list[CompareRow], sheets: list[_Sheet], highlight: bool
) -> None:
    import rustpy_xlsxwriter as rx

    formats: dict[tuple[Highlight | None, bool], Any] = {}

    def row_format(fill: Highlight | None, quote: bool) -> Any:
        key = (fill, quote)
        if key not in formats:
            fmt = rx.Format()
            if fill is not None:
                fmt = fmt.set_background_color(_FILL_HEX[fill])
            if quote:
                fmt = fmt.set_quote_prefix()
            formats[key] = fmt
        return formats[key]

    def records(sheet: _Sheet) -> Iterator[dict[str, XlsxValue]]:
        # Converted lazily while the writer pulls them, so a million-row table is never doubled in memory.
        # The common cells (short text, finite floats, None, bools) are stored as they are, tested inline:
        # a function call per cell was most of the writer's Python time. The rest goes through excel_value.
        limit = EXCEL_CELL_CHAR_LIMIT
        keep_bool = not highlight  # highlighted, msprobe writes booleans as text
        for row in rows[sheet.start : sheet.stop]:
            yield {
                name: cell
                if (type(cell) is str and len(cell) <= limit)  # type: ignore[arg-type]
                or (type(cell) is float and cell - cell == 0.0)  # type: ignore[operator]
                or cell is None
                or (keep_bool and type(cell) is bool)
                else excel_value(cell, highlight)[0]
                for name, cell in zip(header, row.cells, strict=True)
            }

    # The binding reads the row formats when called, before it pulls a record, so they are decided first in a
    # cheap pass that only looks at fills and first characters.
    row_formats: dict[str, dict[int, Any]] = {}
    for sheet in sheets:
        fmt_map: dict[int, Any] = {}
        for offset, row in enumerate(rows[sheet.start : sheet.stop], start=1):
            fill = row_fill(row) if highlight else None
            quote = _needs_quote(row.cells)
            if fill is not None or quote:
                fmt_map[offset] = row_format(fill, quote)
        row_formats[sheet.name] = fmt_map
    entries: list[tuple[str, Any]] = [(sheet.name, records(sheet)) for sheet in sheets]
    widths = [column_width(name) for name in header]
    rx.write_worksheets(entries, str(tmp), row_formats=row_formats,
                        freeze_panes={"general": {"row": 1, "col": 0}},
                        autofilter={sheet.name: True for sheet in sheets},
                        column_widths={sheet.name: widths for sheet in sheets})  # fmt: skip


def _write_xlsxwriter(
    tmp: Path, header: list[str], rows: list[CompareRow], sheets: list[_Sheet], highlight: bool
) -> None:
    import xlsxwriter

    workbook = xlsxwriter.Workbook(
        str(tmp), {"constant_memory": True, "strings_to_formulas": False, "strings_to_urls": False}
    )
    formats: dict[tuple[Highlight | None, bool], Any] = {(None, False): None}

    def cell_format(fill: Highlight | None, quote: bool) -> Any:
        key = (fill, quote)
        if key not in formats:
            props: dict[str, Any] = {}
            if fill is not None:
                props.update(bg_color=_FILL_HEX[fill], pattern=1)
            if quote:
                props["quote_prefix"] = True
            formats[key] = workbook.add_format(props)
        return formats[key]

    try:
        for sheet in sheets:
            worksheet = workbook.add_worksheet(sheet.name)
            for col, name in enumerate(header):
                worksheet.set_column(col, col, column_width(name))
            worksheet.freeze_panes(1, 0)
            worksheet.autofilter(0, 0, sheet.stop - sheet.start, max(0, len(header) - 1))
            write_string, write_number = worksheet.write_string, worksheet.write_number
            write_boolean, write_blank = worksheet.write_boolean, worksheet.write_blank
            for col, name in enumerate(header):
                write_string(0, col, name)
            for r, row in enumerate(rows[sheet.start : sheet.stop], start=1):
                fill = row_fill(row) if highlight else None
                plain = cell_format(fill, False)
                if fill is not None:
                    worksheet.set_row(r, None, plain)  # the fill spans the row past the last column too
                for col, cell in enumerate(row.cells):
                    value, quote = excel_value(cell, highlight)
                    fmt = cell_format(fill, True) if quote else plain
                    if value is None:
                        if fmt is not None:
                            write_blank(r, col, None, fmt)
                    elif isinstance(value, bool):
                        write_boolean(r, col, value, fmt)
                    elif isinstance(value, float):
                        write_number(r, col, value, fmt)
                    else:
                        write_string(r, col, value, fmt)
    finally:
        workbook.close()


NamedTable = tuple[str, Sequence[str], Sequence[Sequence[Cell]]]


def write_sheets_xlsx(sheets: Sequence[NamedTable], path: Path) -> Path:
    """Write named tables (``(name, header, rows)``), a sheet each, as one workbook at ``path`` (atomically).

    For small workbooks of several tables (``parity merge-result``'s one sheet per metric): cells as
    :func:`excel_value` stores them without msprobe's highlighting (booleans stay booleans, NaN/±Inf are
    ``nan``/``inf``/``-inf`` text), formula-like text quote-prefixed, the header frozen and filtered.
    """
    import xlsxwriter

    with publish_atomically(Path(path)) as tmp:
        workbook = xlsxwriter.Workbook(
            str(tmp), {"constant_memory": True, "strings_to_formulas": False, "strings_to_urls": False}
        )
        quoted = workbook.add_format({"quote_prefix": True})
        try:
            for name, header, rows in sheets:
                worksheet = workbook.add_worksheet(name)
                for col, title in enumerate(header):
                    worksheet.set_column(col, col, column_width(title))
                    worksheet.write_string(0, col, title)
                worksheet.freeze_panes(1, 0)
                worksheet.autofilter(0, 0, len(rows), max(0, len(header) - 1))
                for r, cells in enumerate(rows, start=1):
                    for col, cell in enumerate(cells):
                        value, quote = excel_value(cell)
                        if value is None:
                            continue
                        if isinstance(value, bool):
                            worksheet.write_boolean(r, col, value)
                        elif isinstance(value, float):
                            worksheet.write_number(r, col, value)
                        else:
                            worksheet.write_string(r, col, value, quoted if quote else None)
        except Exception as exc:  # a writer library failing on odd data must name the report, not crash
            raise ReportError(f"{path}: the xlsx writer failed: {exc}") from exc
        finally:
            workbook.close()
    return Path(path)
