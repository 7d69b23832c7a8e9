"""Step-time overhead of the dump: instrumented / plain, median of N steps after warm-up.

A small transformer LM (4 layers, d_model 128, seq 64, batch 4, fp32, CPU; sized so a plain step is
~50-150 ms on a laptop core); one training step = forward,
loss, backward, SGD update. Modes: L0, L1, mix, L1 with md5 (task statistics). Run:

    .venv/bin/python benchmarks/bench_dump_overhead.py [--steps 10] [--profile L1]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from parity.client import PrecisionDebugger


class LM(nn.Module):
    def __init__(self, vocab: int = 500, d: int = 128, layers: int = 4, heads: int = 4, seq: int = 64) -> None:
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


def run(mode: str | None, steps: int, warmup: int, tmp: Path, profile: bool = False) -> list[float]:
    torch.manual_seed(0)
    model = LM()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tokens = torch.randint(0, 500, (4, 64))
    target = torch.randint(0, 500, (4, 64))
    if mode is not None:
        level, _, summary = mode.partition("+")
        PrecisionDebugger.reset()
        PrecisionDebugger(dump_path=str(tmp / mode), level=level, task="statistics")
        if summary:
            dbg = PrecisionDebugger._instance
            assert dbg is not None
            from dataclasses import replace

            dbg.config = replace(dbg.config, summary_mode="md5")
    times: list[float] = []
    prof = cProfile.Profile() if profile else None
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        if prof is not None and i >= warmup:
            prof.enable()
        if mode is not None:
            PrecisionDebugger.start(model)
        loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), target.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if mode is not None:
            PrecisionDebugger.stop()
            PrecisionDebugger.step()
        if prof is not None:
            prof.disable()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    if mode is not None:
        PrecisionDebugger.reset()
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--profile", default=None, help="profile one mode with cProfile (e.g. L1)")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        if args.profile:
            run(args.profile, args.steps, args.warmup, tmp, profile=True)
            return
        plain = statistics.median(run(None, args.steps, args.warmup, tmp))
        targets = {"L0": 1.3, "L1": 2.0, "mix": 2.5, "L1+md5": None}
        print(f"{'mode':<8} {'median ms':>10} {'ratio':>7} {'target':>7}")
        print(f"{'plain':<8} {plain * 1e3:>10.1f} {1.0:>7.2f} {'':>7}")
        for mode, target in targets.items():
            med = statistics.median(run(mode, args.steps, args.warmup, tmp))
            tgt = f"<={target}" if target else "-"
            print(f"{mode:<8} {med * 1e3:>10.1f} {med / plain:>7.2f} {tgt:>7}")


if __name__ == "__main__":
    main()
