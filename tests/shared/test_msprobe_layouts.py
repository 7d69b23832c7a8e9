"""Both msprobe generations' parameter-gradient layouts, read and named as msprobe names them, in every mode.

msprobe 8.3.3 writes ``Module.fc.Linear.parameters_grad: {"weight": [leaf]}`` and names the row
``Module.fc.Linear.parameters_grad.weight``; older msprobe and Parity's older dumps write the entry as
``...parameters_grad.0``. Row names never gain the list index (``.weight.0``), and the two generations pair.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import RowStatus

from tests.factories import DumpBuilder

MODES = {"tensor": ("tensor", False), "statistics": ("statistics", False), "md5": ("statistics", True)}
NEW, OLD = "Module.fc.Linear.parameters_grad", "Module.fc.Linear.parameters_grad.0"


def write_dump(root: Path, mode: str, grad_entry: str) -> Path:
    task, md5 = MODES[mode]
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 4), (3, 4), (3,)))
    builder = DumpBuilder(task, md5=md5)
    builder.api("Functional.linear.0.forward", inputs=[x, w, b], outputs=[x @ w.T + b])
    builder.parameters_grad(grad_entry, {"weight": w * 0.5, "bias": b * 0.5})
    return builder.write(root / "rank0")


def names_and_statuses(npu: Path, bench: Path) -> tuple[list[str], list[str], set[RowStatus]]:
    result = compare_dumps(npu, bench, CompareOptions())
    header = result.header
    npu_col, bench_col = header.index("NPU Name"), header.index("Bench Name")
    rows = [r for r in result.rows if "parameters_grad" in r.api]
    return ([r.cells[npu_col] for r in rows], [r.cells[bench_col] for r in rows],
            {r.status for r in result.rows})  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("entry", [NEW, OLD])
def test_parameter_gradient_rows_keep_msprobes_names(tmp_path, mode, entry):
    dump = write_dump(tmp_path, mode, entry)
    npu_names, bench_names, statuses = names_and_statuses(dump, dump)
    assert npu_names == bench_names == [f"{entry}.weight", f"{entry}.bias"]
    assert statuses == {RowStatus.PASS}


@pytest.mark.parametrize("mode", MODES)
def test_the_two_generations_pair_every_row(tmp_path, mode):
    new = write_dump(tmp_path / "new", mode, NEW)
    old = write_dump(tmp_path / "old", mode, OLD)
    npu_names, bench_names, statuses = names_and_statuses(new, old)
    assert npu_names == [f"{NEW}.weight", f"{NEW}.bias"]
    assert bench_names == [f"{OLD}.weight", f"{OLD}.bias"]
    assert statuses == {RowStatus.PASS}  # no unmatched, no bench-only row
