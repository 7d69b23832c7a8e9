"""The advisor file (msprobe's three lines, then the ranked suspects) and the JSON summary."""

from __future__ import annotations

import json
import logging

from parity.shared.compare.headers import CompareMode
from parity.shared.compare.result import Advice, CompareResult, CompareRow, RowStatus, Suspect
from parity.shared.report.advisor import advisor_lines, advisor_text, write_advisor
from parity.shared.report.summary import multi_rank_summary, rank_summary, single_rank_summary, write_summary

ALL_PASS = Advice(
    line=None, suspect_node=None, text="All data in comparison result meets the accuracy requirements."
)
FORWARD_ADVICE = "This is a forward API computation error. Check the computation implementation."


def result_with(advice: Advice, suspects: list[Suspect], rows: list[CompareRow] | None = None, rank=None):
    return CompareResult(
        mode=CompareMode.TENSOR,
        stack_mode=False,
        rows=rows or [],
        advice=advice,
        suspects=suspects,
        rank=rank,
    )


def row(api: str, status: RowStatus) -> CompareRow:
    return CompareRow(cells=[], api=api, status=status)


def test_all_pass_writes_msprobe_na_lines(tmp_path):
    path = write_advisor(result_with(ALL_PASS, []), tmp_path / "advisor_20260101000000.txt")
    lines = path.read_text().splitlines()
    assert lines[:3] == [
        "Line: NA",
        "Suspect Nodes: NA",
        "Expert Advice: All data in comparison result meets the accuracy requirements.",
    ]
    assert lines[3] == ""
    assert lines[4].startswith("Top suspects: none")


def test_failing_row_lines_then_ranked_suspects_with_stack():
    advice = Advice(line=7, suspect_node="Functional.linear.0.forward.output.0", text=FORWARD_ADVICE)
    suspects = [
        Suspect(
            1,
            "Functional.linear.0.forward",
            "forward",
            7,
            "output cosine 0.5 while inputs agree",
            stack="File /w/train.py, line 12, in forward, \n y = self.fc(x)",
        ),  # fmt: skip
        Suspect(
            2, "Functional.linear.0.backward", "backward", 21, "output MaxAbsErr 3.0\nrequires_grad differs"
        ),
    ]
    text = advisor_text(result_with(advice, suspects))
    lines = text.splitlines()
    assert lines[:3] == [
        "Line: 9",  # the Excel row of table row 7, as the suspects name it
        "Suspect Nodes: Functional.linear.0.forward.output.0",
        f"Expert Advice: {FORWARD_ADVICE}",
    ]
    assert lines[4].startswith("Top suspects")
    assert lines[5] == (
        "1. [forward] Functional.linear.0.forward (score 0.0, Excel row 9): "
        "output cosine 0.5 while inputs agree"
    )
    assert lines[6] == "   at File /w/train.py, line 12, in forward, y = self.fc(x)"
    assert lines[7] == (
        "2. [backward] Functional.linear.0.backward (score 0.0, Excel row 23): output MaxAbsErr 3.0 "
        "requires_grad differs"
    )
    assert len(lines) == 8 and text.endswith("\n")


def test_first_divergence_heads_the_suspects():
    advice = Advice(line=7, suspect_node="Functional.linear.0.forward.output.0", text=FORWARD_ADVICE)
    first = Suspect(1, "Functional.linear.0.forward", "forward", 7, "inputs identical", score=4.2,
                    excel_row=9, stack="File /w/model.py, line 3, in forward, \n y = self.fc(x)")  # fmt: skip
    result = result_with(advice, [first])
    result.first_divergence = first
    lines = advisor_text(result).splitlines()
    assert lines[4:7] == [
        "First divergence: [forward] Functional.linear.0.forward (Excel row 9)",
        "   at File /w/model.py, line 3, in forward, y = self.fc(x)",
        "",
    ]
    assert lines[8].startswith("1. [forward] Functional.linear.0.forward (score 4.2, Excel row 9)")


def test_line_zero_is_not_na():
    advice = Advice(line=0, suspect_node="Torch.add.0.forward.input.0", text="x")
    assert advisor_lines(result_with(advice, []))[0] == "Line: 2"  # the first data row, in Excel


def test_write_advisor_logs_the_three_lines(tmp_path, caplog):
    advice = Advice(line=2, suspect_node="Torch.add.0.forward.output.0", text=FORWARD_ADVICE)
    with caplog.at_level(logging.INFO, logger="parity.shared.report.advisor"):
        write_advisor(result_with(advice, [], rank=3), tmp_path / "advisor_rank3_x.txt")
    messages = [r.getMessage() for r in caplog.records]
    assert "The summary of the expert advice is as follows (rank 3):" in messages
    assert "Suspect Nodes: Torch.add.0.forward.output.0" in messages


def test_single_rank_summary_counts_and_files(tmp_path):
    statuses = [RowStatus.PASS, RowStatus.FAIL, RowStatus.UNMATCHED, RowStatus.BENCH_ONLY]
    rows = [row(api, status) for api, status in zip("abbc", statuses, strict=True)]
    rows = [row(f"Torch.{r.api}.0.forward", r.status) for r in rows]
    suspect = Suspect(1, "Torch.b.0.forward", "forward", 1, "output differs")
    result = result_with(ALL_PASS, [suspect], rows)
    doc = single_rank_summary(rank_summary(result, {"xlsx": "r.xlsx", "advisor": None}))
    path = write_summary(doc, tmp_path / "compare_summary.json")
    back = json.loads(path.read_text())
    assert back["kind"] == "single-rank" and back["mode"] == "tensor" and back["rows"] == 4
    assert back["status_counts"]["fail"] == 1 and back["status_counts"]["bench-only"] == 1
    assert back["failing_apis"] == ["Torch.b.0.forward"]
    assert back["files"] == {"xlsx": "r.xlsx", "advisor": None}
    assert back["suspects"][0]["api"] == "Torch.b.0.forward"


def test_multi_rank_summary_lists_one_sided_ranks(tmp_path):
    r0 = result_with(ALL_PASS, [], [row("Torch.a.0.forward", RowStatus.PASS)], rank=0)
    r1 = result_with(ALL_PASS, [], [row("Torch.a.0.forward", RowStatus.FAIL)], rank=1)
    doc = multi_rank_summary(
        [rank_summary(r0, {"xlsx": "a"}), rank_summary(r1, {"xlsx": "b"})], npu_only_ranks=[2],
        bench_only_ranks=[5],
    )
    back = json.loads(write_summary(doc, tmp_path / "s.json").read_text())
    assert back["compared_ranks"] == [0, 1]
    assert back["npu_only_ranks"] == [2] and back["bench_only_ranks"] == [5]
    assert back["status_counts"]["pass"] == 1 and back["status_counts"]["fail"] == 1
    assert [r["files"]["xlsx"] for r in back["ranks"]] == ["a", "b"]


def test_summary_is_strict_json_even_with_a_nan(tmp_path):
    path = write_summary({"x": float("nan"), "y": [float("inf")]}, tmp_path / "s.json")
    assert json.loads(path.read_text()) == {"x": "nan", "y": ["inf"]}
