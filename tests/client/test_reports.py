"""``parity compare-runs``' printed verdict (``client.reports.summary_lines``): the advisor file's own lines
(one formatter, ``shared.report.advisor.suspect_lines``), each suspect naming its rank."""

from __future__ import annotations

from typing import Any

from parity.client.reports import report_names, saved_files, summary_lines
from parity.shared.compare.result import Suspect
from parity.shared.contract import ComparisonPublic
from parity.shared.report.advisor import suspect_lines


def suspect(rank: int, api: str, compare_rank: int, **extra: Any) -> dict[str, Any]:
    reason = "output cosine 0.5\nwhile inputs agree"
    return {"rank": rank, "api": api, "direction": "forward", "row_index": 4, "reason": reason, "stack": None,
            "compare_rank": compare_rank, "score": 2.25, **extra}  # fmt: skip


def comparison(suspects: list[dict[str, Any]], first: dict[str, Any] | None = None) -> ComparisonPublic:
    summary = {"rows": 12, "failing_rows": 3, "failing_apis": ["Functional.gelu.0.forward"], "ranks": [0, 1],
               "mode": "tensor", "top_suspects": suspects, "first_divergence": first}  # fmt: skip
    return ComparisonPublic.model_validate({
        "id": "c1", "status": "succeeded", "error": None, "progress": 1.0, "target_run": "a",
        "bench_run": "b", "step": 0, "ranks": None, "options": {}, "created_at": "2026-12-03T00:00:00Z",
        "started_at": None, "finished_at": None, "summary": summary,
    })  # fmt: skip


def test_the_suspects_are_the_advisor_files_lines_with_their_rank() -> None:
    gelu = suspect(1, "Functional.gelu.0.forward", 1, excel_row=6, stack="File train.py, line 12, in f,\n y")
    add = suspect(2, "Tensor.add.0.forward", 0)
    lines = summary_lines(comparison([gelu, add], first=gelu))
    assert lines == [
        "comparison c1: 12 rows, 3 failing, 1 failing APIs (mode tensor)",
        "First divergence: [forward] Functional.gelu.0.forward (rank 1, Excel row 6)",
        "   at File train.py, line 12, in f, y",
        "",
        "Top suspects, by how far they stand above the background (score: decades above):",
        "1. [forward] Functional.gelu.0.forward (score 2.2, rank 1, Excel row 6): output cosine 0.5 while "
        "inputs agree",
        "   at File train.py, line 12, in f, y",
        "2. [forward] Tensor.add.0.forward (score 2.2, rank 0, Excel row 6): output cosine 0.5 while inputs "
        "agree",
    ]
    # the same words as the engine's advisor file for the same suspects (there without the rank)
    engine = [Suspect(s["rank"], s["api"], s["direction"], s["row_index"], s["reason"], stack=s["stack"],
                      score=s["score"], excel_row=s.get("excel_row")) for s in (gelu, add)]  # fmt: skip
    assert [line.replace("rank 1, ", "").replace("rank 0, ", "") for line in lines[1:]] == suspect_lines(
        engine, engine[0]
    )


def test_a_limit_says_how_many_more_and_no_suspects_says_none() -> None:
    many = [suspect(i, f"Torch.op.{i}.forward", 0) for i in range(1, 5)]
    lines = summary_lines(comparison(many), limit=2)
    assert lines[-1] == "... and 2 more (see the advisor file)"
    assert [line.split(" (")[0] for line in lines[2:4]] == ["1. [forward] Torch.op.1.forward",
                                                              "2. [forward] Torch.op.2.forward"]  # fmt: skip
    assert summary_lines(comparison([]))[1].startswith("Top suspects: none")
    unfinished = comparison([]).model_copy(update={"summary": None, "status": "running"})
    assert summary_lines(unfinished) == ["comparison c1: running, no summary"]


def test_the_saved_summary_names_the_files_saved_beside_it() -> None:
    served = {"kind": "multi-rank", "compared_ranks": [0, 1], "ranks": [
        {"rank": r, "files": {"xlsx": f"report_c1_rank{r}.xlsx", "advisor": None if r else "advisor_c1.txt"}}
        for r in (0, 1)]}  # fmt: skip
    doc = saved_files(served, report_names([0, 1], "20261204"))
    assert [r["files"] for r in doc["ranks"]] == [
        {"xlsx": "compare_result_rank0_20261204.xlsx", "advisor": "advisor_rank0_20261204.txt"},
        {"xlsx": "compare_result_rank1_20261204.xlsx", "advisor": None},  # the server had no advisor
    ]
    assert served["ranks"][0]["files"]["xlsx"] == "report_c1_rank0.xlsx"  # the server's document is untouched
    one = {"kind": "single-rank", "rank": None, "files": {"xlsx": "report_c1_rank0.xlsx", "advisor": "a.txt"}}
    assert saved_files(one, report_names([0], "ts"))["files"] == {"xlsx": "compare_result_ts.xlsx",
                                                                  "advisor": "advisor_ts.txt"}
