"""msprobe 8.3.3's command-line habits: every compare flag accepted, ``-f pytorch``, ``parity --version``."""

from __future__ import annotations

import subprocess
import sys

import openpyxl
import pytest

from parity import MSPROBE_COMPAT, __version__
from tests.cli.test_compare_cli import assert_one_line_error, build_pair, only, run_cli, write_spec


def parity(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "parity", *args], capture_output=True, text=True, timeout=240
    )


def test_version_names_parity_and_the_msprobe_release_it_follows():
    proc = parity("--version")
    assert proc.returncode == 0, proc.stderr
    expected = f"parity {__version__} (dumps and compare reports in msprobe {MSPROBE_COMPAT}'s layout)"
    assert proc.stdout.strip() == expected


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    root = tmp_path_factory.mktemp("flags")
    npu, bench = build_pair(root, "statistics")
    return write_spec(root / "compare.json", npu_path=npu / "rank0" / "dump.json",
                      bench_path=bench / "rank0" / "dump.json")  # fmt: skip


def notes(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("parity compare: note: ")]


def test_highlight_and_diff_analyze_are_accepted_with_one_note_each(spec, tmp_path):
    proc = run_cli("-i", spec, "-o", tmp_path, "-hl", "-da", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert notes(proc) == [
        "parity compare: note: -hl: row highlighting is always on in Parity",
        "parity compare: note: -da: first-divergence analysis is always on in Parity "
        "(the suspects printed below)",
    ]
    sheet = openpyxl.load_workbook(only(tmp_path, "compare_result_*.xlsx"))["Sheet"]
    fills = {sheet.cell(r, 1).fill.fgColor.rgb for r in range(2, sheet.max_row + 1)}
    assert "FFFF0000" in fills  # the perturbed linear is painted red, as msprobe -hl paints it


def test_long_forms_and_mindspore_mappings_are_accepted(spec, tmp_path):
    flags = ["--highlight", "--diff_analyze", "-cm", "-am", "map.yaml", "--layer_mapping", "--compare_only"]
    proc = run_cli("--input_path", spec, "--output_path", tmp_path, *flags, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert [n.split(": ")[2].split()[0] for n in notes(proc)] == ["-hl", "-da", "-cm", "-am", "-lm"]
    assert not list(tmp_path.glob("advisor_*.txt"))  # -c still acts


def test_no_highlight_wins_over_highlight_and_says_so(spec, tmp_path):
    proc = run_cli("-i", spec, "-o", tmp_path, "-hl", "--no-highlight", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert notes(proc) == [
        "parity compare: note: -hl: row highlighting is always on in Parity; --no-highlight wins"
    ]
    sheet = openpyxl.load_workbook(only(tmp_path, "compare_result_*.xlsx"))["Sheet1"]
    assert {sheet.cell(r, 1).fill.fgColor.rgb for r in range(2, sheet.max_row + 1)} == {"00000000"}


def test_data_mapping_pairs_the_rows_it_names(spec, tmp_path):
    (tmp_path / "map.yaml").write_text(
        "Functional.linear.0.forward.output.0: Functional.linear.0.forward.input.0\n")
    proc = run_cli("-i", spec, "-o", tmp_path / "out", "-dm", tmp_path / "map.yaml", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    sheet = openpyxl.load_workbook(only(tmp_path / "out", "compare_result_*.xlsx"))["Sheet"]
    header = [c.value for c in sheet[1]]
    rows = {r[0]: r for r in sheet.iter_rows(min_row=2, values_only=True)}
    mapped = rows["Functional.linear.0.forward.output.0"]
    assert mapped[header.index("Bench Name")] == "Functional.linear.0.forward.input.0"
    assert mapped[header.index("Parity Pairing")] == "mapped"


@pytest.mark.parametrize(
    ("text", "extra", "words"),
    [
        ("a: [b\n", [], ("map.yaml", "not valid YAML at line 2")),
        ("Torch.nope.0.forward.output.0: x\n", [], ("map.yaml", "entry 'Torch.nope.0.forward.output.0: x'",
                                                    "is no row or call of the NPU")),
        ("a: b\n", ["-f"], ("-dm", "cannot be combined with -f")),
        ("a: &a [x, x, x, x, x, x, x, x, x, x]\n"  # issue 37: aliases of aliases, neither built nor echoed
         + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n"
           for p, c in zip("abcdefgh", "bcdefghi", strict=True)),
         [], ("map.yaml", "expands to more than 1,000,000 values")),
    ],
)
def test_bad_data_mappings_are_one_line_errors(spec, tmp_path, text, extra, words):
    (tmp_path / "map.yaml").write_text(text)
    proc = run_cli("-i", spec, "-o", tmp_path / "out", "-dm", tmp_path / "map.yaml", *extra, "--no-progress")
    assert_one_line_error(proc, *words)


def test_output_flag_without_a_value_means_msprobe_default(spec, tmp_path):
    proc = run_cli("-i", spec, "-o", "--no-progress", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    only(tmp_path / "output", "compare_result_*.xlsx")


def test_framework_before_the_command_as_msprobe_spells_it(spec, tmp_path):
    proc = parity("-f", "pytorch", "compare", "-i", str(spec), "-o", str(tmp_path), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    only(tmp_path, "compare_result_*.xlsx")
    proc = parity("--framework", "mindspore", "compare", "-i", str(spec), "-o", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "parity: error: -f mindspore: Parity reads PyTorch dumps only (use -f pytorch)"
    )


def test_data_mapping_takes_one_rank(tmp_path):
    npu, bench = build_pair(tmp_path, "statistics", ranks=(0, 1))
    spec = write_spec(tmp_path / "compare.json", npu_path=npu, bench_path=bench)
    (tmp_path / "map.yaml").write_text("a: b\n")
    proc = run_cli("-i", spec, "-o", tmp_path / "out", "-dm", tmp_path / "map.yaml", "--no-progress")
    assert_one_line_error(proc, "-dm", "names the rows of one rank", "step directories")
    assert not (tmp_path / "out").exists()
