"""FSDP2 (``fully_shard``) under capture, on 2 gloo CPU ranks: every level and task completes with the
losses of an uncaptured run, no statistic is left null, DTensors are described by their local shard and
layout, every tensor file is a plain tensor ``torch.load(weights_only=True)`` reads, and two identical runs
compare clean.

One spawn for everything (the process start and torch's import are most of the cost): each rank trains the
same tiny model, freshly seeded, 2 steps with AdamW, once without the debugger and once per level and task.
"""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from parity.client import PrecisionDebugger
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import RowStatus
from torch import nn
from torch.nn import functional as F

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LEVELS = ("L0", "L1", "mix")
TASKS = ("statistics", "md5", "tensor")
STEPS = 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.norm(F.relu(self.fc1(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def _train(rank: int, out: Path | None, level: str, task: str) -> list[float]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(1234)
    model = Net()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    debugger = None
    if out is not None:
        section = {"summary_mode": "md5"} if task == "md5" else {}
        config = {"task": "statistics" if task == "md5" else task, "dump_path": str(out), "level": level,
                  "rank": [], "step": [], "statistics": section}  # fmt: skip
        path = out.with_suffix(f".rank{rank}.json")
        path.write_text(json.dumps(config))
        debugger = PrecisionDebugger(config_path=str(path))
    data = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(4, 4, generator=data), torch.randint(0, 3, (4,), generator=data)
        if debugger is not None:
            debugger.start(model)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if debugger is not None:
            debugger.stop()
            debugger.step()
        losses.append(loss.item())
    PrecisionDebugger.reset()
    return losses


def _worker(rank: int, port: int, root: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        base = Path(root)
        losses: dict[str, list[float]] = {"plain": _train(rank, None, "", "")}
        runs = [(level, task, "") for level in LEVELS for task in TASKS]
        runs += [("mix", task, "-again") for task in TASKS]
        for level, task, again in runs:
            name = f"{level}-{task}{again}"
            losses[name] = _train(rank, base / name, level, task)
            dist.barrier()
        (base / f"losses{rank}.json").write_text(json.dumps(losses))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _leaves(node: Any, path: str, out: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Every tensor leaf (and every null ``parameters_grad`` slot) as (path, leaf)."""
    if isinstance(node, dict) and isinstance(node.get("type"), str):
        if "dtype" in node:
            out.append((path, node))
    elif isinstance(node, dict):
        for key, value in node.items():
            _leaves(value, f"{path}.{key}", out)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _leaves(value, f"{path}.{i}", out)
    elif node is None and ".parameters_grad." in path:
        out.append((path, None))
    return out


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fsdp")
    mp.spawn(_worker, args=(_free_port(), str(root)), nprocs=2, join=True)
    return root


def test_every_level_and_task_keeps_the_losses(fsdp_runs: Path) -> None:
    for rank in (0, 1):
        losses = json.loads((fsdp_runs / f"losses{rank}.json").read_text())
        plain = losses.pop("plain")
        assert len(losses) == len(LEVELS) * len(TASKS) + len(TASKS)
        assert all(run == plain for run in losses.values()), (plain, losses)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("task", TASKS)
def test_no_null_statistics_and_plain_tensor_files(fsdp_runs: Path, level: str, task: str) -> None:
    stat = "md5" if task == "md5" else "Max"
    dumps = sorted((fsdp_runs / f"{level}-{task}").glob("step*/rank*/dump.json"))
    assert len(dumps) == STEPS * 2
    for dump_json in dumps:
        rank = int(dump_json.parent.name[len("rank"):])
        data = json.loads(dump_json.read_text())["data"]
        leaves = [pl for name, entry in data.items() for pl in _leaves(entry, name, [])]
        nulls = [path for path, leaf in leaves
                 if leaf is None or (math.prod(leaf["shape"]) and leaf.get(stat) is None
                                     and "uninitialised memory" not in leaf.get("note", ""))]  # fmt: skip
        assert nulls == [], f"{dump_json}: {len(nulls)} null statistics, first {nulls[:5]}"
        dtensors = [leaf for _, leaf in leaves if leaf["type"] == "torch.distributed.tensor.DTensor"]
        if level != "L1":  # the sharded parameters' gradients: the local shard of a Shard(0) DTensor
            grads = [leaf for path, leaf in leaves if ".parameters_grad." in path]
            assert grads and all(leaf in dtensors for leaf in grads)
            for leaf in grads:
                assert leaf["placements"] == [{"Shard": {"dim": 0}}] and leaf["device_mesh"] == [0, 1]
                assert leaf["mesh"]["coordinate"] == [rank]
                rows, chunk = leaf["global_shape"][0], -(-leaf["global_shape"][0] // 2)  # torch.chunk's split
                assert leaf["shape"][0] == (chunk if rank == 0 else rows - chunk)
        if level == "L0" and stat == "Max":  # the gathered parameters, read before FSDP freed them
            weight = data["Module.emb.Linear.forward.0"]["parameters"]["weight"]
            assert weight["shape"] == [8, 4] and weight["type"] == "torch.Tensor"
            assert 0 < weight["Max"] < 1 and weight["Norm"] > 0
        if task == "tensor":
            files = [leaf for _, leaf in leaves if "data_name" in leaf]
            written = [leaf for _, leaf in leaves if "uninitialised" not in leaf.get("note", "")]
            assert len(files) == len(written)
            for leaf in files:
                t = torch.load(dump_json.parent / "dump_tensor_data" / leaf["data_name"], weights_only=True)
                assert type(t) is torch.Tensor and list(t.shape) == leaf["shape"], leaf


@pytest.mark.parametrize("task", TASKS)
def test_two_identical_runs_compare_clean(fsdp_runs: Path, task: str) -> None:
    for step in range(STEPS):
        for rank in (0, 1):
            rank_dir = f"step{step}/rank{rank}/dump.json"
            result = compare_dumps(fsdp_runs / f"mix-{task}" / rank_dir,
                                   fsdp_runs / f"mix-{task}-again" / rank_dir, CompareOptions())  # fmt: skip
            # non-tensor arguments and 0-d tensors are msprobe's "uncomparable" in tensor mode
            judged = (RowStatus.PASS, RowStatus.UNCOMPARABLE)
            failing = [r.cells[0] for r in result.rows if r.status not in judged]
            assert failing == [], f"{task} step {step} rank {rank}: {failing[:5]}"
            assert sum(r.status is RowStatus.PASS for r in result.rows) > len(result.rows) // 2
