"""``parity overflow-check`` and ``parity merge-result`` against msprobe 26.2.0's ``overflow_check`` and
``merge_result`` (its own venv, ``make msprobe26-venv``), on the same inputs:

- overflow: for a NaN made before the first collective, one fed into a collective, one after the last, a
  clean step, and a real Parity dump with an exp overflowing, both tools write the same
  ``anomaly_analyze_{ns}.json`` (or none);
- diff_check: msprobe 26's one-pass divergence dump and Parity's, one faulty call, the same md5 baseline:
  the same culprit's tensor files (Parity's with its neighbours);
- merge: from msprobe 26's own ``compare -tp -gp --xlsx`` of two ranks, both tools' workbooks hold the same
  sheets, rows, values and cell types, with and without ``compare_index``; Parity also merges its own
  ``--xlsx`` results (its extra columns), a non-tensor argument's metric read as ``NPU:..  Bench:..``.

Lean: the dumps are written directly (no torch), msprobe runs once per case.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from parity.cli import main
from tests.interop.conftest import TRAIN, run_tool
from tests.interop.multirank_dumps import merge_steps, scenarios

pytestmark = pytest.mark.slow
TRAIN_DIR = TRAIN.parent


def only(folder: Path, pattern: str) -> Path | None:
    found = sorted(folder.glob(pattern))
    assert len(found) <= 1, found
    return found[0] if found else None


def test_overflow_check_writes_msprobe26s_file(msprobe26_bin: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    expected = {"before": ("rank_1", "Torch.mul.0.forward", "before the first collective"),
                "at": ("rank_1", "Functional.linear.1.forward", "between collectives"),
                "after": ("rank_0", "Torch.div.1.forward", "after the last collective")}  # fmt: skip
    steps = scenarios(tmp_path / "dumps")
    msprobe = str(msprobe26_bin / "msprobe")
    with ThreadPoolExecutor(2) as pool:  # each run is mostly an interpreter importing msprobe
        list(pool.map(lambda item: run_tool([msprobe, "overflow_check", "-i", str(item[1]), "-o",
                                             str(tmp_path / f"msprobe-{item[0]}")], tmp_path), steps.items()))
    for name, step in steps.items():
        ours, theirs = tmp_path / f"parity-{name}", tmp_path / f"msprobe-{name}"
        assert main(["overflow-check", "-i", str(step), "-o", str(ours)]) == 0
        printed = capsys.readouterr().out
        mine, their_file = only(ours, "anomaly_analyze_*.json"), only(theirs, "anomaly_analyze_*.json")
        if name == "clean":
            assert mine is None and their_file is None and "no call made NaN/Inf" in printed
            continue
        assert mine is not None and their_file is not None, name
        assert mine.read_text() == their_file.read_text(), name  # byte for byte: keys, order, indent
        rank, call, phase = expected[name]
        doc = json.loads(mine.read_text())
        assert list(doc) == [rank] and doc[rank][0]["op_name"] == call, (name, doc)
        assert f"rank {rank[5:]}: {call} ({phase}" in printed, printed


OVERFLOWING_STEP = """
import sys, torch
from parity.client import PrecisionDebugger
debugger = PrecisionDebugger(task="statistics", dump_path=sys.argv[1], level="mix")
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
with torch.no_grad():  # fixed weights: a random init can leave every ReLU output at 0, and exp(0) is 1
    model[0].weight.fill_(0.25)
    model[0].bias.fill_(0.5)
debugger.start(model)
torch.exp(model(torch.ones(2, 4)) * 1000).sum()
debugger.stop()
debugger.step()
"""


def test_overflow_check_of_a_parity_dump(msprobe26_bin: Path, tmp_path: Path) -> None:
    """A real dump (Parity's layout, stack.json and construct.json): an exp that overflows to inf."""
    run_tool([sys.executable, "-c", OVERFLOWING_STEP, str(tmp_path / "dump")], tmp_path)
    step = tmp_path / "dump" / "step0"
    run_tool([str(msprobe26_bin / "msprobe"), "overflow_check", "-i", str(step), "-o", str(tmp_path / "m")],
             tmp_path)  # fmt: skip
    assert main(["overflow-check", "-i", str(step), "-o", str(tmp_path / "p")]) == 0
    mine, theirs = only(tmp_path / "p", "*.json"), only(tmp_path / "m", "*.json")
    assert mine is not None and theirs is not None
    assert mine.read_text() == theirs.read_text()
    (found,) = json.loads(mine.read_text())["rank_0"]
    assert found["op_name"] == "Torch.exp.0.forward" and "<string>" in found["stack_info"][0]


def cells(path: Path) -> dict[str, list[list[tuple[Any, str]]]]:
    """Every sheet's cells with their types (``n`` number, ``s`` text, ``b`` boolean)."""
    import openpyxl

    workbook = openpyxl.load_workbook(path)
    return {ws.title: [[(c.value, c.data_type) for c in row] for row in ws.iter_rows()] for ws in workbook}


def test_merge_result_matches_msprobe26(msprobe26_bin: Path, tmp_path: Path) -> None:
    target, golden = merge_steps(tmp_path / "dumps")
    msprobe = str(msprobe26_bin / "msprobe")
    results = tmp_path / "results"
    compare = [msprobe, "compare", "-tp", str(target), "-gp", str(golden), "-o", str(results), "--xlsx"]
    run_tool(compare, tmp_path)
    chosen = "api: [Torch.add, Functional.linear]\ncompare_index: [Max diff, Requires_grad Consistent]\n"
    configs = {"all": "api:\n  - Distributed.all_reduce\n  - Functional.linear\n", "chosen": chosen}
    for name, text in configs.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda name: run_tool([msprobe, "merge_result", "-i", str(results), "-o",
                                             str(tmp_path / f"msprobe-{name}"), "-config",
                                             str(tmp_path / f"{name}.yaml")], tmp_path),
                      configs))  # fmt: skip
    for name in configs:
        config = tmp_path / f"{name}.yaml"
        ours, theirs = tmp_path / f"parity-{name}", tmp_path / f"msprobe-{name}"
        assert main(["merge-result", "-i", str(results), "-o", str(ours), "-config", str(config)]) == 0
        mine, msprobe_book = only(ours, "multi_ranks_*.xlsx"), only(theirs, "multi_ranks_*.xlsx")
        assert mine is not None and msprobe_book is not None
        got, want = cells(mine), cells(msprobe_book)
        assert got == want, name
    assert list(got) == ["Max diff", "Requires_grad Consistent"]
    calls = ("Torch.add.0", "Functional.linear.0", "Functional.linear.1")
    want_names = sorted(f"{call}.forward.{leaf}" for call in calls for leaf in ("input.0", "output.0"))
    assert [row[0][0] for row in got["Max diff"]][1:] == want_names
    assert got["Max diff"][0] == [("NPU Name", "s"), ("rank0", "s"), ("rank1", "s")]


def test_merge_result_reads_paritys_own_results(tmp_path: Path) -> None:
    target, golden = merge_steps(tmp_path / "dumps")
    results = tmp_path / "results"
    assert main(["compare", "-tp", str(target), "-gp", str(golden), "-o", str(results), "--xlsx",
                 "--no-progress"]) == 0  # fmt: skip
    config = tmp_path / "merge.yaml"
    config.write_text("api: [Distributed.all_reduce]\ncompare_index: [Max diff]\n")
    out = tmp_path / "out"
    assert main(["merge-result", "-i", str(results), "-o", str(out), "-config", str(config)]) == 0
    (book,) = out.glob("multi_ranks_compare_merge_*.xlsx")
    rows = {row[0][0]: [value for value, _ in row[1:]] for row in cells(book)["Max diff"][1:]}
    assert rows["Distributed.all_reduce.0.forward.input.op"] == ["NPU:sum  Bench:sum"] * 2
    assert rows["Distributed.all_reduce.0.forward.input.group"] == ["NPU:[0, 1]  Bench:[0, 1]"] * 2
    assert rows["Distributed.all_reduce.0.forward.output.0"][0] == pytest.approx(0.01)


DIVERGENCE_STEP = """
import json, sys
from pathlib import Path
import torch, torch.nn.functional as F
sys.path.insert(0, sys.argv[4])
from train_model import Net
tool, out, bench = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
if tool == "msprobe":
    from msprobe.pytorch import PrecisionDebugger, seed_all
else:
    from parity.client import PrecisionDebugger, seed_all
task = "tensor" if bench != "-" else "statistics"
section = {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "md5"}
if bench != "-":
    section.update(bench_path=bench, diff_nums=1)
out.mkdir(parents=True, exist_ok=True)
(out / "config.json").write_text(json.dumps({"task": task, "dump_path": str(out), "rank": [], "step": [],
                                             "level": "mix", "async_dump": False, task: section}))
seed_all(1234)
debugger = PrecisionDebugger(config_path=str(out / "config.json"))
model = Net(False)
if bench != "-":
    model.norm.eps = 0.5  # the faulty call: layer_norm's inputs agree with the baseline, its output not
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 3])
debugger.start(model)
F.cross_entropy(model(x), y).backward()
optimizer.step()
debugger.stop()
debugger.step()
"""


def test_diff_check_finds_msprobe26s_culprit(msprobe26_bin: Path, tmp_path: Path) -> None:
    """msprobe 26.2.0's one-pass divergence dump (task tensor, ``tensor.bench_path``, ``diff_nums``) and
    Parity's, against the same md5 baseline (Parity's, which msprobe reads from its ``proc`` folder): both
    write the culprit's tensor files; Parity adds its neighbours and keeps every call's statistics."""
    here = str(TRAIN_DIR)
    run_tool([sys.executable, "-c", DIVERGENCE_STEP, "parity", str(tmp_path / "bench"), "-", here], tmp_path)
    proc = tmp_path / "bench-msprobe" / "step0" / "proc1"  # a single-process run's folder (msprobe's)
    proc.parent.mkdir(parents=True)
    (tmp_path / "bench" / "step0" / "rank0").rename(proc)
    theirs_root, ours_root = tmp_path / "msprobe", tmp_path / "parity"
    run_tool([str(msprobe26_bin / "python"), "-c", DIVERGENCE_STEP, "msprobe", str(theirs_root),
              str(tmp_path / "bench-msprobe"), here], tmp_path)  # fmt: skip
    run_tool([sys.executable, "-c", DIVERGENCE_STEP, "parity", str(ours_root),
              str(tmp_path / "bench-msprobe"), here], tmp_path)  # fmt: skip
    theirs = {p.name for p in theirs_root.glob("step0/*/dump_tensor_data/*.pt")}
    ours = {p.name for p in ours_root.glob("step0/*/dump_tensor_data/*.pt")}
    culprit = "Functional.layer_norm.0.forward"
    assert {n for n in theirs if not n.startswith("Module.")} == {n for n in theirs if n.startswith(culprit)}
    assert any(n.startswith(culprit) for n in theirs) and theirs <= ours, (theirs, ours)
    (dump_json,) = ours_root.glob("step0/*/dump.json")
    data = json.loads(dump_json.read_text())["data"]
    bench_data = json.loads((proc / "dump.json").read_text())["data"]
    assert list(data) == list(bench_data)  # statistics for every call (msprobe stops its dump at the culprit)
    entries = {n for n in data if any(f.startswith(n + ".") for f in ours)}
    assert entries == {culprit, "Functional.relu.0.forward", "Module.norm.LayerNorm.forward.0"}, entries
    print(f"interop26 diff_check: msprobe {len(theirs)} files, Parity {len(ours)} "
          f"({', '.join(sorted(entries))})")
