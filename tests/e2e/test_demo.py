"""``make demo`` end to end: a server, two PrecisionDebugger runs uploading, a comparison, reports."""

from __future__ import annotations

import json
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
    # bf16 autocast: every matmul-class call writes bfloat16 where the bench writes float32 (the first from
    # identical inputs, the others on its bfloat16 results), and none differs beyond bfloat16's rounding: one
    # systematic finding, no call named (issue 34; before issue 22 the first linear layer was named, its bf16
    # rounding read as a fault), and the float64 replay finds no kernel wrong.
    assert "Systematic: the target computes under bfloat16 autocast" in done.stdout
    assert "no single call stands out" in done.stdout
    assert "Top suspects: none (no API call's outputs stand out" in done.stdout
    advisor = next(out_dir.glob("advisor_*.txt")).read_text()
    assert "Suspect Nodes: NA" in advisor
    assert "Systematic: the target computes under bfloat16 autocast" in advisor
    summary = json.loads(next(out_dir.glob("compare_summary_*.json")).read_text())
    (rank,) = summary["ranks"]
    replay = rank["replay"]
    assert replay["replayed"] >= 1 and all(v["verdict"] != "target" for v in replay["verdicts"])
    rows = list(openpyxl.load_workbook(report, read_only=True).worksheets[0].iter_rows(values_only=True))
    assert len(rows) > 10 and any("Functional.gelu" in str(r[0]) for r in rows[1:])
    assert len(list(out_dir.glob("advisor_*.txt"))) == 1
    # It ends with what to open and where the parity command is; the server it stopped is never linked.
    assert "http://" not in done.stdout, done.stdout
    assert f"next: the parity command is {Path(sys.executable).with_name('parity')}" in done.stdout
    assert "next: the server is stopped; python -m parity.demo --keep-server (make demo)" in done.stdout
    # Every file it saved reads like the others (the summary was 0600, the reports 0644).
    modes = {p.name: p.stat().st_mode & 0o777 for p in out_dir.iterdir()}
    assert len(set(modes.values())) == 1, modes
    # statistics first, then only the suspects in tensor mode: the plan's re-dump names the faulty GELU, and
    # its float64 replay blames the target's kernel
    plan = json.loads((out_dir / "plan_config.json").read_text())
    assert plan["task"] == "tensor" and "Functional.gelu.0.forward" in plan["tensor"]["list"]
    gelu = "Functional.gelu.0.forward"
    assert f"top suspect {gelu}; float64 replay: {gelu}: target" in done.stdout
