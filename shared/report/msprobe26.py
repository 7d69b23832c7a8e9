"""The compare table in msprobe 26's form (``parity compare -tp -gp``): its columns and cells, CSV by default.

msprobe 26 (the 26.x line, ``msprobe compare -tp TARGET -gp GOLDEN``) writes ``compare_result_{ts}.csv``
(``--xlsx``: ``.xlsx``; step folders: ``compare_result_rank{N}_{ts}.csv``) with 8.3.3's columns but for
three changes, read from 26.2.0's ``CompareConst``: tensor mode's ``Accuracy Reached or Not`` is ``Result``,
md5 mode gains ``Err_message``, and every mode's ``Result`` is one of ``pass``, ``warning``, ``error`` with
``Err_message`` a JSON list of messages (``[]`` when none). This module turns a :class:`CompareResult`
(8.3.3's table, which the engine builds once) into that table, row for row, and writes it; Parity's own
columns follow msprobe's as in the xlsx.

What a cell holds: numbers as Python writes them (``repr``), NaN as ``nan`` and ±Inf as `` inf`` /
`` -inf`` (msprobe 26 puts the space there so a spreadsheet opening the CSV reads text, not ``#NAME?``),
booleans as ``True``/``False``, an empty cell as nothing. ``Result`` is Parity's verdict in 26's words:
``pass`` (a pass, or a row no metric applies to, as msprobe 26 says), ``warning`` (a warning, or a row with
no partner: Parity never passes one), ``error`` (a failure). A text cell a spreadsheet would run as a formula
(``= + - @``, tab, CR, their full-width forms) gets Excel's quote prefix, as in the xlsx.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from parity.shared.compare.headers import PARITY_EXTRA, CompareMode, msprobe_header
from parity.shared.compare.result import Cell, CompareResult, CompareRow, RowStatus
from parity.shared.report import publish_atomically
from parity.shared.report.xlsx import is_formula_like

__all__ = ["header_26", "read_csv_26", "table_26", "write_csv_26", "write_xlsx_26"]

ACCURACY = "Accuracy Reached or Not"
RESULT = "Result"
ERR_MESSAGE = "Err_message"
#: msprobe 26's md5-mode message for a checksum that differs (``CompareConst``'s wording)
CRC_DIFFERS = "error: The CRC-32 value of NPU differs from that of the bench."
_VERDICT = {
    RowStatus.PASS: "pass",
    RowStatus.UNCOMPARABLE: "pass",
    RowStatus.WARNING: "warning",
    RowStatus.UNMATCHED: "warning",
    RowStatus.BENCH_ONLY: "warning",
    RowStatus.FAIL: "error",
}
#: one message ends where the next begins with a capital after a full stop (8.3.3 appends them so)
_MESSAGE_BREAK = re.compile(r"(?<=\.)\s*(?=[A-Z])")


def header_26(mode: CompareMode, *, stack: bool) -> list[str]:
    """msprobe 26's header for ``mode`` (before Parity's columns)."""
    header = [RESULT if name == ACCURACY else name for name in msprobe_header(mode, stack=stack)]
    if mode is CompareMode.MD5:
        header.insert(header.index(RESULT) + 1, ERR_MESSAGE)
    return header


def messages(text: Cell) -> list[str]:
    """8.3.3's Err_message cell (messages appended, highlight reasons on their own lines) as a list."""
    if not isinstance(text, str) or not text.strip():
        return []
    out: list[str] = []
    for line in text.splitlines():
        out.extend(m.strip() for m in _MESSAGE_BREAK.split(line) if m.strip())
    return list(dict.fromkeys(out))


def table_26(result: CompareResult) -> tuple[list[str], list[CompareRow]]:
    """``result``'s table in msprobe 26's columns (then Parity's): the header and one row per row."""
    old = result.header
    header = [*header_26(result.mode, stack=result.stack_mode), *PARITY_EXTRA]
    position = {name: i for i, name in enumerate(old)}
    message_col = position.get(ERR_MESSAGE)
    md5 = result.mode is CompareMode.MD5
    rows: list[CompareRow] = []
    for row in result.rows:
        cells = row.cells
        found = messages(cells[message_col]) if message_col is not None else []
        if md5 and row.status is RowStatus.FAIL:
            found.append(CRC_DIFFERS)
        verdict = _VERDICT[row.status]
        new: list[Cell] = []
        for name in header:
            if name == RESULT:
                new.append(verdict)
            elif name == ERR_MESSAGE:
                new.append(json.dumps(found, ensure_ascii=False))
            else:
                new.append(cells[position[name]])
        rows.append(CompareRow(new, row.api, row.status, row.highlight))
    return header, rows


def csv_text(value: Cell) -> str:
    """One cell as msprobe 26's CSV holds it (see the module docstring)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return " inf" if value > 0 else " -inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    text = str(value)
    return f"'{text}" if is_formula_like(text) else text


def _records(header: Sequence[str], rows: Sequence[CompareRow]) -> Iterator[list[str]]:
    yield list(header)
    for row in rows:
        yield [csv_text(c) for c in row.cells]


def write_csv_26(result: CompareResult, path: Path) -> Path:
    """Write ``result`` as msprobe 26's ``compare_result_*.csv`` at ``path`` (atomically)."""
    header, rows = table_26(result)
    with publish_atomically(Path(path)) as tmp, tmp.open("w", encoding="utf-8", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(_records(header, rows))
    return Path(path)


def write_xlsx_26(result: CompareResult, path: Path, *, highlight: bool = True) -> Path:
    """Write ``result`` as msprobe 26's ``--xlsx`` workbook (its columns, Parity's fills)."""
    from parity.shared.report.xlsx import write_table_xlsx

    header, rows = table_26(result)
    write_table_xlsx(header, rows, Path(path), highlight=highlight)
    return Path(path)


def read_csv_26(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """An msprobe 26 (or Parity 26-form) compare CSV: its header and its rows as dicts of text."""
    with Path(path).open(encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    return list(reader.fieldnames or []), rows


def diff_analyze_document(results: Sequence[CompareResult]) -> dict[str, list[dict[str, Any]]]:
    """msprobe 26's ``-da`` document: per rank (``rank_{N}``, ``rank_0`` for one rank) the first divergent
    call as 26's ``gen_node_info`` writes a node (``op_name``, ``data_info`` of its input and output rows in
    26's columns, ``stack_info``), from Parity's first divergence (an empty list when no call diverges)."""
    doc: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        nodes: list[dict[str, Any]] = []
        first = result.first_divergence
        if first is not None:
            header, rows = table_26(result)
            name = header.index("NPU Name")
            inputs: list[dict[str, Any]] = []
            outputs: list[dict[str, Any]] = []
            for row in rows:
                if row.api != first.api:
                    continue
                item = {h: csv_text(c) for h, c in zip(header, row.cells, strict=True)}
                (outputs if ".output." in str(row.cells[name]) else inputs).append(item)
            nodes.append({"op_name": first.api, "data_info": {"input": inputs, "output": outputs},
                          "stack_info": first.stack})  # fmt: skip
        doc[f"rank_{0 if result.rank is None else result.rank}"] = nodes
    return doc


def write_diff_analyze(results: Sequence[CompareResult], path: Path) -> Path:
    """Write :func:`diff_analyze_document` at ``path`` (atomically)."""
    from parity.shared.report import write_text_atomically

    text = json.dumps(diff_analyze_document(results), indent=2, ensure_ascii=False)
    write_text_atomically(Path(path), text)
    return Path(path)
