"""Step-time overhead of the dump: instrumented / plain, median of N steps after warm-up; host cost per entry.

One training step = forward, loss, backward and the optimizer update, all between ``start()`` and ``stop()``
(the usual placement). Two models:

- ``lm`` (CPU default): a small transformer LM (4 ``nn.TransformerEncoderLayer`` blocks, d 256, seq 128,
  batch 8, vocab 1000, fp32, SGD), the issue's CPU figure; with ``--msprobe`` (the default when
  ``.venv-msprobe`` exists) msprobe 8.3.3 dumps the same step at L1 in its own interpreter (this script, run
  with ``--dumper msprobe``), and the table ends with Parity's L1 overhead as a fraction of msprobe's.
- ``gpt``: token + position embedding, pre-norm blocks of layer_norm, qkv linear,
  scaled_dot_product_attention, out linear and a GELU MLP, AdamW. ``--size issue`` is the accelerator step
  of the issue (d 1024, 16 heads, seq 1024, batch 8, 12 blocks, bf16 autocast); ``--size tiny`` (the CPU
  default) has tensors so small that the step's extra time is the tool's own host cost, printed per entry.

Run:

    .venv/bin/python benchmarks/bench_dump_overhead.py                # CPU: lm ratios, gpt tiny per entry
    .venv/bin/python benchmarks/bench_dump_overhead.py --device cuda  # the issue's GPT step on a GPU
    .venv/bin/python benchmarks/bench_dump_overhead.py --profile L1 --model gpt  # cProfile, one mode

``--clock cpu`` measures the process's CPU time instead of wall time: it hides load from other jobs, but also
counts the background writer's CPU time. On an accelerator the clock is read after synchronising the device.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import json
import os
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parent.parent
MSPROBE_VENV = Path(os.environ.get("PARITY_MSPROBE_VENV") or ROOT / ".venv-msprobe")


# ---------------------------------------------------------------------------------------------------- models
class LM(nn.Module):
    def __init__(self, vocab: int = 1000, d: int = 256, layers: int = 4, heads: int = 4,
                 seq: int = 128) -> None:  # fmt: skip
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


class Block(nn.Module):
    """A pre-norm GPT block: layer_norm, qkv linear, causal SDPA, out linear; layer_norm, GELU MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(att.transpose(1, 2).reshape(b, s, d))
        return x + self.proj(self.act(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


#: name -> (vocab, d, heads, layers, seq, batch)
GPT_SIZES = {"issue": (8192, 1024, 16, 12, 1024, 8), "tiny": (64, 16, 2, 12, 8, 2)}


class Case:
    """A model, its optimizer, a batch and the autocast dtype of one benchmark; two copies share weights."""

    def __init__(self, model: str, size: str, device: str) -> None:
        torch.manual_seed(0)
        self.device = torch.device(device)
        if model == "lm":
            self.net: nn.Module = LM()
            vocab, seq, batch = 1000, 128, 8
            self.opt_cls: Callable[..., torch.optim.Optimizer] = lambda p: torch.optim.SGD(p, lr=0.01)
        else:
            vocab, d, heads, layers, seq, batch = GPT_SIZES[size]
            self.net = GPT(vocab, d, heads, layers, seq)
            self.opt_cls = lambda p: torch.optim.AdamW(p, lr=1e-4)
        self.net.to(self.device)
        self.tokens = torch.randint(0, vocab, (batch, seq), device=self.device)
        self.target = torch.randint(0, vocab, (batch, seq), device=self.device)
        self.autocast = torch.bfloat16 if self.device.type != "cpu" else None

    def copies(self) -> tuple[nn.Module, torch.optim.Optimizer, nn.Module, torch.optim.Optimizer]:
        plain = copy.deepcopy(self.net)
        inst = copy.deepcopy(self.net)
        return plain, self.opt_cls(plain.parameters()), inst, self.opt_cls(inst.parameters())

    def forward_backward(self, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        ctx = (torch.autocast(self.device.type, dtype=self.autocast) if self.autocast is not None
               else contextlib.nullcontext())  # fmt: skip
        with ctx:
            logits = model(self.tokens)
        loss = F.cross_entropy(logits.float().flatten(0, 1), self.target.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()


def _sync(device: torch.device) -> None:
    if device.type != "cpu":
        from parity.client.devices import synchronize

        synchronize(device)


# --------------------------------------------------------------------------------------------------- dumpers
class _Dumper:
    """Both tools' debuggers share msprobe's surface: start(model), stop(), step()."""

    dbg: Any

    def start(self, model: nn.Module) -> None:
        self.dbg.start(model)

    def end_step(self) -> None:
        self.dbg.stop()
        self.dbg.step()

    def settle(self) -> None:
        """Wait for the writing left to the background (``async_dump``), outside any timed step."""

    def close(self) -> None:
        pass


class ParityDumper(_Dumper):
    def __init__(self, dump_dir: Path, level: str, summary: str, async_dump: bool, task: str,
                 config: dict[str, Any] | None = None) -> None:  # fmt: skip
        from parity.client import PrecisionDebugger

        self.dbg = PrecisionDebugger
        self.dbg.reset()
        cfg = dump_dir.with_suffix(".json")
        body: dict[str, Any] = {"task": task, "async_dump": async_dump}
        if task == "statistics":
            body["statistics"] = {"summary_mode": summary}
        cfg.write_text(json.dumps(config or body))  # ``config``: a whole config.json (a plan's)
        self.dbg(str(cfg), dump_path=str(dump_dir), level=level)

    def settle(self) -> None:
        self.dbg.drain()

    def close(self) -> None:
        self.dbg.reset()


class MsprobeDumper(_Dumper):
    """msprobe 8.3.3's ``PrecisionDebugger`` (only in msprobe's venv: one process per mode, a singleton)."""

    def __init__(self, dump_dir: Path, level: str, summary: str, async_dump: bool, task: str) -> None:
        from msprobe.pytorch import PrecisionDebugger

        section: dict[str, Any] = {"scope": [], "list": [], "data_mode": ["all"]}
        if task == "statistics":
            section["summary_mode"] = summary
        body = {"task": task, "dump_path": str(dump_dir), "rank": [], "step": [], "level": level,
                "async_dump": async_dump, task: section}  # fmt: skip
        cfg = dump_dir.with_suffix(".json")
        cfg.write_text(json.dumps(body))
        self.dbg = PrecisionDebugger(config_path=str(cfg))


def entries_of_last_step(dump_dir: Path) -> int:
    """Entries in the dump.json of the highest step written (Parity's ``rank0``, msprobe's ``rank``)."""
    found = sorted(dump_dir.glob("step*/rank*/dump.json"), key=lambda p: int(re.sub(r"\D", "", p.parts[-3])))
    return len(json.loads(found[-1].read_text())["data"]) if found else 0


# -------------------------------------------------------------------------------------------------- the run
def run(case: Case, mode: str, async_dump: bool, steps: int, warmup: int, tmp: Path, dumper: str = "parity",
        profile: bool = False, clock: Callable[[], float] = time.perf_counter,
        config: dict[str, Any] | None = None) -> tuple[float, float, int, float]:  # fmt: skip
    """Median plain and instrumented step times (s), interleaved step by step, entries a step, and the median
    extra CPU time of the training thread per entry (s): the tool's host cost, unaffected by other jobs on
    the machine and without the background writer's share.

    The machine is shared, so load drifts over seconds; alternating a plain step on an unhooked copy of
    the model with an instrumented step makes both medians see the same drift. The instrumented time
    includes ``stop()``/``step()``: what training waits for (with ``async_dump`` false, the writing of
    the step's files too; with true, not the writing done in the background, which is waited for,
    untimed, before the next plain step: it would otherwise run inside that one)."""
    level, _, summary = mode.partition("+")
    task = "tensor" if summary == "tensor" else "statistics"
    label = f"{dumper}-{mode}-async" if async_dump else f"{dumper}-{mode}"
    dump_dir = tmp / label.replace("+", "_")
    cls = MsprobeDumper if dumper == "msprobe" else ParityDumper
    dmp = (ParityDumper(dump_dir, level, "statistics", async_dump, "tensor", config) if config is not None
           else cls(dump_dir, level, summary or "statistics", async_dump, task))  # fmt: skip
    plain_model, plain_opt, model, opt = case.copies()
    plain: list[float] = []
    inst: list[float] = []
    host: list[float] = []
    prof = cProfile.Profile(time.thread_time) if profile else None  # CPU of this thread: blind to load
    dev = case.device
    for i in range(warmup + steps):
        if async_dump:  # the last step's background writing would otherwise run inside the plain step
            dmp.settle()
        _sync(dev)
        c0, t0 = time.thread_time(), clock()
        case.forward_backward(plain_model, plain_opt)
        _sync(dev)
        c1, t1 = time.thread_time(), clock()
        if prof is not None and i >= warmup:
            prof.enable()
        dmp.start(model)
        case.forward_backward(model, opt)
        dmp.end_step()
        _sync(dev)
        if prof is not None:
            prof.disable()
        c2, t2 = time.thread_time(), clock()
        if i >= warmup:
            plain.append(t1 - t0)
            inst.append(t2 - t1)
            host.append((c2 - c1) - (c1 - c0))
    dmp.close()
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    entries = entries_of_last_step(dump_dir)
    per_entry = statistics.median(host) / max(entries, 1)
    return statistics.median(plain), statistics.median(inst), entries, per_entry


def msprobe_run(args: argparse.Namespace, model: str, size: str, mode: str
                ) -> tuple[float, float, int, float] | None:  # fmt: skip
    """The same step dumped by msprobe 8.3.3, in its own venv; None without it (or if it fails)."""
    python = MSPROBE_VENV / "bin" / "python"
    if not python.exists():
        return None
    cmd = [str(python), __file__, "--dumper", "msprobe", "--model", model, "--size", size, "--modes", mode,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads),
           "--clock", args.clock, "--device", args.device, "--json"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "benchmarks")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        print(f"msprobe run failed ({proc.returncode}): {proc.stderr.strip()[-400:]}", file=sys.stderr)
        return None
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    return row["plain"], row["inst"], row["entries"], row["host"]


@contextlib.contextmanager
def _table(title: str) -> Iterator[None]:
    print(f"\n{title}")
    print(f"{'mode':<10} {'async':>5} {'plain ms':>9} {'dump ms':>9} {'ratio':>6} {'target':>7} "
          f"{'entries':>7} {'host us/entry':>13}  (training thread CPU)")  # fmt: skip
    yield


def _row(name: str, async_dump: bool, plain: float, inst: float, entries: int, host: float,
         target: float | None) -> str:  # fmt: skip
    per_entry = host * 1e6
    tgt = f"<={target}" if target else "-"
    return (f"{name:<10} {str(async_dump).lower():>5} {plain * 1e3:>9.1f} {inst * 1e3:>9.1f} "
            f"{inst / plain:>6.2f} {tgt:>7} {entries:>7} {per_entry:>13.1f}")  # fmt: skip


#: (mode, async_dump, target ratio on CPU, target ratio on an accelerator)
MODES = [("L0", False, 1.3, 1.2), ("L1", False, 2.0, 1.5), ("mix", False, 2.5, 1.7),
         ("L1+md5", False, None, 3.0), ("L1+xor", False, 2.0, 1.5), ("L1", True, 2.0, 1.5),
         ("mix", True, 2.5, 1.7)]  # fmt: skip
#: L1+xor: msprobe 26's checksum (client/xor_checksum.py), held to statistics mode's (L1's) targets


# ------------------------------------------------------------------------------------- planned tensor dump
def _folder_bytes(root: Path, sub: str = "") -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and (not sub or sub in p.parts))


def _one_step(case: Case, dump_dir: Path, level: str, task: str, config: dict[str, Any] | None = None,
              gelu: str = "none") -> Path:  # fmt: skip
    """One dumped training step of a fresh copy of ``case``'s model (its GELUs with ``gelu`` approximation);
    returns the rank folder."""
    _plain, _opt, model, opt = case.copies()
    for module in model.modules():
        if isinstance(module, nn.GELU):
            module.approximate = gelu
    dmp = ParityDumper(dump_dir, level, "statistics", False, task, config)
    dmp.start(model)
    case.forward_backward(model, opt)
    dmp.end_step()
    dmp.close()
    (rank_dir,) = dump_dir.glob("step0/rank*")
    return rank_dir


def _alternating(case: Case, dump_dir: Path, level: str, plan: dict[str, Any], steps: int, warmup: int,
                 clock: Callable[[], float]) -> tuple[float, float]:  # fmt: skip
    """Median step times of a statistics-only dump and of the planned dump, taken in alternate steps of one
    debugger (its config swapped between steps: the recorder is made from it at each step's start), so
    both see the same load on a shared machine."""
    from parity.client import PrecisionDebugger
    from parity.client.config import load_config

    PrecisionDebugger.reset()
    dbg = PrecisionDebugger(dump_path=str(dump_dir), task="statistics", level=level)
    plan_path = dump_dir.with_suffix(".plan.json")
    plan_path.write_text(json.dumps(plan))
    configs = [dbg.config, load_config(plan_path, dump_path=str(dump_dir), level=level)]
    _plain, _opt, model, opt = case.copies()
    times: list[list[float]] = [[], []]
    for i in range(2 * steps):
        dbg.config = configs[i % 2]
        _sync(case.device)
        t0 = clock()
        dbg.start(model)
        case.forward_backward(model, opt)
        dbg.stop()
        dbg.step()
        _sync(case.device)
        if i >= 2 * warmup:
            times[i % 2].append(clock() - t0)
    PrecisionDebugger.reset()
    return statistics.median(times[0]), statistics.median(times[1])


def plan_figures(args: argparse.Namespace, size: str, tmp: Path, clock: Callable[[], float]) -> None:
    """``--plan``: statistics first, then the suspects in tensor mode (``parity plan``), on the GPT step.

    Two plans of top 10 suspects and neighbours 1 (``parity plan --top 10 --neighbours 1``): the plan of a
    statistics comparison, the target running every GELU in its tanh approximation (another device's
    kernel) against the exact one, whatever its suspects are; and the plan whose 10 suspects are the first
    10 blocks' GELUs (the top 10 full: the largest such plan of this model's MLPs). Printed for each: the
    planned dump's tensor bytes against a full tensor dump's (``dump_tensor_data`` of one step; the
    dump.json of either holds every call's statistics, as a statistics run's does), and its step time
    against a statistics-only step's (medians of ``--steps`` x ``--rounds`` steps of each, alternating step
    by step; the plan's ``step`` widened to every step, so every measured step is dumped)."""
    from parity.shared.compare.engine import compare_dumps
    from parity.shared.compare.options import CompareOptions
    from parity.shared.plan import make_plan
    from parity.shared.report.summary import rank_summary, single_rank_summary

    case = Case("gpt", size, args.device)
    level = "L1"
    bench = _one_step(case, tmp / "plan-stats-bench", level, "statistics")
    target = _one_step(case, tmp / "plan-stats-target", level, "statistics", gelu="tanh")
    result = compare_dumps(target / "dump.json", bench / "dump.json", CompareOptions())
    compared = single_rank_summary(rank_summary(result, {}))
    gelus = [n for n in json.loads((target / "dump.json").read_text())["data"]
             if n.startswith("Functional.gelu.") and n.endswith(".forward")][:10]  # fmt: skip
    every_gelu = {**compared, "suspects": [{"api": g, "score": 1.0} for g in gelus], "first_divergence": None}
    full = _one_step(case, tmp / "plan-full", level, "tensor", gelu="tanh")
    full_bytes = _folder_bytes(full, "dump_tensor_data")
    entries = len(json.loads((full / "dump.json").read_text())["data"])
    print(f"\nplanned tensor dump, gpt {size} {level} (top 10, neighbours 1): full tensor dump "
          f"{full_bytes:,} tensor bytes, {entries} entries")
    for label, summary in (("comparison", compared), ("10 GELUs", every_gelu)):
        plan = make_plan(summary, top=10, neighbours=1,
                         load_dump=lambda _r, p: json.loads(Path(p or "").read_text()))  # fmt: skip
        config = plan.config(str(tmp / "unused"))
        planned = _one_step(case, tmp / f"plan-{len(plan.calls)}", level, "tensor", config, gelu="tanh")
        planned_bytes = _folder_bytes(planned, "dump_tensor_data")
        st, pl = _alternating(case, tmp / f"plan-time-{len(plan.calls)}", level, {**config, "step": []},
                              args.warmup + args.steps * args.rounds, args.warmup, clock)  # fmt: skip
        suspects = len(plan.suspects)
        print(f"{label:<10}: {suspects} suspects + {len(plan.calls) - suspects} neighbours = "
              f"{len(config['tensor']['list'])} entries; tensor bytes {planned_bytes:,} = "
              f"{planned_bytes / full_bytes:.1%} of full (target <= 5%); step ms statistics {st * 1e3:.1f} "
              f"planned {pl * 1e3:.1f} = {pl / st:.2f}x (target <= 1.2)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu, cuda, npu, xpu, ... (default: cpu)")
    ap.add_argument("--model", choices=("lm", "gpt"), default=None,
                    help="default: lm and gpt tiny on cpu, gpt issue on an accelerator")  # fmt: skip
    ap.add_argument("--size", choices=tuple(GPT_SIZES), default=None, help="gpt size (default by device)")
    ap.add_argument("--profile", default=None, help="profile one mode with cProfile (e.g. L1)")
    ap.add_argument("--async-dump", action="store_true", help="with --profile: async_dump true")
    ap.add_argument("--modes", default=None, help="comma-separated subset, e.g. L1,L1-async (default: all)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads on cpu (default 1)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: step time (perf_counter); cpu: the process's CPU time")  # fmt: skip
    ap.add_argument("--no-msprobe", action="store_true", help="skip msprobe's run even if its venv exists")
    ap.add_argument("--rounds", type=int, default=3, help="with --plan: alternating runs whose medians count")
    ap.add_argument("--plan", action="store_true",
                    help="only the planned tensor dump's figures (parity plan, top 10, neighbours 1) on gpt")
    ap.add_argument("--dumper", choices=("parity", "msprobe"), default="parity", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    on_cpu = torch.device(args.device).type == "cpu"
    size = args.size or ("tiny" if on_cpu else "issue")
    wanted = args.modes.split(",") if args.modes else None
    modes = [m for m in MODES if wanted is None or (f"{m[0]}-async" if m[1] else m[0]) in wanted]
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        if args.json:  # one mode for the parent process (msprobe's interpreter)
            mode, async_dump = modes[0][0], modes[0][1]
            case = Case(args.model or "lm", size, args.device)
            plain, inst, entries, host = run(case, mode, async_dump, args.steps, args.warmup, tmp,
                                             args.dumper, clock=clock)  # fmt: skip
            print(json.dumps({"plain": plain, "inst": inst, "entries": entries, "host": host}))
            return
        if args.plan:
            plan_figures(args, size, tmp, clock)
            return
        if args.profile:
            case = Case(args.model or "gpt", size, args.device)
            run(case, args.profile, args.async_dump, args.steps, args.warmup, tmp, profile=True, clock=clock)
            return
        clock_name = "wall: time.perf_counter" if args.clock == "wall" else "cpu: time.process_time"
        print(f"device={args.device} threads={torch.get_num_threads()} clock={clock_name} steps={args.steps} "
              f"warmup={args.warmup} (medians; plain, dumped steps interleaved; optimizer inside start/stop)")
        models = [args.model] if args.model else (["lm", "gpt"] if on_cpu else ["gpt"])
        for model in models:
            case = Case(model, size, args.device)
            title = ("lm: 4 blocks, d 256, seq 128, batch 8, SGD" if model == "lm" else
                     "gpt {}: vocab {}, d {}, {} heads, {} blocks, seq {}, batch {}, AdamW".format(
                         size, *GPT_SIZES[size]) + (", bf16 autocast" if case.autocast else ""))  # fmt: skip
            l1_ratio = None
            with _table(title):
                for mode, async_dump, cpu_target, acc_target in modes:
                    # md5 reads every tensor on the host: on an accelerator fewer steps keep the check short
                    n = min(args.steps, 3) if mode.endswith("md5") and not on_cpu else args.steps
                    plain, inst, entries, host = run(case, mode, async_dump, n, args.warmup, tmp,
                                                     clock=clock)  # fmt: skip
                    if mode == "L1" and not async_dump:
                        l1_ratio = inst / plain
                    target = cpu_target if on_cpu else acc_target
                    print(_row(mode, async_dump, plain, inst, entries, host, target), flush=True)
                if model == "lm" and not args.no_msprobe and l1_ratio is not None:
                    theirs = msprobe_run(args, model, size, "L1")
                    if theirs is None:
                        print(f"msprobe: no run ({MSPROBE_VENV} missing or failed; make msprobe-venv)")
                    else:
                        print(_row("msprobe L1", False, *theirs, None))
                        share = (l1_ratio - 1) / (theirs[1] / theirs[0] - 1)
                        print(f"Parity L1 overhead / msprobe L1 overhead = {share:.2f} (target <= 0.4)")


if __name__ == "__main__":
    main()
