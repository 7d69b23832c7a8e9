"""Missing tensor files: a row diagnostic (as msprobe), a count in the summary and one warning line at the
end; a side whose ``dump_tensor_data`` is missing or not a directory is an error naming it (exit 2)."""

from __future__ import annotations

import json
import shutil

import openpyxl

from tests.cli.test_compare_cli import assert_one_line_error, build_pair, only, run_cli, write_spec


def tensor_spec(tmp_path, multi_rank: bool = False):
    npu, bench = build_pair(tmp_path, "tensor", ranks=(0, 1) if multi_rank else (0,))
    if multi_rank:
        return npu, bench, write_spec(tmp_path / "compare.json", npu_path=npu, bench_path=bench)
    spec = write_spec(tmp_path / "compare.json", npu_path=npu / "rank0" / "dump.json",
                      bench_path=bench / "rank0" / "dump.json")  # fmt: skip
    return npu, bench, spec


def warnings(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("parity compare: warning: ")]


def test_missing_files_are_row_diagnostics_a_count_and_one_warning(tmp_path):
    npu, bench, spec = tensor_spec(tmp_path)
    gone = [npu / "rank0" / "dump_tensor_data" / "Functional.linear.1.forward.output.0.pt",
            bench / "rank0" / "dump_tensor_data" / "Torch.relu.0.forward.input.0.pt"]  # fmt: skip
    for path in gone:
        path.unlink()
    out = tmp_path / "out"
    proc = run_cli("-i", spec, "-o", out, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert warnings(proc) == [
        "parity compare: warning: 2 tensor files missing or unreadable (their rows say so in Err_message), "
        f"the first: {gone[0]}"
    ]
    assert proc.stderr.rstrip().endswith(str(gone[0]))  # the last line of the run
    summary = json.loads(only(out, "compare_summary_*.json").read_text())
    assert summary["missing_tensor_files"] == {"count": 2, "first": str(gone[0])}
    sheet = openpyxl.load_workbook(only(out, "compare_result_*.xlsx"), read_only=True)["Sheet"]
    rows = [list(r) for r in sheet.iter_rows(values_only=True)]
    msg = rows[0].index("Err_message")
    by_name = {r[0]: r for r in rows[1:]}
    for name in ("Functional.linear.1.forward.output.0", "Torch.relu.0.forward.input.0"):
        assert by_name[name][msg] == f"Dump file: {name}.pt not found or read failed."
        assert by_name[name][rows[0].index("Cosine")] == "unsupported"


def test_no_missing_file_no_warning_and_a_zero_count(tmp_path):
    _, _, spec = tensor_spec(tmp_path)
    proc = run_cli("-i", spec, "-o", tmp_path / "out", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert warnings(proc) == []
    summary = json.loads(only(tmp_path / "out", "compare_summary_*.json").read_text())
    assert summary["missing_tensor_files"] == {"count": 0, "first": None}


def test_multi_rank_summary_adds_up_the_ranks(tmp_path):
    npu, _, spec = tensor_spec(tmp_path, multi_rank=True)
    first = npu / "rank0" / "dump_tensor_data" / "Torch.relu.0.forward.output.0.pt"
    first.unlink()
    (npu / "rank1" / "dump_tensor_data" / "Torch.relu.0.forward.output.0.pt").unlink()
    proc = run_cli("-i", spec, "-o", tmp_path / "out", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert len(warnings(proc)) == 1 and "2 tensor files missing or unreadable" in warnings(proc)[0]
    summary = json.loads(only(tmp_path / "out", "compare_summary_*.json").read_text())
    assert summary["missing_tensor_files"] == {"count": 2, "first": str(first)}
    assert [r["missing_tensor_files"]["count"] for r in summary["ranks"]] == [1, 1]


def test_tensor_directory_missing_is_an_error_naming_it(tmp_path):
    npu, _, spec = tensor_spec(tmp_path)
    tensors = npu / "rank0" / "dump_tensor_data"
    shutil.rmtree(tensors)
    proc = run_cli("-i", spec, "-o", tmp_path / "out")
    assert_one_line_error(proc, str(tensors), "does not exist", "NPU dump")
    assert len(proc.stderr.splitlines()) == 1
    assert not list((tmp_path / "out").glob("compare_result_*"))


def test_tensor_directory_that_is_a_file_is_an_error_naming_it(tmp_path):
    _, bench, spec = tensor_spec(tmp_path)
    tensors = bench / "rank0" / "dump_tensor_data"
    shutil.rmtree(tensors)
    tensors.write_text("not a directory")
    proc = run_cli("-i", spec, "-o", tmp_path / "out")
    assert_one_line_error(proc, str(tensors), "is not a directory", "bench dump")
    assert len(proc.stderr.splitlines()) == 1
