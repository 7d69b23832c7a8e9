"""Optimizer traces pair across devices (issue 34): AdamW's ``foreach`` path (what it takes on an accelerator)
against its per-parameter loop (what it takes on the CPU), both ways round. Each foreach call's element k
pairs with parameter k's call of the same op; the two steps compare clean, and a changed learning rate is
found in the update calls. Each case dumps one training step with Parity's client (tensor mode, L1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.headers import full_header
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import CompareResult, RowStatus
from torch import nn

from tests.shared.test_precision_choices import _dump as dump_step


def _dump(root: Path, *, foreach: bool, lr: float = 1e-2) -> Path:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))
    return dump_step(root, model, optimizer=lambda params: torch.optim.AdamW(params, lr=lr, foreach=foreach))


def _compare(tmp_path: Path, target_foreach: bool, lr: float = 1e-2) -> CompareResult:
    target = _dump(tmp_path / "target", foreach=target_foreach, lr=lr)
    bench = _dump(tmp_path / "bench", foreach=not target_foreach)
    return compare_dumps(target, bench, CompareOptions())


@pytest.mark.parametrize("target_foreach", [True, False], ids=["foreach-vs-loop", "loop-vs-foreach"])
def test_adamw_foreach_pairs_with_its_per_parameter_calls(tmp_path: Path, target_foreach: bool) -> None:
    result = _compare(tmp_path, target_foreach)
    header = full_header(result.mode, stack=result.stack_mode)
    bench_name, basis = header.index("Bench Name"), header.index("Parity Pairing")
    tensors = [(row, facts_i) for facts_i, row in enumerate(result.rows)
               if "_foreach_" in str(row.cells[0] if target_foreach else row.cells[bench_name])
               and result.facts is not None and result.facts.npu.tensor[facts_i]]  # fmt: skip
    assert len(tensors) >= 9 * 4 * 2  # nine foreach calls over four parameters, inputs and outputs
    judged = (RowStatus.PASS, RowStatus.UNCOMPARABLE)  # the step counters are 0-d: no cosine
    wrong = [(row.cells[0], row.cells[bench_name], row.cells[basis], row.status) for row, _ in tensors
             if row.cells[basis] != "foreach" or row.status not in judged]  # fmt: skip
    # on the CPU torch adds the step counters' 1 as a CPU tensor (``torch.tensor(1.0)``, alpha=1), where
    # the loop adds the int 1 (and an accelerator's foreach path too): a tensor no scalar stands for
    assert [w[0] for w in wrong] == (["Torch._foreach_add_.0.forward.input.1"] if target_foreach else [])
    pairs = {row.cells[0]: row.cells[bench_name] for row, _ in tensors}
    if target_foreach:  # element k of each foreach call is parameter k's call
        assert pairs["Torch._foreach_lerp_.0.forward.output.2"] == "Tensor.lerp_.2.forward.output.0"
        assert pairs["Torch._foreach_addcdiv_.0.forward.input.0.3"] == "Tensor.addcdiv_.3.forward.input.0"
    else:
        assert pairs["Tensor.lerp_.2.forward.output.0"] == "Torch._foreach_lerp_.0.forward.output.2"
    assert [r.cells[0] for r in result.rows if r.status is RowStatus.FAIL] == []
    assert result.suspects == []


def test_a_changed_learning_rate_is_found_in_the_foreach_update(tmp_path: Path) -> None:
    result = _compare(tmp_path, True, lr=2e-2)
    assert result.suspects and result.suspects[0].api.startswith("Torch._foreach_")
