"""Parity against msprobe 26.2.0 itself (its own venv, ``make msprobe26-venv``): the 26.x line's dumps,
``summary_mode: "xor"`` and its ``compare -tp -gp`` CSV.

- msprobe 26's compare reads Parity's dumps of every task and summary mode (xor included): every Parity row
  found on msprobe's side, no error row;
- Parity's xor checksums are msprobe 26's, bit for bit, leaf for leaf, in the same key order;
- Parity reads msprobe 26's dumps and its CSV; ``parity compare -tp -gp`` writes msprobe 26's header exactly
  and the same rows (names and pairs) as ``msprobe compare -tp -gp`` where both tools pair a row by name;
- a 26.x config.json (xor, tensor_list) runs unchanged in Parity's client.

Lean on purpose (one model step per dump, each dump and compare made once per session).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from parity.shared.compare.headers import PARITY_EXTRA, CompareMode
from parity.shared.report.msprobe26 import header_26, read_csv_26

from tests.interop.conftest import TRAIN, run_tool

pytestmark = pytest.mark.slow

MODES = {"statistics": CompareMode.STATISTICS, "md5": CompareMode.MD5, "xor": CompareMode.MD5,
         "tensor": CompareMode.TENSOR}  # fmt: skip


@pytest.fixture(scope="module")
def dump26(msprobe26_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``dump26(tool, task, perturb=False)``: the model's dump.json by msprobe 26.2.0 or Parity."""
    root = tmp_path_factory.mktemp("dumps26")
    made: dict[tuple[str, str, bool], Path] = {}

    def make(tool: str, task: str, perturb: bool = False) -> Path:
        key = (tool, task, perturb)
        if key not in made:
            out = root / f"{tool}-{task}-{'perturbed' if perturb else 'plain'}"
            python = msprobe26_bin / "python" if tool == "msprobe" else Path(sys.executable)
            extra = ["perturb"] if perturb else []
            run_tool([str(python), str(TRAIN), tool, task, str(out), *extra], root)
            (found,) = sorted(out.glob("step0/*/dump.json"))
            made[key] = found
        return made[key]

    # the module's dumps, two at a time (each is mostly an interpreter importing torch)
    tasks = ("statistics", "xor", "tensor")
    wanted = [(tool, task, False) for tool in ("parity", "msprobe") for task in tasks]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda key: make(*key), [*wanted, ("msprobe", "statistics", True)]))
    return make


def msprobe26_csv(msprobe26_bin: Path, target: Path, golden: Path, out: Path
                  ) -> tuple[list[str], list[dict[str, Any]]]:  # fmt: skip
    msprobe = str(msprobe26_bin / "msprobe")
    run_tool([msprobe, "compare", "-tp", str(target), "-gp", str(golden), "-o", str(out)], out.parent)
    (csv_path,) = out.glob("compare_result_*.csv")
    return read_csv_26(csv_path)


def parity26_csv(target: Path, golden: Path, out: Path) -> tuple[list[str], list[dict[str, Any]]]:
    run_tool([sys.executable, "-m", "parity", "compare", "-tp", str(target), "-gp", str(golden),
              "-o", str(out), "--no-progress"], out.parent)  # fmt: skip
    (csv_path,) = out.glob("compare_result_*.csv")
    return read_csv_26(csv_path)


def leaves(dump_json: Path) -> dict[str, dict[str, Any]]:
    """Every tensor leaf by its row name (msprobe 26's ``parameters_grad.0`` entries named as 8.3.3's)."""
    out: dict[str, dict[str, Any]] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict) and isinstance(node.get("type"), str):
            out[path] = node
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}.{i}")

    for name, entry in json.loads(dump_json.read_text())["data"].items():
        walk(entry, name.replace(".parameters_grad.0", ".parameters_grad"))
    return out


def test_xor_checksums_are_msprobe_26s_bit_for_bit(dump26):
    ours, theirs = leaves(dump26("parity", "xor")), leaves(dump26("msprobe", "xor"))
    common = [name for name in theirs if name in ours and "md5" in theirs[name]]
    assert len(common) > 50
    for name in common:
        assert list(ours[name]) == list(theirs[name]), name  # type, dtype, shape, md5, requires_grad
        assert ours[name]["md5"] == theirs[name]["md5"], name
    print(f"interop26 xor: {len(common)} leaves, every checksum equal")


@pytest.mark.parametrize("task", ["statistics", "xor", "tensor"])  # md5: the CRC of 8.3.3's tests
def test_msprobe_26_compare_reads_parity_dumps(dump26, msprobe26_bin, tmp_path, task):
    header, rows = msprobe26_csv(msprobe26_bin, dump26("parity", task), dump26("msprobe", task),
                                 tmp_path / "out")  # fmt: skip
    assert header == header_26(MODES[task], stack=True)  # msprobe writes its columns, Parity reads them
    paired = [r for r in rows if r["Bench Name"] != "N/A"]
    # Unpaired, each for a known reason (README: compatibility): two calls msprobe 26 does not record
    # (its default risk_level FOCUS drops ones_like; dropout's backward), and the parameter gradients:
    # Parity writes 8.3.3's entry (``...parameters_grad``), 26.2.0 its older one (``...parameters_grad.0``),
    # which msprobe 26's compare does not pair with each other (Parity's compare pairs both generations)
    unpaired = {r["NPU Name"] for r in rows if r["Bench Name"] == "N/A"}
    not_recorded = ("Torch.ones_like.0.forward.", "Functional.dropout.0.backward.")
    explained = {n for n in unpaired if ".parameters_grad." in n or n.startswith(not_recorded)}
    assert unpaired == explained, unpaired - explained
    assert any(".parameters_grad." in n for n in unpaired)
    assert {r["Result"] for r in paired} == {"pass"}, [r for r in paired if r["Result"] != "pass"][:3]
    print(f"interop26 msprobe compare of Parity's {task} dump: {len(paired)} rows paired, all pass")


@pytest.mark.parametrize("task", ["statistics"])  # xor rows are md5 rows (the same code path)
def test_both_compare_forms_give_the_same_rows(dump26, msprobe26_bin, tmp_path, task):
    target, golden = dump26("msprobe", task, perturb=True), dump26("msprobe", task)
    theirs_header, theirs = msprobe26_csv(msprobe26_bin, target, golden, tmp_path / "msprobe")
    ours_header, ours = parity26_csv(target, golden, tmp_path / "parity")
    assert ours_header == [*theirs_header, *PARITY_EXTRA]
    assert [r["NPU Name"] for r in ours] == [r["NPU Name"] for r in theirs]
    by_name = [(o, t) for o, t in zip(ours, theirs, strict=True) if o["Parity Pairing"] == "name"]
    assert len(by_name) > 50
    assert all(o["Bench Name"] == t["Bench Name"] for o, t in by_name)
    numeric = ["NPU max", "Bench max"] if task == "statistics" else ["NPU MD5", "BENCH MD5"]
    for o, t in by_name:
        for column in numeric:
            same = o[column] == t[column] or float(o[column]) == float(t[column])
            assert same, (o["NPU Name"], column, o[column], t[column])
    # msprobe flags what the perturbation changes; so does Parity (its verdict, in 26's words)
    flagged_theirs = {t["NPU Name"] for _, t in by_name if t["Result"] != "pass"}
    flagged_ours = {o["NPU Name"] for o, _ in by_name if o["Result"] != "pass"}
    assert flagged_theirs and flagged_ours
    print(f"interop26 forms ({task}): {len(ours)} rows, {len(by_name)} paired by name alike; flagged: "
          f"msprobe {len(flagged_theirs)}, Parity {len(flagged_ours)}")  # fmt: skip


def test_a_26_config_runs_unchanged_in_parity(tmp_path):
    out = tmp_path / "dump"
    out.mkdir()
    config = {"task": "statistics", "dump_path": str(out), "rank": [], "step": [], "level": "mix",
              "extra_info": True, "async_dump": False, "precision": "low", "risk_level": "ALL",
              "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "xor",
                             "tensor_list": ["linear"]},
              "tensor": {"scope": [], "list": [], "data_mode": ["all"]},
              "acc_check": {"white_list": [], "black_list": [], "error_data_path": "./"}}  # fmt: skip
    (out / "config.json").write_text(json.dumps(config))
    run_tool([sys.executable, str(TRAIN), "parity", "config", str(out)], tmp_path)
    (dump_json,) = out.glob("step0/*/dump.json")
    data = leaves(dump_json)
    files = {leaf["data_name"] for leaf in data.values() if leaf.get("data_name")}
    assert files and all("linear" in name for name in files)  # tensor_list: the listed calls' tensors
    assert all(str(leaf.get("md5", "0x")).startswith("0x") or leaf["shape"] == [] for leaf in data.values())
