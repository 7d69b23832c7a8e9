"""Multi-rank localization on a real ``torch.distributed`` run: two gloo processes train a data-parallel step
(forward, backward, gradients all-reduced, SGD update), dumped by Parity's client; in the target run one op of
rank 1 is degraded. Rank 0 only receives the damage through the gradients' all_reduce, so the rank that
diverged first is rank 1, at its own op, before any collective."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from parity.client import PrecisionDebugger
from parity.shared.compare.job import run_compare
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.spec import load_compare_spec
from torch import nn
from torch.nn import functional as F

from tests.client.test_accuracy import _noisy
from tests.client.test_compile_dist import _free_port

pytestmark = pytest.mark.slow


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.gelu(self.a(x)))


def _train_step(rank: int, port: int, root: str, faulty_rank: int | None) -> None:
    if rank == faulty_rank:
        F.gelu = _noisy("gelu")  # this process only: its forward's gelu is 1e-2 off
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = _Net()
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(rank))
        PrecisionDebugger(dump_path=root, task="tensor", level="L1")
        PrecisionDebugger.start()
        loss = model(x).pow(2).mean()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
                p.sub_(0.05 * p.grad)
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
        PrecisionDebugger.reset()
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(240)
def test_the_rank_whose_op_is_faulty_diverged_first(tmp_path: Path) -> None:
    for name, faulty in (("bench", None), ("target", 1)):
        mp.spawn(_train_step, args=(_free_port(), str(tmp_path / name), faulty), nprocs=2, join=True)
    spec = tmp_path / "compare.json"
    spec.write_text(json.dumps({"npu_path": str(tmp_path / "target" / "step0"),
                                "bench_path": str(tmp_path / "bench" / "step0")}))  # fmt: skip
    outputs = run_compare(load_compare_spec(spec), tmp_path / "out", CompareOptions())
    firsts = {r.rank: r.first_divergence.api if r.first_divergence else None for r in outputs.results}
    assert firsts[1] == "Functional.gelu.0.forward"
    assert firsts[0] is not None and firsts[0].startswith("Distributed.all_reduce."), firsts  # received
    summary = json.loads(outputs.summary.read_text())  # type: ignore[union-attr]
    assert summary["first_diverged"]["rank"] == 1
    assert summary["first_diverged"]["api"] == "Functional.gelu.0.forward"
    assert summary["first_diverged"]["collectives_before"] == 0
