"""Capture against msprobe 8.3.3's own dump of the same code (``capture_cases.py``, a step per case):
reflected operators, a replaced torch function, a reentrant checkpoint, statistics of integer and float64
tensors, identical non-finite values, module backward entries (the gradient through each module). Both
tools name the same entries and write the same statistics, and ``parity compare`` of Parity's dump against
msprobe's passes every row, with advice that agrees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import RowStatus

from tests.interop.capture_cases import CASES
from tests.interop.conftest import TIMEOUT

pytestmark = pytest.mark.slow

CASES_SCRIPT = Path(__file__).with_name("capture_cases.py")


@pytest.fixture(scope="module")
def case_dumps(msprobe_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each tool's dump root (one run each: a step per case)."""
    root = tmp_path_factory.mktemp("capture-cases")
    out = {}
    for tool, python in (("msprobe", msprobe_bin / "python"), ("parity", Path(sys.executable))):
        out[tool] = root / tool
        proc = subprocess.run([str(python), str(CASES_SCRIPT), tool, str(out[tool])], capture_output=True,
                              text=True, timeout=TIMEOUT, cwd=root)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _dump_json(root: Path, case: str) -> Path:
    (found,) = (root / f"step{CASES.index(case)}").glob("rank*/dump.json")
    return found


def _data(root: Path, case: str) -> dict[str, Any]:
    return json.loads(_dump_json(root, case).read_text())["data"]  # type: ignore[no-any-return]


def _statistics(node: Any, path: str, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(node, dict) and "dtype" in node:
        out[path] = (node["dtype"], node.get("shape"), *(node.get(k) for k in ("Max", "Min", "Mean", "Norm")))
    elif isinstance(node, dict):
        for key, value in node.items():
            _statistics(value, f"{path}.{key}", out)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _statistics(value, f"{path}.{i}", out)
    return out


@pytest.mark.parametrize("case", CASES)
def test_same_entries_and_statistics_as_msprobe(case_dumps: dict[str, Path], case: str) -> None:
    msprobe, parity = _data(case_dumps["msprobe"], case), _data(case_dumps["parity"], case)
    assert list(parity) == list(msprobe)
    assert _statistics(parity, "", {}) == _statistics(msprobe, "", {})
    recomputed = {name for name, entry in msprobe.items() if entry.get("is_recompute") is True}
    assert {name for name, entry in parity.items() if entry.get("is_recompute") is True} == recomputed
    if case == "reflected":
        assert "Tensor.__rmul__.0.forward" in parity and "Tensor.__radd__.0.forward" in parity
    elif case == "patched":
        assert "Functional.softmax.0.forward" in parity and "Functional.softmax.0.backward" in parity
        assert not any(n.startswith(("Tensor.exp", "Tensor.amax")) for n in parity)
    elif case == "checkpoint":
        assert recomputed == {"Functional.linear.2.forward", "Torch.relu.1.forward",
                              "Module.lin.Linear.forward.1"}
        assert {"Functional.linear.2.backward", "Torch.relu.1.backward"} <= set(parity)
    elif case == "modulegrad":
        assert {"Module.a.Linear.backward.0", "Module.b.Linear.backward.0"} <= set(parity)
        assert not any(n.startswith("Module.rot.") and ".backward." in n for n in parity)


@pytest.mark.parametrize("case", CASES)
def test_parity_dump_against_msprobe_dump_compares_clean(case_dumps: dict[str, Path], case: str) -> None:
    result = compare_dumps(_dump_json(case_dumps["parity"], case), _dump_json(case_dumps["msprobe"], case),
                           CompareOptions())  # fmt: skip
    judged = (RowStatus.PASS, RowStatus.UNCOMPARABLE)
    failing = {row.cells[0]: row.status for row in result.rows if row.status not in judged}
    assert result.rows and failing == {}
    assert result.advice.line is None and "meets the accuracy requirements" in result.advice.text
