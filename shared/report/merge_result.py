"""msprobe 26's ``merge_result``: chosen APIs x ranks x metrics of per-rank compare results, in one workbook.

``parity merge-result -i RESULTS_DIR -o OUT_DIR -config merge.yaml`` reads the
``compare_result_rank{N}_{ts}.xlsx`` workbooks of one multi-rank compare (msprobe 26's ``--xlsx``, 8.3.3's,
or Parity's own with its extra columns) and writes ``multi_ranks_compare_merge_{ts}.xlsx``: one sheet per
metric (named for it), columns ``NPU Name, rank0, rank1, ...``, one row per row whose ``NPU Name`` contains
an API of the config (``{api}.``), sorted by name. It follows msprobe 26.2.0's
``msprobe.core.compare.merge_result`` (read from its code):

* the config (YAML) holds ``api`` (a non-empty list, e.g. ``[Distributed.all_reduce, Functional.linear]``)
  and optionally ``compare_index`` (metrics of the results' mode; default every metric of that mode, plus
  ``Requires_grad Consistent``);
* only names of the multi-rank form are merged (``compare_result_rank3_{14 digits}.xlsx``; a single-rank
  result is left out with a warning, any other ``.xlsx`` is refused); at least two are needed;
* a statistics or tensor result is merged; an md5 one, or one whose columns are no compare table, is left out
  with a warning, as is an empty one;
* a metric that is ``N/A``, ``unsupported`` or ``Nan`` (a non-tensor argument) reads
  ``NPU:{NPU max}  Bench:{Bench max}`` instead;
* a cell is kept as the workbook holds it (numbers as numbers), as pandas reads it for msprobe.

Where msprobe aborts on a cell a spreadsheet would run as a formula, Parity writes it as quoted text; where
msprobe's outcome depends on how many processes it splits the files over (one bad file can drop the files
beside it), Parity leaves out the bad file alone. A ``compare_index`` not of the results' mode is an error
that names it (msprobe drops every file, then says there is nothing to merge).
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.shared.compare.headers import (
    PARITY_EXTRA,
    STATISTICS_METRICS,
    TENSOR_METRICS,
    CompareMode,
    msprobe_header,
)
from parity.shared.compare.mapping import read_yaml
from parity.shared.compare.result import Cell
from parity.shared.errors import CompareInputError
from parity.shared.report.msprobe26 import header_26

logger = logging.getLogger(__name__)

__all__ = ["MergeConfig", "load_merge_config", "merge_results", "write_merge"]

NPU_NAME = "NPU Name"
REQ_GRAD = "Requires_grad Consistent"
NPU_MAX, BENCH_MAX = "NPU max", "Bench max"
#: metric values that mean "no metric for this row" (msprobe's ``CompareConst.N_A``, ``UNSUPPORTED``, ``NAN``)
NO_METRIC = frozenset({"N/A", "unsupported", "Nan"})
METRICS = {
    CompareMode.TENSOR: [*TENSOR_METRICS, REQ_GRAD],
    CompareMode.STATISTICS: [*STATISTICS_METRICS, REQ_GRAD],
}
MULTI_RANK = re.compile(r"^compare_result_rank(\d+)(?:-rank\1)?_\d{14}\.xlsx$")
SINGLE_RANK = re.compile(r"^compare_result_(rank|rank-rank)_\d{14}\.xlsx$")
#: an xlsx unzips to many times its size: a result workbook past this is refused before it is opened
MAX_RESULT_BYTES = 2 << 30
_TRUE, _FALSE = frozenset({"True", "TRUE", "true"}), frozenset({"False", "FALSE", "false"})


@dataclass(frozen=True)
class MergeConfig:
    apis: tuple[str, ...]
    metrics: tuple[str, ...]  # empty: every metric of the results' mode
    source: str


@dataclass
class RankTable:
    rank: int
    path: Path
    mode: CompareMode | None  # None: no compare table msprobe merges (md5, unknown columns)
    columns: dict[str, list[Any]]


def load_merge_config(path: str | Path) -> MergeConfig:
    """Read and check the merge config YAML (msprobe's ``-config``)."""
    path = Path(path)
    doc = read_yaml(path, "merge config")
    if not doc:
        raise CompareInputError(f"{path}: the merge config is empty (it needs 'api', a list of API names)")
    if not isinstance(doc, Mapping):
        raise CompareInputError(f"{path}: must be a mapping with 'api' (and 'compare_index')")
    apis = doc.get("api")
    if not apis:
        raise CompareInputError(f"{path}: field 'api': the APIs to merge are missing (a list of API names)")
    metrics = doc.get("compare_index") or []
    for field, value in (("api", apis), ("compare_index", metrics)):
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise CompareInputError(f"{path}: field '{field}' must be a list of names, got {value!r}")
    return MergeConfig(tuple(apis), tuple(metrics), str(path))


def result_files(folder: Path) -> list[tuple[int, Path]]:
    """The multi-rank compare results of ``folder``, by rank."""
    if not folder.is_dir():
        raise CompareInputError(f"{folder}: not a directory (give the folder of compare_result_rank*.xlsx)")
    found: list[tuple[int, Path]] = []
    for path in sorted(folder.iterdir()):
        if not path.name.endswith(".xlsx"):
            continue
        match = MULTI_RANK.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
        elif SINGLE_RANK.match(path.name):
            logger.warning("%s: a single-rank compare result, left out (nothing to merge)", path)
        else:
            raise CompareInputError(
                f"{path}: not a compare result name (compare_result_rank{{N}}_{{ts}}.xlsx)"
            )
    found.sort(key=lambda item: item[0])
    if len(found) < 2:
        raise CompareInputError(
            f"{folder}: {len(found)} multi-rank compare results; merging needs at least 2"
        )
    return found


def _mode(header: list[str]) -> CompareMode | None:
    if header[-len(PARITY_EXTRA) :] == PARITY_EXTRA:
        header = header[: -len(PARITY_EXTRA)]
    for mode in CompareMode:
        for stack in (False, True):
            if header in (header_26(mode, stack=stack), msprobe_header(mode, stack=stack)):
                return mode
    return None


def _cell(cell: Any) -> Any:
    """A cell as pandas' openpyxl reader gives it (``keep_default_na=False``): empty is ``''``, an integral
    number an int, an error cell NaN."""
    value = cell.value
    if value is None:
        return ""
    if cell.data_type == "e":
        return math.nan
    if cell.data_type == "n" and not isinstance(value, bool):
        as_int = int(value)
        return as_int if as_int == value else float(value)
    return value


def _numeric(value: Any) -> float | int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return int(number) if re.fullmatch(r"[+-]?\d+", value.strip()) else number
    return None


def _column(values: list[Any]) -> list[Any]:
    """A column's values typed as pandas infers them: all numbers (or numeric text) become one numeric
    type (int when every one is, else float); all booleans (or ``True``/``False`` text) booleans; any
    other mix (an empty cell, a word) keeps each value as read."""
    numbers = [_numeric(v) for v in values]
    if values and all(n is not None for n in numbers):
        if all(isinstance(n, int) for n in numbers):
            return numbers
        return [float(n) for n in numbers if n is not None]
    if values and all(isinstance(v, bool) or v in _TRUE or v in _FALSE for v in values):
        return [v if isinstance(v, bool) else v in _TRUE for v in values]
    return values


def read_table(rank: int, path: Path) -> RankTable:
    """The first sheet of one compare result workbook, by column."""
    import openpyxl

    try:
        size = path.stat().st_size
        if size > MAX_RESULT_BYTES:
            raise CompareInputError(f"{path}: {size} bytes, over the {MAX_RESULT_BYTES} a result may have")
        workbook = openpyxl.load_workbook(path, read_only=True, data_only=True)
    except CompareInputError:
        raise
    except Exception as exc:  # a damaged zip, not a workbook: openpyxl raises several kinds
        raise CompareInputError(f"{path}: not a readable xlsx workbook: {exc}") from None
    try:
        sheet = workbook.worksheets[0]
        rows = [[_cell(c) for c in row] for row in sheet.iter_rows()]
    finally:
        workbook.close()
    if not rows:
        return RankTable(rank, path, None, {})
    header = [str(v) for v in rows[0]]
    while header and header[-1] == "":
        header.pop()
    body = [row[: len(header)] + [""] * (len(header) - len(row)) for row in rows[1:]]
    columns = {name: _column([row[i] for row in body]) for i, name in enumerate(header)}
    return RankTable(rank, path, _mode(header), columns)


def _metrics(config: MergeConfig, mode: CompareMode, path: Path) -> list[str]:
    valid = METRICS[mode]
    if not config.metrics:
        return list(valid)
    wrong = [m for m in config.metrics if m not in valid]
    if wrong:
        raise CompareInputError(
            f"{config.source}: field 'compare_index': {', '.join(map(repr, wrong))} not a metric of "
            f"{path.name} ({mode.value} mode: {', '.join(valid)})"
        )
    return list(config.metrics)


def _rank_values(table: RankTable, apis: Sequence[str], metrics: list[str]) -> dict[str, dict[str, Any]]:
    """``{metric: {row name: value}}`` of one rank's rows that name an API of the config."""
    names = table.columns.get(NPU_NAME, [])
    first_row: dict[str, int] = {}
    for index, name in enumerate(names):
        if isinstance(name, str):
            first_row.setdefault(name, index)  # msprobe reads a repeated name's first row
    rows: dict[str, int] = {}
    for api in apis:
        matched = [name for name in first_row if f"{api}." in name]
        if not matched:
            logger.warning("%s not found in rank%d's compare result (%s)", api, table.rank, table.path.name)
        for name in matched:
            rows.setdefault(name, first_row[name])
    out: dict[str, dict[str, Any]] = {}
    for metric in metrics:
        column = table.columns[metric]
        values: dict[str, Any] = {}
        for name, row in rows.items():
            value = column[row]
            if isinstance(value, str) and value in NO_METRIC:
                value = f"NPU:{table.columns[NPU_MAX][row]}  Bench:{table.columns[BENCH_MAX][row]}"
            values[name] = value
        out[metric] = values
    return out


def merge_results(folder: Path, config: MergeConfig) -> list[tuple[str, list[str], list[list[Cell]]]]:
    """The merged sheets: ``(metric, header, rows)`` in the metrics' order."""
    mode: CompareMode | None = None
    metrics: list[str] = []
    merged: dict[int, dict[str, dict[str, Any]]] = {}
    for rank, path in result_files(folder):
        table = read_table(rank, path)
        if not table.columns or not table.columns.get(NPU_NAME):
            logger.warning("rank%d's compare result %s is empty, left out", rank, path.name)
            continue
        if table.mode is None or table.mode is CompareMode.MD5:
            what = "an md5 compare" if table.mode is CompareMode.MD5 else "no compare table msprobe merges"
            logger.warning("rank%d's compare result %s is %s, left out", rank, path.name, what)
            continue
        if mode is None:
            mode, metrics = table.mode, _metrics(config, table.mode, path)
        elif table.mode is not mode:
            logger.warning("rank%d's compare result %s is %s mode, the others %s: left out",
                           rank, path.name, table.mode.value, mode.value)  # fmt: skip
            continue
        merged[rank] = _rank_values(table, config.apis, metrics)
    if not merged:
        raise CompareInputError(f"{folder}: nothing to merge (no statistics or tensor compare result)")
    ranks = sorted(merged)
    sheets: list[tuple[str, list[str], list[list[Cell]]]] = []
    for metric in metrics:
        names = sorted({name for rank in ranks for name in merged[rank][metric]})
        header = [NPU_NAME, *(f"rank{rank}" for rank in ranks)]
        rows: list[list[Cell]] = [
            [name, *(merged[rank][metric].get(name) for rank in ranks)] for name in names
        ]
        sheets.append((metric, header, rows))
    return sheets


def write_merge(folder: Path, config: MergeConfig, out_dir: Path) -> Path:
    """Merge and write ``multi_ranks_compare_merge_{ts}.xlsx`` into ``out_dir``; its path."""
    from parity.shared.report.xlsx import write_sheets_xlsx

    sheets = merge_results(folder, config)
    path = Path(out_dir) / f"multi_ranks_compare_merge_{time.strftime('%Y%m%d%H%M%S')}.xlsx"
    return write_sheets_xlsx(sheets, path)
