"""Two-rank step folders for ``overflow_check`` and ``merge_result`` (msprobe 26's and Parity's): statistics
dumps written directly, with NaN/Inf or differences where each case needs them (no torch, no process
group)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

NAN = math.nan


def leaf(bad: float | None = None) -> dict[str, Any]:
    """A float tensor's statistics; ``bad`` (NaN or ±Inf) as its Max and Min."""
    top, low = (bad, bad) if bad is not None else (1.0, -1.0)
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4], "Max": top, "Min": low,
            "Mean": 0.0, "Norm": 2.0, "requires_grad": False}  # fmt: skip


def call(inp: float | None = None, out: float | None = None, **kwargs: Any) -> dict[str, Any]:
    return {"input_args": [leaf(inp)], "input_kwargs": kwargs, "output": [leaf(out)]}


def group(*ranks: int) -> dict[str, Any]:
    return {"type": "torch.ProcessGroup", "group_ranks": list(ranks), "group_id": "g0"}


def peer(rank: int) -> dict[str, Any]:
    return {"type": "int", "value": rank}


def write_step(step: Path, ranks: dict[int, dict[str, Any]]) -> Path:
    """``step/rank{N}/{dump,construct,stack}.json`` for each rank's entries (in order)."""
    for rank, data in ranks.items():
        folder = step / f"rank{rank}"
        folder.mkdir(parents=True)
        doc = {
            "task": "statistics",
            "level": "mix",
            "framework": "pytorch",
            "dump_data_dir": None,
            "data": data,
        }
        (folder / "dump.json").write_text(json.dumps(doc, indent=1))
        construct: dict[str, str | None] = dict.fromkeys(data, "Module.block.Block.forward.0")
        construct["Module.block.Block.forward.0"] = "Module.model.Net.forward.0"
        construct["Module.model.Net.forward.0"] = None
        (folder / "construct.json").write_text(json.dumps(construct))
        stack = {str(i): [[name], [f"File train.py, line {10 + i}, in step", f"{name}(x)"]]
                 for i, name in enumerate(data)}  # fmt: skip
        (folder / "stack.json").write_text(json.dumps(stack))
    return step


def scenarios(root: Path) -> dict[str, Path]:
    """One step folder per phase of the search, and one without an overflow."""
    g = group(0, 1)
    ar0 = "Distributed.all_reduce.0.forward"
    ar1 = "Distributed.all_reduce.1.forward"
    made = {
        # rank 1's mul makes NaN before any collective; rank 0 is clean
        "before": {0: {"Torch.add.0.forward": call(), ar0: call(group=g)},
                   1: {"Torch.add.0.forward": call(), "Torch.mul.0.forward": call(out=NAN),
                       ar0: call(group=g)}},
        # rank 1's second linear after the first all_reduce overflows and feeds the second all_reduce;
        # rank 0's inputs are clean, and its all_reduce returns the NaN
        "at": {0: {"Torch.add.0.forward": call(), ar0: call(group=g), "Functional.linear.0.forward": call(),
                   ar1: call(out=NAN, group=g), "Torch.sum.0.forward": call(NAN, NAN)},
               1: {"Torch.add.0.forward": call(), ar0: call(group=g), "Functional.linear.0.forward": call(),
                   "Functional.linear.1.forward": call(out=math.inf), ar1: call(math.inf, NAN, group=g)}},
        # a send/recv pair, then rank 0 overflows after its last collective
        "after": {0: {"Distributed.send.0.forward": call(dst=peer(1)), "Torch.div.0.forward": call(),
                      "Torch.empty.0.forward": call(out=NAN), "Torch.div.1.forward": call(out=-math.inf)},
                  1: {"Distributed.recv.0.forward": call(src=peer(0)), "Torch.mul.0.forward": call()}},
        "clean": {0: {"Torch.add.0.forward": call(), ar0: call(group=g)},
                  1: {"Torch.add.0.forward": call(), ar0: call(group=g)}},
    }  # fmt: skip
    return {name: write_step(root / name / "step0", ranks) for name, ranks in made.items()}


def merge_steps(root: Path) -> tuple[Path, Path]:
    """A target and a golden step folder of two ranks whose statistics differ a little (rank 1 more), with a
    collective whose non-tensor arguments have no metric."""

    def entry(scale: float, **kwargs: Any) -> dict[str, Any]:
        out = leaf()
        out.update(Max=1.0 * scale, Min=-0.5 * scale, Mean=0.1 * scale, Norm=2.0 * scale)
        return {"input_args": [leaf()], "input_kwargs": kwargs, "output": [out]}

    op = {"type": "str", "value": "sum"}
    steps = []
    for side, scale in (("target", 1.01), ("golden", 1.0)):
        ranks = {rank: {"Torch.add.0.forward": entry(scale + rank / 10),
                        "Distributed.all_reduce.0.forward": entry(scale, group=group(0, 1), op=op),
                        "Functional.linear.0.forward": entry(scale * (2 + rank)),
                        "Functional.linear.1.forward": entry(1.0)} for rank in (0, 1)}  # fmt: skip
        steps.append(write_step(root / side / "step0", ranks))
    return steps[0], steps[1]
