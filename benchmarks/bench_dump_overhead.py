"""Step-time overhead of the dump: instrumented / plain, median of N steps after warm-up.

A small transformer LM (4 layers, d_model 256, seq 128, batch 4, vocab 1000, fp32, CPU; sized so a plain
step is ~50-150 ms on two cores); one training step = forward,
loss, backward, SGD update. Modes: L0, L1, mix, L1 with md5 (task statistics), each with ``async_dump``
false (the default: ``step()`` returns once the step is on disk) and true (files written in the background
while the next step trains; md5 is not allowed there, as in msprobe). Run:

    .venv/bin/python benchmarks/bench_dump_overhead.py [--steps 20] [--profile L1] [--clock cpu]

The issue's figure is step time as the user sees it: wall clock, with torch using every core (the defaults).
``--clock cpu`` measures the process's CPU time instead; it hides load from other jobs, but also counts the
background writer's CPU time, which wall clock only sees where it competes with training for a core.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import os
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from parity.client import PrecisionDebugger
from torch import nn


class LM(nn.Module):
    def __init__(
        self, vocab: int = 1000, d: int = 256, layers: int = 4, heads: int = 4, seq: int = 128
    ) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens) + self.pos[: tokens.shape[1]]
        return self.head(self.norm(self.blocks(h)))


def _step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor, target: torch.Tensor) -> None:
    loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), target.flatten())
    opt.zero_grad()
    loss.backward()
    opt.step()


def run(
    mode: str,
    async_dump: bool,
    steps: int,
    warmup: int,
    tmp: Path,
    profile: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, float]:
    """Median plain and instrumented step times (s), the two interleaved step by step.

    The machine is shared, so load drifts over seconds; alternating a plain step on an unhooked copy of
    the model with an instrumented step makes both medians see the same drift. The instrumented time
    includes ``stop()``/``step()``: what training waits for (with ``async_dump`` false, the writing of
    the step's files too; with true, not the writing done in the background).
    """
    torch.manual_seed(0)
    plain_model = LM()
    model = copy.deepcopy(plain_model)
    plain_opt = torch.optim.SGD(plain_model.parameters(), lr=0.01)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tokens = torch.randint(0, 1000, (4, 128))
    target = torch.randint(0, 1000, (4, 128))
    level, _, summary = mode.partition("+")
    PrecisionDebugger.reset()
    label = f"{mode}-async" if async_dump else mode
    cfg = tmp / f"{label}.json"
    cfg.write_text(json.dumps({"task": "statistics", "async_dump": async_dump,
                               "statistics": {"summary_mode": summary or "statistics"}}))  # fmt: skip
    PrecisionDebugger(str(cfg), dump_path=str(tmp / label), level=level)
    plain: list[float] = []
    inst: list[float] = []
    prof = cProfile.Profile() if profile else None
    for i in range(warmup + steps):
        t0 = clock()
        _step(plain_model, plain_opt, tokens, target)
        t1 = clock()
        if prof is not None and i >= warmup:
            prof.enable()
        PrecisionDebugger.start(model)
        _step(model, opt, tokens, target)
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
        if prof is not None:
            prof.disable()
        t2 = clock()
        if i >= warmup:
            plain.append(t1 - t0)
            inst.append(t2 - t1)
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    PrecisionDebugger.reset()
    return statistics.median(plain), statistics.median(inst)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--profile", default=None, help="profile one mode with cProfile (e.g. L1)")
    ap.add_argument("--async-dump", action="store_true", help="with --profile: async_dump true")
    ap.add_argument("--modes", default=None,
                    help="comma-separated subset, e.g. L1,L1-async (default: all)")  # fmt: skip
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="torch intra-op threads (default: the machine's cores)")  # fmt: skip
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: step time (perf_counter); cpu: the process's CPU time")  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        if args.profile:
            run(args.profile, args.async_dump, args.steps, args.warmup, tmp, profile=True, clock=clock)
            return
        # (mode, async_dump, target ratio)
        targets = [("L0", False, 1.3), ("L1", False, 2.0), ("mix", False, 2.5), ("L1+md5", False, None),
                   ("L0", True, 1.3), ("L1", True, 2.0), ("mix", True, 2.5)]  # fmt: skip
        if args.modes:
            wanted = set(args.modes.split(","))
            targets = [t for t in targets if (f"{t[0]}-async" if t[1] else t[0]) in wanted]
        clock_name = "wall: time.perf_counter" if args.clock == "wall" else "cpu: time.process_time"
        print(f"threads={args.threads} clock={clock_name} steps={args.steps} (median, interleaved)")
        print(f"{'mode':<8} {'async_dump':>10} {'plain ms':>9} {'dump ms':>9} {'ratio':>7} {'target':>7}")
        for mode, async_dump, target in targets:
            plain, inst = run(mode, async_dump, args.steps, args.warmup, tmp, clock=clock)
            tgt = f"<={target}" if target else "-"
            print(f"{mode:<8} {str(async_dump).lower():>10} {plain * 1e3:>9.1f} {inst * 1e3:>9.1f} "
                  f"{inst / plain:>7.2f} {tgt:>7}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
