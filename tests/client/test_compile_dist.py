"""torch.compile regions become one marker entry; collectives are recorded per rank (2 gloo processes)."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from parity.client import PrecisionDebugger

from tests.client.conftest import load_data


def test_compiled_region_is_one_marker_and_not_captured(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def region(a: torch.Tensor) -> torch.Tensor:
        return torch.sin(a) * 2 + a.cos()

    compiled = torch.compile(region, backend="eager")
    PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    x = torch.randn(8, requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="parity.client.api_mode"):
        PrecisionDebugger.start()
        y = torch.exp(x)
        z = compiled(y)
        z = compiled(z)
        z.sum().backward()
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
    data = load_data(tmp_path)
    assert "Torch.exp.0.forward" in data and "Tensor.sum.0.forward" in data
    assert "Torch.compiled_region.0.forward" in data and "Torch.compiled_region.1.forward" in data
    assert not any(n.startswith(("Torch.sin", "Tensor.cos", "Tensor.__mul__")) for n in data)
    assert sum("torch.compile" in r.getMessage() for r in caplog.records) <= 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, port: int, root: str) -> None:
    original = dist.all_reduce
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        PrecisionDebugger(dump_path=root, level="L1")
        PrecisionDebugger.start()
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t)
        gathered = [torch.zeros(2) for _ in range(2)]
        dist.all_gather(gathered, torch.full((2,), float(rank)))
        b = torch.full((3,), float(rank))
        dist.broadcast(b, src=0)
        out = torch.zeros(2)
        dist.reduce_scatter(out, [torch.full((2,), float(rank + 1)), torch.full((2,), 10.0)])
        if rank == 0:
            dist.send(torch.tensor([5.0, 6.0]), dst=1)
        else:
            r = torch.zeros(2)
            dist.recv(r, src=0)
        a = torch.full((2,), float(rank + 1))
        work = dist.all_reduce(a, async_op=True)
        work.wait()
        PrecisionDebugger.stop()
        assert dist.all_reduce is original, "the wrappers are removed at stop()"
        PrecisionDebugger.step()
        PrecisionDebugger.reset()
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_collectives_recorded_per_rank_with_two_gloo_processes(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        data = load_data(tmp_path, 0, rank)
        ar = data["Distributed.all_reduce.0.forward"]
        assert ar["input_args"][0]["Max"] == rank + 1.0
        assert ar["output"][0]["Max"] == 3.0  # post-call value: 1 + 2
        ag = data["Distributed.all_gather.0.forward"]
        assert [leaf["Max"] for leaf in ag["output"][0]] == [0.0, 1.0]
        assert data["Distributed.broadcast.0.forward"]["output"][0]["Max"] == 0.0
        rs = data["Distributed.reduce_scatter.0.forward"]
        assert rs["output"][0]["Max"] == (3.0 if rank == 0 else 20.0)
        p2p = "Distributed.send.0.forward" if rank == 0 else "Distributed.recv.0.forward"
        assert data[p2p]["output"][0]["Max"] == 6.0
        async_ar = data["Distributed.all_reduce.1.forward"]
        assert async_ar["input_kwargs"]["async_op"] == {"type": "bool", "value": True}
        assert async_ar["output"][0]["Max"] == 3.0  # recorded at wait(), after completion
        assert not any(n.startswith("Tensor.") for n in data), (
            "the collectives' own tensor calls are not APIs"
        )
    assert json.loads((tmp_path / "step0/rank1/dump.json").read_text())["task"] == "statistics"
