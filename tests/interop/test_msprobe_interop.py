"""Parity against msprobe 8.3.3 itself: the same model dumped by both tools, compared by both tools.

- both dumps name every entry and every leaf alike (and, in tensor mode, every tensor file);
- msprobe's compare reads Parity's dumps: every row paired, every parameter-gradient row present;
- ``parity compare`` pairs an msprobe dump with a Parity dump: 0 unmatched, 0 bench-only, all pass;
- on two msprobe dumps that differ, Parity's xlsx equals msprobe's ``-hl`` xlsx cell for cell (strings and
  types), except for the differences the README lists under "Where Parity differs", each named below; its
  fills follow the Parity Status column, and every row msprobe fills Parity fills too (red where msprobe's
  is red, yellow or red where it is yellow).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import openpyxl
import pytest
from parity.shared.compare.headers import PARITY_EXTRA

pytestmark = pytest.mark.slow

TASKS = ["statistics", "tensor"]
#: the model's parameters: one gradient row each, in every mode
PARAMETER_GRAD_ROWS = {f"Module.{m}.{cls}.parameters_grad.{p}"
                       for m, cls in (("fc1", "Linear"), ("norm", "LayerNorm"), ("fc2", "Linear"))
                       for p in ("weight", "bias")}  # fmt: skip


def leaf_names(dump_json: Path) -> tuple[list[str], list[tuple[str, Any, Any]]]:
    """Entry names in file order, and each leaf as (path, data_name, shape), as a reader walks them."""
    data = json.loads(dump_json.read_text())["data"]
    leaves: list[tuple[str, Any, Any]] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict) and isinstance(node.get("type"), str):
            leaves.append((path, node.get("data_name"), node.get("shape")))
        elif isinstance(node, dict):
            for key, value in node.items():
                if key != "is_recompute":
                    walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}.{i}")
        elif node is None:
            leaves.append((path, None, None))

    for name, entry in data.items():
        walk(entry, name)
    return list(data), leaves


def read_xlsx(path: Path) -> tuple[list[str], list[list[Any]], list[str | None]]:
    """Header, rows of values, and each row's fill (``red``/``yellow``/None, whatever the alpha byte)."""
    sheet = openpyxl.load_workbook(path).active
    rows = list(sheet.iter_rows())
    colours = {"FFFF0000": "red", "00FF0000": "red", "FFFFFF00": "yellow", "00FFFF00": "yellow"}
    fills = [colours.get(r[0].fill.fgColor.rgb) if r[0].fill.fill_type else None for r in rows[1:]]
    return [c.value for c in rows[0]], [[c.value for c in r] for r in rows[1:]], fills


@pytest.mark.parametrize("task", TASKS)
def test_both_tools_name_every_entry_and_leaf_alike(dump, task):
    msprobe_entries, msprobe_leaves = leaf_names(dump("msprobe", task))
    parity_entries, parity_leaves = leaf_names(dump("parity", task))
    assert parity_entries == msprobe_entries
    assert parity_leaves == msprobe_leaves
    print(f"interop names ({task}): {len(parity_entries)} entries, {len(parity_leaves)} leaves, all equal")


@pytest.mark.parametrize("task", TASKS)
def test_msprobe_compare_reads_parity_dumps(dump, msprobe_compare, task):
    header, rows, _ = read_xlsx(msprobe_compare(dump("parity", task), dump("msprobe", task)))
    npu, bench = header.index("NPU Name"), header.index("Bench Name")
    _, leaves = leaf_names(dump("parity", task))
    assert len(rows) == len(leaves)
    assert [r[bench] for r in rows if r[bench] == "N/A"] == []  # every Parity row found its msprobe row
    assert {r[npu] for r in rows if "parameters_grad" in r[npu]} == PARAMETER_GRAD_ROWS
    if task == "tensor":
        accuracy, shape = header.index("Accuracy Reached or Not"), header.index("NPU Tensor Shape")
        data_name = header.index("Data_name")
        # rows with a tensor file agree; argument rows have none and 0-d tensors no cosine: msprobe says None
        assert {r[accuracy] for r in rows if "'-1'" not in r[data_name] and r[shape] != "[]"} == {"Yes"}
        assert {r[accuracy] for r in rows} == {"Yes", "None"}
    else:
        assert {r[header.index("Result")] for r in rows} == {None}  # no Warning anywhere
    print(f"interop msprobe compare of Parity's {task} dump: {len(rows)} rows, 0 unmatched, "
          f"{len(PARAMETER_GRAD_ROWS)} parameter-gradient rows")  # fmt: skip


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("npu_tool", ["msprobe", "parity"])
def test_parity_pairs_an_msprobe_dump_with_a_parity_dump(dump, parity_compare, task, npu_tool):
    bench_tool = "parity" if npu_tool == "msprobe" else "msprobe"
    out = parity_compare(dump(npu_tool, task), dump(bench_tool, task))
    (summary_path,) = out.glob("compare_summary_*.json")
    summary = json.loads(summary_path.read_text())
    counts = summary["status_counts"]
    _, leaves = leaf_names(dump(npu_tool, task))
    paired = summary["rows"] - counts["bench-only"]
    print(f"interop parity compare {npu_tool} vs {bench_tool} ({task}): {paired} rows paired, "
          f"{counts['unmatched']} unmatched, {counts['bench-only']} bench-only, "
          f"{counts['pass']} pass")  # fmt: skip
    assert paired == len(leaves)
    assert counts["unmatched"] == counts["bench-only"] == counts["fail"] == counts["warning"] == 0
    if task == "statistics":
        assert counts["pass"] == len(leaves)
    else:  # argument rows have no tensor file, 0-d tensors no cosine: uncomparable, as msprobe's "None"
        none = sum(1 for _, data_name, shape in leaves if not data_name or shape == [])
        assert (counts["pass"], counts["uncomparable"]) == (len(leaves) - none, none)


# ---- cell for cell -----------------------------------------------------------------------------------------

_REL = re.compile(r"^(-?[0-9.e+-]+|inf|nan)%$")


def _close(a: float, b: float) -> bool:
    # msprobe's parse error is about an ulp of the statistics themselves, so a difference of two close values
    # (or its percentage) can differ in relative terms; absolutely it stays far below 1e-10
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-10)


def _collapse(message: str) -> str:
    """msprobe's Err_message with its repetitions folded (README: repeated messages are written once)."""
    lines = message.split("\n")
    body = re.sub(r"(.+?)\1+$", r"\1", lines[0]) if lines[0] else ""
    return "\n".join(dict.fromkeys([body, *lines[1:]]))


def allowed_difference(column: str, row: dict[str, Any], ours: Any, theirs: Any, mode: str) -> str | None:
    """Which README difference explains ``ours != theirs``, or None when nothing does."""
    numbers = (int, float)
    if isinstance(ours, numbers) and isinstance(theirs, numbers) and not isinstance(ours, bool):
        # openpyxl writes 16 significant digits (and integral values without ".0"), msprobe re-parses the
        # dumped statistics with pandas' fast parser: the same number to the last digits
        return "number formatting" if _close(float(ours), float(theirs)) else None
    if isinstance(ours, str) and isinstance(theirs, str):
        a, b = _REL.match(ours), _REL.match(theirs)
        if a and b and _close(float(a[1]), float(b[1])):
            return "relative error digits"
        if column == "Err_message" and _collapse(theirs) == ours:
            return "repeated messages"
    if str(row["NPU Name"]).endswith(".memory_format"):
        return "memory_format argument"
    if mode == "md5" and column == "Result" and row["Bench Name"] == "N/A" and ours == "N/A":
        return "md5 unmatched row"
    return None


@pytest.mark.parametrize("task", ["statistics", "tensor", "md5"])
def test_xlsx_equals_msprobes_cell_for_cell(dump, msprobe_compare, parity_compare, task):
    npu, bench = dump("msprobe", task, perturb=True), dump("msprobe", task)
    theirs_header, theirs, theirs_fills = read_xlsx(msprobe_compare(npu, bench))
    (ours_path,) = parity_compare(npu, bench).glob("compare_result_*.xlsx")
    ours_header, ours, ours_fills = read_xlsx(ours_path)
    assert openpyxl.load_workbook(ours_path).sheetnames == ["Sheet"]  # msprobe -hl's sheet name
    assert ours_header == [*theirs_header, *PARITY_EXTRA]  # msprobe's columns first, unchanged
    assert [r[0] for r in ours] == [r[0] for r in theirs]
    # The perturbing ``Tensor.__mul__`` has no partner: msprobe leaves its rows unmatched, Parity's alignment
    # makes it a gap and pairs the tensors crossing it (README: calls are paired by aligning) and judges it.
    pairing = ours_header.index("Parity Pairing")
    in_gap = [r[pairing] == "gap" for r in ours]
    gap_entries = {ours_row[ours_header.index("Parity API")] for ours_row, g in zip(ours, in_gap, strict=True)
                   if g}  # fmt: skip
    assert gap_entries == {"Tensor.__mul__.0.forward", "Tensor.__mul__.0.backward"}, gap_entries
    status = ours_header.index("Parity Status")
    by_status = {"fail": "red", "unmatched": "red", "warning": "yellow"}
    assert ours_fills == [by_status.get(r[status]) for r in ours]
    allowed = {None: {None, "red", "yellow"}, "red": {"red"}, "yellow": {"yellow", "red"}}
    assert all(mine in allowed[msprobe] for mine, msprobe, gap in zip(ours_fills, theirs_fills, in_gap,
                                                                      strict=True) if not gap)  # fmt: skip
    # the comparison has something to show (md5: never filled; statistics: only the unmatched mul's rows,
    # which Parity pairs)
    assert any(theirs_fills) or task == "md5"
    explained: dict[str, int] = {}
    for ours_row, theirs_row, gap in zip(ours, theirs, in_gap, strict=True):
        row = dict(zip(theirs_header, theirs_row, strict=True))
        for column, mine, msprobe in zip(theirs_header, ours_row, theirs_row, strict=False):
            if mine == msprobe and type(mine) is type(msprobe):
                continue
            reason = "a gap's tensors paired" if gap else allowed_difference(column, row, mine, msprobe, task)
            assert reason, f"{row['NPU Name']} {column}: Parity {mine!r}, msprobe {msprobe!r}"
            explained[reason] = explained.get(reason, 0) + 1
    print(f"interop xlsx ({task}): {len(ours)} rows x {len(theirs_header)} columns equal to msprobe's, "
          f"except {explained or 'nothing'}")  # fmt: skip
