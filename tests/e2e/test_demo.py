"""``make demo`` end to end: a server, two PrecisionDebugger runs uploading, a comparison, reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import openpyxl
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_runs_the_whole_flow(tmp_path: Path) -> None:
    out_dir = tmp_path / "demo-output"
    done = subprocess.run(
        [sys.executable, "-m", "parity.demo", "-o", str(out_dir)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report_line = [line for line in done.stdout.splitlines() if line.startswith("report: ")]
    assert len(report_line) == 1
    report = Path(report_line[0].removeprefix("report: "))
    assert report.parent == out_dir.resolve() and report.name.startswith("compare_result_")
    assert "Top suspects, by how far they stand above the background" in done.stdout  # the advisor's words
    # bf16 autocast first changes the output of the first linear layer, whose inputs still agree
    assert "1. [forward] Functional.linear.0.forward (score " in done.stdout
    rows = list(openpyxl.load_workbook(report, read_only=True).worksheets[0].iter_rows(values_only=True))
    assert len(rows) > 10 and any("Functional.gelu" in str(r[0]) for r in rows[1:])
    assert len(list(out_dir.glob("advisor_*.txt"))) == 1
