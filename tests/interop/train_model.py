"""One training step of a small model under a dump tool: ``python train_model.py TOOL TASK OUT [perturb]``.

Run by the interoperability tests with msprobe's own interpreter (``TOOL=msprobe``) and with Parity's
(``TOOL=parity``), so both tools dump the same model, the same calls, the same numbers. ``TASK`` is
``statistics``, ``md5`` (statistics with CRC-32 checksums), ``xor`` (msprobe 26's XOR checksums), ``tensor``,
or ``config``: ``OUT/config.json``
exists already (a plan written by ``parity plan``) and is used as it is. ``perturb`` scales one activation
on this side only, so a compare of two runs has rows that differ, one call (``Tensor.__mul__``) without a
partner, and rows msprobe highlights.

The model covers what the layouts must agree on: module and API entries forward and backward, parameter
gradients, arguments passed by position and by keyword (``layer_norm``'s shape and ``dropout``'s flags as
scalars, a keyword ``None``), 0-d tensors (the loss) and in-place optimizer updates.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self, perturb: bool) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 4)
        self.perturb = perturb

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc1(x))
        h = self.norm(h)
        h = F.dropout(h, 0.0, self.training)
        h = F.normalize(h, p=2.0, dim=1, eps=1e-12, out=None)
        if self.perturb:
            h = h * 1.001
        return self.fc2(h)


def main(tool: str, task: str, out: Path, perturb: bool) -> None:
    if tool == "msprobe":
        from msprobe.pytorch import PrecisionDebugger, seed_all
    else:
        from parity.client import PrecisionDebugger, seed_all
    dump_task = "statistics" if task in ("md5", "xor") else task
    section: dict[str, object] = {"scope": [], "list": [], "data_mode": ["all"]}
    if dump_task == "statistics":
        section["summary_mode"] = task if task in ("md5", "xor") else "statistics"
    config = {"task": dump_task, "dump_path": str(out), "rank": [], "step": [], "level": "mix",
              "async_dump": False, dump_task: section}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "config.json"
    if task != "config":
        config_path.write_text(json.dumps(config))
    seed_all(1234)
    debugger = PrecisionDebugger(config_path=str(config_path))
    model = Net(perturb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 3])
    debugger.start(model)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    debugger.stop()
    debugger.step()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), len(sys.argv) > 4 and sys.argv[4] == "perturb")
