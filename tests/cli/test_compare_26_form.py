"""msprobe 26's compare form: ``parity compare -tp -gp [-o] [--xlsx] [-fm] [-dm] [-cm] [-da]``.

CSV by default with 26's columns (``Result`` for tensor mode's ``Accuracy Reached or Not``, ``Err_message`` a
JSON list), ``--xlsx`` the same table as a workbook, ``-da`` 26's ``diff_analyze_{ts}.json``, step folders
one CSV per rank, and ``-cm`` msprobe 26's module mapping over the alignment.
"""

from __future__ import annotations

import json

import numpy as np
import openpyxl
import pytest
from parity.shared.compare.headers import PARITY_EXTRA, CompareMode
from parity.shared.report.msprobe26 import header_26, messages, read_csv_26

from tests.cli.test_compare_cli import assert_one_line_error, build_pair, only, rng_array, run_cli
from tests.factories import DumpBuilder


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("form26"), "statistics", ranks=(0, 1))


def test_one_rank_writes_26s_csv_and_diff_analyze(pair, tmp_path):
    npu, bench = pair
    proc = run_cli("-tp", npu / "rank0" / "dump.json", "-gp", bench / "rank0" / "dump.json", "-o", tmp_path,
                   "-da", "--no-progress")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "note" not in proc.stderr  # -da acts in this form: no "always on" note
    header, rows = read_csv_26(only(tmp_path, "compare_result_*.csv"))
    assert header == [*header_26(CompareMode.STATISTICS, stack=False), *PARITY_EXTRA]
    assert not list(tmp_path.glob("*.xlsx"))
    by_name = {r["NPU Name"]: r for r in rows}
    drifted = by_name["Functional.linear.1.forward.output.0"]
    assert drifted["Result"] == "error" and json.loads(drifted["Err_message"])  # a list of messages
    assert by_name["Functional.linear.0.forward.input.0"]["Result"] == "pass"
    assert by_name["Functional.linear.0.forward.input.0"]["Err_message"] == "[]"
    doc = json.loads(only(tmp_path, "diff_analyze_*.json").read_text())
    (node,) = doc["rank_0"]
    assert node["op_name"] == "Functional.linear.1.forward"
    assert [i["NPU Name"] for i in node["data_info"]["output"]] == ["Functional.linear.1.forward.output.0"]


def test_xlsx_and_step_folders_write_one_table_per_rank(pair, tmp_path):
    npu, bench = pair
    proc = run_cli("-tp", npu, "-gp", bench, "-o", tmp_path, "--xlsx", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        sheet = openpyxl.load_workbook(only(tmp_path, f"compare_result_rank{rank}_*.xlsx")).active
        assert [c.value for c in sheet[1]][:27] == header_26(CompareMode.STATISTICS, stack=False)
    assert not list(tmp_path.glob("*.csv"))


def test_refusals_name_the_flag(pair, tmp_path):
    npu, bench = pair
    one = npu / "rank0" / "dump.json"
    assert_one_line_error(run_cli("-tp", one, "-o", tmp_path), "-gp is required")
    assert_one_line_error(run_cli("-tp", one, "-gp", one, "-m", "torchair"), "-m torchair", "not supported")
    assert_one_line_error(run_cli("-tp", one, "-gp", one, "--consistent_check"), "--consistent_check")
    assert_one_line_error(run_cli("-i", tmp_path / "c.json", "-tp", one, "-gp", one), "-i cannot be combined")


def test_messages_split_8_3_3s_appended_text():
    assert messages("No bench data matched.NPU does not have data file.") == [
        "No bench data matched.", "NPU does not have data file."]  # fmt: skip
    assert messages("Need double check api accuracy. \nNorm relative error grew.") == [
        "Need double check api accuracy.", "Norm relative error grew."]  # fmt: skip
    assert messages("") == [] and messages(None) == []


def test_module_mapping_pairs_a_renamed_module_and_names_an_unused_entry(tmp_path):
    x, w = rng_array(1), rng_array(2, (4, 4))
    names = (("npu", "MindSpeedTELayerNormColumnParallelLinear"),
             ("bench", "TELayerNormColumnParallelLinear"))
    for side, cls in names:
        builder = DumpBuilder("statistics")
        builder.api(f"Module.layers.0.qkv.{cls}.forward.0", inputs=[x], outputs=[x @ w])
        builder.api("Torch.relu.0.forward", inputs=[x @ w], outputs=[np.maximum(x @ w, 0)])
        builder.api(f"Module.layers.1.qkv.{cls}.forward.0", inputs=[x], outputs=[x @ w + 1])
        builder.write(tmp_path / side)
    cm = tmp_path / "cm.yaml"
    cm.write_text("MindSpeedTELayerNormColumnParallelLinear: TELayerNormColumnParallelLinear\n")
    npu, bench = tmp_path / "npu" / "dump.json", tmp_path / "bench" / "dump.json"
    proc = run_cli("-tp", npu, "-gp", bench, "-o", tmp_path / "out", "-cm", cm, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    _, rows = read_csv_26(only(tmp_path / "out", "compare_result_*.csv"))
    modules = [r for r in rows if r["NPU Name"].startswith("Module.")]
    assert len(modules) == 4
    for row in modules:
        assert row["Parity Pairing"] == "mapped"
        assert row["Bench Name"] == row["NPU Name"].replace("MindSpeedTE", "TE")
    cm.write_text("Attention: CoreAttention\n")
    proc = run_cli("-tp", npu, "-gp", bench, "-o", tmp_path / "out", "-cm", cm, "--no-progress")
    assert_one_line_error(proc, str(cm), "'Attention: CoreAttention'", "no module")
