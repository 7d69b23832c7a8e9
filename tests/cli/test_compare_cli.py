"""``parity compare`` end to end, through a subprocess: reports, exit codes and one-line errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import openpyxl
import torch
from parity.shared.compare.headers import CompareMode, full_header

from parity.progress import ProgressBar
from tests.factories import DumpBuilder


def run_cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "parity", "compare", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("parity compare: error: ")]
    assert len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def rng_array(seed: int, shape=(8, 4)) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def build_pair(
    root: Path, task: str, *, perturb: bool = True, ranks=(0,), bench_ranks=None
) -> tuple[Path, Path]:
    """A small model's dump on both sides; on the NPU side, ``Functional.linear.1.forward`` drifts."""
    for side, side_ranks in (("npu", ranks), ("bench", bench_ranks if bench_ranks is not None else ranks)):
        for rank in side_ranks:
            builder = DumpBuilder(task)
            x = rng_array(rank)
            w = rng_array(rank + 10, (4, 4))
            y = x @ w
            builder.api("Functional.linear.0.forward", inputs=[x, w], outputs=[y])
            z = y @ w
            if side == "npu" and perturb:
                z = z + np.float32(5.0) * np.abs(z)
            builder.api("Functional.linear.1.forward", inputs=[y, w], outputs=[z])
            builder.api("Torch.relu.0.forward", inputs=[z], outputs=[np.maximum(z, 0)])
            builder.write(root / side / "step0" / f"rank{rank}")
    return root / "npu" / "step0", root / "bench" / "step0"


def write_spec(path: Path, **doc: object) -> Path:
    path.write_text(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in doc.items()}))
    return path


def only(out: Path, pattern: str) -> Path:
    found = sorted(out.glob(pattern))
    assert len(found) == 1, (pattern, [p.name for p in out.iterdir()])
    return found[0]


def sheet_rows(path: Path) -> list[list[object]]:
    sheet = openpyxl.load_workbook(path, read_only=True)["Sheet"]  # msprobe -hl's sheet
    return [list(row) for row in sheet.iter_rows(values_only=True)]


def test_single_rank_statistics_writes_reports_and_prints_suspects(tmp_path):
    npu, bench = build_pair(tmp_path, "statistics")
    spec = write_spec(
        tmp_path / "compare.json",
        npu_path=npu / "rank0" / "dump.json",
        bench_path=bench / "rank0" / "dump.json",
    )
    out = tmp_path / "out"
    proc = run_cli("-i", spec, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    xlsx = only(out, "compare_result_[0-9]*.xlsx")
    advisor = only(out, "advisor_[0-9]*.txt")
    summary = json.loads(only(out, "compare_summary_*.json").read_text())
    assert len(xlsx.stem.rsplit("_", 1)[1]) == 14  # YYYYmmddHHMMSS
    rows = sheet_rows(xlsx)
    assert list(rows[0]) == full_header(CompareMode.STATISTICS, stack=False)
    assert rows[1][0] == "Functional.linear.0.forward.input.0"
    assert summary["kind"] == "single-rank" and summary["mode"] == "statistics"
    assert summary["files"] == {"xlsx": xlsx.name, "advisor": advisor.name}
    assert summary["rows"] == len(rows) - 1
    # The drifting API is the first suspect, printed and in the advisor file.
    assert "Functional.linear.1.forward" in proc.stdout
    assert str(xlsx) in proc.stdout and str(advisor) in proc.stdout
    text = advisor.read_text().splitlines()
    assert text[0].startswith("Line: ") and text[1].startswith("Suspect Nodes: ")
    assert text[2].startswith("Expert Advice: ")
    assert any("Functional.linear.1.forward" in line for line in text[4:])
    # The CLI prints the advisor file's own lines: the first divergence, then each suspect with its score,
    # evidence and Excel row.
    printed = [line.strip() for line in proc.stdout.splitlines()]
    first = next(line for line in printed if line.startswith("First divergence: "))
    assert "Functional.linear.1.forward (Excel row " in first and first in text
    ranked = next(line for line in printed if line.startswith("1. "))
    assert "(score " in ranked and "Excel row " in ranked and ranked in text


def test_tensor_mode_identical_dumps_pass_and_compare_only_skips_the_advisor(tmp_path):
    npu, bench = build_pair(tmp_path, "tensor", perturb=False)
    spec = write_spec(
        tmp_path / "compare.json",
        npu_path=npu / "rank0" / "dump.json",
        bench_path=bench / "rank0" / "dump.json",
        is_print_compare_log=False,
    )
    out = tmp_path / "out"
    proc = run_cli("--input-path", spec, "--output-path", out, "--compare_only")
    assert proc.returncode == 0, proc.stderr
    assert not list(out.glob("advisor_*"))
    rows = sheet_rows(only(out, "compare_result_*.xlsx"))
    header = list(rows[0])
    assert header == full_header(CompareMode.TENSOR, stack=False)
    accuracy = header.index("Accuracy Reached or Not")
    assert {row[accuracy] for row in rows[1:]} == {"Yes"}
    assert "no suspect" in proc.stdout


def test_tensor_mode_perturbed_output_is_found_with_stack_column(tmp_path):
    npu, bench = build_pair(tmp_path, "tensor")
    stack = npu / "rank0" / "stack.json"
    stack.write_text(
        json.dumps(
            {
                "0": [
                    ["Functional.linear.1.forward"],
                    ["File /w/train.py, line 12, in forward, \n y = self.fc(x)"],
                ]
            }
        )
    )
    spec = write_spec(
        tmp_path / "compare.json",
        npu_path=npu / "rank0" / "dump.json",
        bench_path=bench / "rank0" / "dump.json",
        stack_path=stack,
    )
    out = tmp_path / "out"
    proc = run_cli("-i", spec, "-o", out, "-s")
    assert proc.returncode == 0, proc.stderr
    rows = sheet_rows(only(out, "compare_result_*.xlsx"))
    assert list(rows[0]) == full_header(CompareMode.TENSOR, stack=True)
    assert "Functional.linear.1.forward" in proc.stdout and "train.py" in proc.stdout
    advisor = only(out, "advisor_*.txt").read_text()
    assert "Line: NA" not in advisor and "train.py" in advisor


def test_multi_rank_pairs_by_number_and_reports_one_sided_ranks(tmp_path):
    npu, bench = build_pair(tmp_path, "statistics", ranks=(0, 1), bench_ranks=(0, 2))
    spec = write_spec(tmp_path / "compare.json", npu_path=npu, bench_path=bench)
    out = tmp_path / "out"
    proc = run_cli("-i", spec, "-o", out)
    assert proc.returncode == 0, proc.stderr
    only(out, "compare_result_rank0_*.xlsx")
    only(out, "advisor_rank0_*.txt")
    assert not list(out.glob("compare_result_rank1_*")) and not list(out.glob("compare_result_rank2_*"))
    summary = json.loads(only(out, "compare_summary_*.json").read_text())
    assert summary["kind"] == "multi-rank"
    assert summary["compared_ranks"] == [0]
    assert summary["npu_only_ranks"] == [1] and summary["bench_only_ranks"] == [2]
    assert "rank 1: only in the NPU dump" in proc.stdout
    assert "rank 2: only in the bench dump" in proc.stdout


def test_rerun_replaces_same_named_files(tmp_path):
    npu, bench = build_pair(tmp_path, "statistics")
    spec = write_spec(
        tmp_path / "compare.json",
        npu_path=npu / "rank0" / "dump.json",
        bench_path=bench / "rank0" / "dump.json",
    )
    out = tmp_path / "out"
    out.mkdir()
    assert run_cli("-i", spec, "-o", out).returncode == 0
    assert run_cli("-i", spec, "-o", out).returncode == 0
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary left behind


# ---- bad inputs: exit 2, one line naming the problem, no traceback ----


def test_missing_compare_json(tmp_path):
    assert_one_line_error(
        run_cli("-i", tmp_path / "nope.json", "-o", tmp_path / "o"), "nope.json", "not found"
    )


def test_malformed_compare_json_names_line_and_column(tmp_path):
    spec = tmp_path / "compare.json"
    spec.write_text('{"npu_path": "a",\n "bench_path": }')
    assert_one_line_error(
        run_cli("-i", spec, "-o", tmp_path / "o"), "compare.json", "line 2 column 16", "malformed"
    )


def test_missing_dump_file(tmp_path):
    npu, bench = build_pair(tmp_path, "statistics")
    spec = write_spec(
        tmp_path / "compare.json",
        npu_path=npu / "rank9" / "dump.json",
        bench_path=bench / "rank0" / "dump.json",
    )
    assert_one_line_error(run_cli("-i", spec, "-o", tmp_path / "o"), "'npu_path'", "rank9", "does not exist")


def test_malformed_dump_json_names_the_file_line_and_column(tmp_path):
    npu, bench = build_pair(tmp_path, "statistics")
    broken = npu / "rank0" / "dump.json"
    broken.write_text('{"task": "statistics",\n "data": {')
    spec = write_spec(tmp_path / "compare.json", npu_path=broken, bench_path=bench / "rank0" / "dump.json")
    assert_one_line_error(run_cli("-i", spec, "-o", tmp_path / "o"), str(broken), "line 2", "malformed JSON")


def test_file_and_directory_mixed(tmp_path):
    npu, bench = build_pair(tmp_path, "statistics")
    spec = write_spec(tmp_path / "compare.json", npu_path=npu / "rank0" / "dump.json", bench_path=bench)
    assert_one_line_error(run_cli("-i", spec, "-o", tmp_path / "o"), "same type")


def test_tasks_that_differ(tmp_path):
    npu, _ = build_pair(tmp_path / "a", "tensor")
    _, bench = build_pair(tmp_path / "b", "statistics")
    spec = write_spec(
        tmp_path / "compare.json",
        npu_path=npu / "rank0" / "dump.json",
        bench_path=bench / "rank0" / "dump.json",
    )
    line = assert_one_line_error(run_cli("-i", spec, "-o", tmp_path / "o"))
    assert "task" in line and "tensor" in line and "statistics" in line


def test_output_path_that_is_a_file(tmp_path):
    npu, bench = build_pair(tmp_path, "statistics")
    spec = write_spec(
        tmp_path / "compare.json",
        npu_path=npu / "rank0" / "dump.json",
        bench_path=bench / "rank0" / "dump.json",
    )
    blocker = tmp_path / "out"
    blocker.write_text("not a directory")
    assert_one_line_error(run_cli("-i", spec, "-o", blocker), str(blocker), "is a file, expected a directory")


def test_step_directory_without_ranks(tmp_path):
    npu, bench = build_pair(tmp_path, "statistics")
    empty = tmp_path / "empty_step"
    empty.mkdir()
    spec = write_spec(tmp_path / "compare.json", npu_path=npu, bench_path=empty)
    assert_one_line_error(run_cli("-i", spec, "-o", tmp_path / "o"), "'bench_path'", "no rank* directory")


def test_missing_tensor_file_is_a_visible_row_diagnostic_not_fatal(tmp_path):
    npu, bench = build_pair(tmp_path, "tensor", perturb=False)
    missing = bench / "rank0" / "dump_tensor_data" / "Functional.linear.1.forward.output.0.pt"
    missing.unlink()
    spec = write_spec(
        tmp_path / "compare.json",
        npu_path=npu / "rank0" / "dump.json",
        bench_path=bench / "rank0" / "dump.json",
    )
    out = tmp_path / "out"
    proc = run_cli("-i", spec, "-o", out)
    assert proc.returncode == 0, proc.stderr
    rows = sheet_rows(only(out, "compare_result_*.xlsx"))
    header = list(rows[0])
    row = next(r for r in rows[1:] if r[0] == "Functional.linear.1.forward.output.0")
    assert row[header.index("Cosine")] == "unsupported"
    assert "Functional.linear.1.forward.output.0.pt" in str(row[header.index("Err_message")])
    assert "not found or read failed" in str(row[header.index("Err_message")])


class _Payload:
    """Unpickling this object would create ``marker``: the proof that a payload ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_pickle_payload_in_a_pt_file_is_refused_and_never_runs(tmp_path):
    npu, bench = build_pair(tmp_path, "tensor", perturb=False)
    marker = tmp_path / "PAYLOAD_RAN"
    evil = npu / "rank0" / "dump_tensor_data" / "Functional.linear.0.forward.output.0.pt"
    torch.save({"t": torch.ones(2), "x": _Payload(marker)}, evil)
    spec = write_spec(
        tmp_path / "compare.json",
        npu_path=npu / "rank0" / "dump.json",
        bench_path=bench / "rank0" / "dump.json",
    )
    out = tmp_path / "out"
    proc = run_cli("-i", spec, "-o", out)
    assert not marker.exists(), "the pickle payload ran"
    assert_one_line_error(proc, str(evil), "refused", "pickle")
    assert not list(out.glob("compare_result_*"))  # nothing half-published


def test_bad_workers_value(tmp_path):
    npu, bench = build_pair(tmp_path, "statistics")
    spec = write_spec(
        tmp_path / "compare.json",
        npu_path=npu / "rank0" / "dump.json",
        bench_path=bench / "rank0" / "dump.json",
    )
    assert_one_line_error(
        run_cli("-i", spec, "-o", tmp_path / "o", "-j", "0"), "--workers must be at least 1"
    )


# ---- the progress bar (in process) ----


def test_progress_bar_on_a_log_stream_prints_tens_of_percent_once():
    stream = io.StringIO()
    bar = ProgressBar("compare", stream=stream, min_interval=0.0, force=True)
    for done in range(0, 101):
        bar(done, 100)
    bar(100, 100)
    lines = stream.getvalue().splitlines()
    assert lines == [f"compare: {p}% ({p}/100)" for p in range(0, 100, 10)] + ["compare: 100% (100/100)"]


def test_progress_bar_stays_quiet_for_small_compares_off_a_terminal():
    stream = io.StringIO()
    bar = ProgressBar(stream=stream, min_interval=0.0)
    for done in range(11):
        bar(done, 10)
    bar.close()
    assert stream.getvalue() == ""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal_redraws_one_line_and_ends_it():
    stream = _Terminal()
    bar = ProgressBar("compare", stream=stream, min_interval=0.0, width=10)
    bar(5, 10)
    bar(10, 10)
    bar(10, 10)  # a repeated final call draws nothing more
    text = stream.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and text.count("\n") == 1
    assert "[#####.....]  50%  5/10" in text and "[##########] 100%  10/10" in text
    unfinished = _Terminal()
    bar = ProgressBar(stream=unfinished, min_interval=0.0)
    bar(1, 3)
    bar.close()
    assert unfinished.getvalue().endswith("\n")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_upload_progress_redraws_one_line_on_a_terminal_and_is_silent_when_quiet():
    from parity.client.upload import UploadProgress

    from parity.progress import TransferProgress

    stream = _Terminal()
    progress = TransferProgress("parity upload", stream=stream)
    sent = 0
    for done, was_sent in enumerate((False, True, True, True), start=1):
        sent += 1000 if was_sent else 0
        progress(UploadProgress(done, 4, done * 1000, 4000, sent, elapsed_s=0.5))
    progress.close()
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, redrawn in place, then ended
    assert "\rparity upload [" in text and "100%  4/4 files, 4.0 KB/4.0 KB, 6.0 KB/s" in text

    quiet = io.StringIO()
    silent = TransferProgress("parity upload", stream=quiet, quiet=True)
    silent(UploadProgress(1, 1, 10, 10, 10, elapsed_s=0.1))
    silent.close()
    assert quiet.getvalue() == ""


def test_a_rank_folder_given_for_a_step_folder_says_what_works(tmp_path: Path) -> None:
    for side in ("npu", "bench"):
        DumpBuilder("statistics").api("Torch.add.0.forward", [rng_array(0)], [rng_array(1)]).write(
            tmp_path / side / "step0" / "rank0")  # fmt: skip
    spec = tmp_path / "compare.json"
    spec.write_text(json.dumps({"npu_path": str(tmp_path / "npu/step0/rank0"),
                                "bench_path": str(tmp_path / "bench/step0/rank0")}))  # fmt: skip
    proc = run_cli("-i", spec, "-o", tmp_path / "out")
    assert_one_line_error(proc, "npu/step0/rank0: a rank folder (it holds dump.json), not a step folder: ",
                          "give ", "npu/step0/rank0/dump.json for this rank, or ", "npu/step0 for every rank")
    spec.write_text(json.dumps({"npu_path": str(tmp_path / "npu"), "bench_path": str(tmp_path / "bench")}))
    assert_one_line_error(run_cli("-i", spec, "-o", tmp_path / "out"),
                          "no rank* directory found (a dump root? give one of its step folders: step0)")
