"""How fast the compare table reaches an xlsx file: the writers side by side, then the whole CLI run.

1. Writers, on a synthetic statistics-mode table (default 60,000 rows of 29 cells, msprobe's 27 and Parity's
   two, ~2% red and ~3% yellow rows, formula-like and non-finite cells included):
   ``write_xlsx(engine="rust")`` (rustpy-xlsxwriter), ``write_xlsx(engine="xlsxwriter")`` (constant-memory
   mode) and openpyxl's write-only mode doing the same job (fills, text cells); pyexcelerate when installed.
2. The whole ``parity compare`` command (a subprocess, interpreter start included) on a statistics dump pair
   of 20,000 APIs (60,000 rows a side), against msprobe's ~500 rows/s measured on this kind of machine
   (compare.md §10: 16,750 rows in 30-45 s).

Figures are medians over ``--repeat`` runs; on a shared machine read them as ratios.

    .venv/bin/python benchmarks/bench_xlsx.py [--rows 60000] [--apis 20000] [--repeat 3] [--skip-cli]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from parity.shared.compare.headers import CompareMode, full_header
from parity.shared.compare.result import Advice, CompareResult, CompareRow, Highlight, RowStatus
from parity.shared.report.xlsx import excel_value, write_xlsx

MSPROBE_ROWS_PER_S = 500.0


def synthetic_result(n_rows: int, seed: int = 0) -> CompareResult:
    """A statistics-mode table shaped like a real one (names, dtypes, shapes, numbers, ``x%`` strings)."""
    rnd = random.Random(seed)
    header = full_header(CompareMode.STATISTICS, stack=False)
    rows: list[CompareRow] = []
    for i in range(n_rows):
        api = f"Functional.linear.{i // 3}.forward"
        name = f"{api}.{'input' if i % 3 < 2 else 'output'}.{i % 3 % 2}"
        npu = [rnd.gauss(0, 1) for _ in range(4)]
        bench = [x + rnd.gauss(0, 1e-3) for x in npu]
        diffs = [a - b for a, b in zip(npu, bench, strict=True)]
        rel = [f"{abs(d / b) * 100}%" for d, b in zip(diffs, bench, strict=True)]
        status, fill = RowStatus.PASS, None
        if i % 50 == 7:
            status, fill = RowStatus.FAIL, Highlight.RED
        elif i % 33 == 5:
            status, fill = RowStatus.WARNING, Highlight.YELLOW
        message = "-inf in NPU max" if i % 997 == 3 else ""
        if i % 1000 == 11:
            diffs[0] = math.inf
        cells = [
            name,
            name,
            "torch.float32",
            "torch.float32",
            "[4096, 4096]",
            "[4096, 4096]",
            "False",
            "False",
            *diffs,
            *rel,
            *npu,
            *bench,
            True,
            "",
            message,
            status.value,
            api,
        ]
        assert len(cells) == len(header)
        rows.append(CompareRow(cells=cells, api=api, status=status, highlight=fill))
    advice = Advice(line=None, suspect_node=None, text="")
    return CompareResult(mode=CompareMode.STATISTICS, stack_mode=False, rows=rows, advice=advice)


def write_openpyxl(result: CompareResult, path: Path) -> None:
    """openpyxl's write-only mode, doing what ``write_xlsx`` does (fills, text cells, quote prefix)."""
    import openpyxl
    from openpyxl.cell import WriteOnlyCell
    from openpyxl.styles import PatternFill

    workbook = openpyxl.Workbook(write_only=True)
    sheet = workbook.create_sheet("Sheet1")
    sheet.append(result.header)
    fills = {
        Highlight.RED: PatternFill("solid", fgColor="FFFF0000"),
        Highlight.YELLOW: PatternFill("solid", fgColor="FFFFFF00"),
    }
    for row in result.rows:
        values = [excel_value(c) for c in row.cells]
        if row.highlight is None and not any(quote for _, quote in values):
            sheet.append([v for v, _ in values])
            continue
        cells = []
        for value, quote in values:
            cell = WriteOnlyCell(sheet, value=value)
            if isinstance(value, str):
                cell.data_type = "s"  # never a formula, whatever the text starts with
            if row.highlight is not None:
                cell.fill = fills[row.highlight]
            if quote:
                cell.quotePrefix = True
            cells.append(cell)
        sheet.append(cells)
    workbook.save(path)


def write_pyexcelerate(result: CompareResult, path: Path) -> None:
    """pyexcelerate (pure Python, bulk writes) with row fills, for reference."""
    from pyexcelerate import Color, Fill, Style, Workbook

    workbook = Workbook()
    data = [result.header, *([excel_value(c)[0] for c in row.cells] for row in result.rows)]
    sheet = workbook.new_sheet("Sheet1", data=data)
    styles = {
        Highlight.RED: Style(fill=Fill(background=Color(255, 0, 0))),
        Highlight.YELLOW: Style(fill=Fill(background=Color(255, 255, 0))),
    }
    for index, row in enumerate(result.rows, start=2):
        if row.highlight is not None:
            sheet.set_row_style(index, styles[row.highlight])
    workbook.save(str(path))


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_writers(n_rows: int, repeat: int, work: Path) -> None:
    result = synthetic_result(n_rows)
    cells = n_rows * len(result.header)
    writers: list[tuple[str, Callable[[Path], object]]] = [
        ("rustpy-xlsxwriter (parity default)", lambda p: write_xlsx(result, p, engine="rust")),
        ("xlsxwriter constant_memory", lambda p: write_xlsx(result, p, engine="xlsxwriter")),
        ("openpyxl write-only", lambda p: write_openpyxl(result, p)),
    ]
    try:
        import pyexcelerate  # noqa: F401

        writers.append(("pyexcelerate", lambda p: write_pyexcelerate(result, p)))
    except ImportError:
        pass
    print(f"xlsx writers: {n_rows:,} rows x {len(result.header)} cells ({cells:,} cells), median of {repeat}")
    baseline = None
    for name, fn in writers:
        path = work / f"{name.split()[0]}.xlsx"
        seconds = median_seconds(functools.partial(fn, path), repeat)
        baseline = baseline or seconds
        print(
            f"  {name:38s} {seconds:7.2f} s  {n_rows / seconds:10,.0f} rows/s  "
            f"{path.stat().st_size / 1e6:6.1f} MB  x{seconds / baseline:.2f} of the default"
        )


def leaf(rnd: random.Random, scale: float) -> dict[str, object]:
    values = [rnd.gauss(0, 1) * scale for _ in range(3)]
    return {
        "type": "torch.Tensor",
        "dtype": "torch.float32",
        "shape": [1024, 1024],
        "Max": max(values),
        "Min": min(values),
        "Mean": sum(values) / 3,
        "Norm": math.sqrt(sum(v * v for v in values)),
        "requires_grad": False,
    }


def statistics_pair(root: Path, n_apis: int) -> Path:
    """Two statistics dumps of ``n_apis`` forward APIs (2 inputs, 1 output each); returns compare.json."""
    for side, scale in (("npu", 1.0), ("bench", 1.0005)):
        rnd = random.Random(42)
        data = {
            f"Functional.linear.{i}.forward": {
                "input_args": [leaf(rnd, 1.0), leaf(rnd, 1.0)],
                "input_kwargs": {},
                "output": [leaf(rnd, scale if i % 100 else 3.0 * scale)],
            }
            for i in range(n_apis)
        }
        rank_dir = root / side / "step0" / "rank0"
        rank_dir.mkdir(parents=True)
        doc = {
            "task": "statistics",
            "level": "L1",
            "framework": "pytorch",
            "dump_data_dir": None,
            "data": data,
        }
        (rank_dir / "dump.json").write_text(json.dumps(doc))
    spec = root / "compare.json"
    spec.write_text(
        json.dumps(
            {
                "npu_path": str(root / "npu/step0/rank0/dump.json"),
                "bench_path": str(root / "bench/step0/rank0/dump.json"),
            }
        )
    )
    return spec


def bench_cli(n_apis: int, repeat: int, work: Path) -> None:
    spec = statistics_pair(work / "dumps", n_apis)
    rows = 3 * n_apis
    out = work / "out"
    cmd = [sys.executable, "-m", "parity", "compare", "-i", str(spec), "-o", str(out), "--no-progress"]
    seconds = median_seconds(lambda: subprocess.run(cmd, check=True, capture_output=True), repeat)
    print(
        f"parity compare, statistics mode, {n_apis:,} APIs ({rows:,} rows a side) to xlsx+advisor+summary, "
        f"median of {repeat}:"
    )
    print(
        f"  {seconds:7.2f} s  {rows / seconds:10,.0f} rows/s  = {rows / seconds / MSPROBE_ROWS_PER_S:.1f}x "
        f"msprobe's ~{MSPROBE_ROWS_PER_S:.0f} rows/s (target >= 10x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=60_000, help="rows of the writer benchmark")
    parser.add_argument("--apis", type=int, default=20_000, help="APIs of the CLI benchmark (3 rows each)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-cli", action="store_true", help="only the writers")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="parity-bench-xlsx-") as tmp:
        work = Path(tmp)
        bench_writers(args.rows, args.repeat, work)
        if not args.skip_cli:
            bench_cli(args.apis, args.repeat, work)


if __name__ == "__main__":
    main()
