"""Run pairs whose call traces differ (issue 24), for ``bench_localization.py --alignment``.

Each family is one small model in two forms with the same weights: the bench computes a piece explicitly,
the target computes it another way, as a port to another device or framework does:

* ``attn``: attention as ``matmul, masked_fill, softmax, matmul`` against ``F.scaled_dot_product_attention``
  (fault: block 1's fused call in bfloat16);
* ``norm``: a layer norm as ``mean, sub, pow, mean, add, rsqrt, mul, mul, add`` against ``F.layer_norm``
  (fault: block 1's first fused norm in float16);
* ``cast``: an extra cast on the target (``.float()`` of a float32 tensor, block 0), explicit attention on
  both sides (fault elsewhere: block 1's GELU with 1e-3 relative noise);
* ``split``: one op computed as two, ``F.linear`` against ``x @ w.t() + b`` (fault: block 1's matmul in
  float16).

Each pair is dumped by Parity's client at L1 and at mix, in tensor mode, one training step, with the fault
injected by the localization suite's ``Perturb`` (below the capture: the dump shows what a faulty kernel
would have written), and without a fault (rounding only: nothing may be named).

The ground truth of the pairing comes from the generator: the calls made inside the swapped piece (a
function named ``_swapped`` on both sides, found in stack.json) pair with nothing; every other forward call
pairs with the bench's call of the same API that is as many such calls in, outside the piece; a backward
call pairs with the backward of its forward's partner.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import localization_suite as suite
import torch
import torch.nn.functional as F
from torch import nn

FAMILIES = ("attn", "norm", "cast", "split")
LEVELS = ("L1", "mix")
D, T, HEADS = 32, 8, 2


def _swapped(fn: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    """Runs the piece the two forms compute differently (its name marks its calls in stack.json)."""
    return fn(*args)


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    t = q.shape[-2]
    att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
    return torch.matmul(att, v)


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def explicit_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt(var + 1e-5) * w + b


def fused_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def plain_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w, b)


def split_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(x, w.t()) + b


class Block(nn.Module):
    def __init__(self, family: str, target: bool, index: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.family, self.target, self.index = family, target, index

    def norm(self, ln: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
        if self.family != "norm":
            return ln(x)
        return _swapped(fused_norm if self.target else explicit_norm, x, ln.weight, ln.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(self.ln1, x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, HEADS, d // HEADS).transpose(1, 2) for z in (q, k, v))
        if self.family == "attn":
            y = _swapped(fused_attention if self.target else explicit_attention, q, k, v)
        else:
            y = explicit_attention(q, k, v)
        y = y.transpose(1, 2).reshape(b, t, d)
        if self.family == "cast" and self.target and self.index == 0:
            y = _swapped(torch.Tensor.float, y)
        x = x + self.proj(y)
        h = self.fc1(self.norm(self.ln2, x))
        h = F.gelu(h)
        if self.family == "split":
            h = _swapped(split_linear if self.target else plain_linear, h, self.fc2.weight, self.fc2.bias)
        else:
            h = self.fc2(h)
        return x + h


class GPT(nn.Module):
    def __init__(self, family: str, target: bool) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(50, D), nn.Embedding(T, D)
        self.blocks = nn.ModuleList([Block(family, target, i) for i in range(2)])
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, 50)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


#: each family's fault on the target: the localization suite's ``Fault`` (``api`` and ``index`` name the call)
FAULTS = {
    "attn": suite.Fault("attn", "Functional.scaled_dot_product_attention", 1, "bf16"),
    "norm": suite.Fault("norm", "Functional.layer_norm", 2, "fp16"),
    "cast": suite.Fault("cast", "Functional.gelu", 1, "noise-1e-3"),
    "split": suite.Fault("split", "Torch.matmul", 5, "fp16"),
}


def dump(dump_dir: Path, family: str, target: bool, level: str, fault: suite.Fault | None) -> Path:
    """One training step of the family's bench or target form, dumped by Parity's client; its dump.json."""
    import json

    from parity.client import PrecisionDebugger

    tool = suite.ParityDumper()
    torch.manual_seed(0)
    model = GPT(family, target)
    g = torch.Generator().manual_seed(7)
    x, y = torch.randint(0, 50, (4, T), generator=g), torch.randint(0, 50, (4, T), generator=g)
    perturb = suite.Perturb(fault, 0.0, 0, tool)
    PrecisionDebugger.reset()
    cfg = dump_dir.parent / f"{dump_dir.name}.config.json"
    dump_dir.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(json.dumps({"task": "tensor", "dump_path": str(dump_dir), "level": level, "step": [0]}))
    PrecisionDebugger(str(cfg))
    try:
        with perturb:
            PrecisionDebugger.start(model)
            suite.train_step(model, x, y)
            PrecisionDebugger.stop()
        PrecisionDebugger.step()
    finally:
        PrecisionDebugger.drain()
        PrecisionDebugger.reset()
    if fault is not None and not perturb.hit:
        raise RuntimeError(f"{family}: the faulty call {fault.entry} never ran")
    return next(dump_dir.glob("step0/*/dump.json"))


# ------------------------------------------------------------------------------------------------------
# ground truth

_COUNT = re.compile(r"\.\d+(?=\.(forward|backward)$)")


def _region(dump_json: Path) -> set[str]:
    """The forward entries called inside ``_swapped`` (from stack.json), and their backward entries."""
    from parity.shared.dump.reader import load_stack

    stacks = load_stack(dump_json.parent / "stack.json")
    inside = {name for name, frames in stacks.items() if any("in _swapped" in f for f in frames)}
    return inside | {name.rsplit(".", 1)[0] + ".backward" for name in inside if name.endswith(".forward")}


def _outside_numbering(entries: list[str], region: set[str]) -> dict[str, tuple[str, int]]:
    """Each forward API entry outside the region as (API, how many of that API came before it outside)."""
    seen: dict[str, int] = {}
    out = {}
    for name in entries:
        if name in region or not name.endswith(".forward") or name.startswith("Module."):
            continue
        kind = _COUNT.sub("", name)
        out[name] = (kind, seen.get(kind, 0))
        seen[kind] = seen.get(kind, 0) + 1
    return out


def truth(target: Path, bench: Path) -> dict[str, str | None]:
    """Each target entry's true bench partner (None: the entry is in the swapped piece, a gap)."""
    from parity.shared.dump.reader import load_dump

    t_entries = list(dict.fromkeys(load_dump(target).columns.apis))
    b_entries = set(dict.fromkeys(load_dump(bench).columns.apis))
    t_region, b_region = _region(target), _region(bench)
    t_num = _outside_numbering(t_entries, t_region)
    b_by_num = {v: k for k, v in _outside_numbering(sorted(b_entries, key=_order(bench)), b_region).items()}
    out: dict[str, str | None] = {}
    for name in t_entries:
        if name in t_region:
            out[name] = None
        elif name.startswith("Module."):
            out[name] = name if name in b_entries else None  # modules are the same on both sides
        elif name.endswith(".forward"):
            out[name] = b_by_num.get(t_num[name])
        else:
            forward = out.get(name.rsplit(".", 1)[0] + ".forward")
            out[name] = forward.rsplit(".", 1)[0] + ".backward" if forward else None
    return out


def _order(dump_json: Path) -> Callable[[str], int]:
    from parity.shared.dump.reader import load_dump

    order = {name: k for k, name in enumerate(dict.fromkeys(load_dump(dump_json).columns.apis))}
    return order.__getitem__


# ------------------------------------------------------------------------------------------------------
# judging


@dataclass
class AlignmentOutcome:
    family: str
    level: str
    faulty: bool
    calls: int  # target calls judged for the pairing
    right: int  # of those, paired with their true partner (or left in a gap when they have none)
    right_by_name: int  # the same for the counter-based pairing of names (``pairing.pair_exact``)
    truth: str | None
    top: str | None  # the top suspect (a gap's target calls joined with " ... ")
    top1: bool
    named: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)


def judge(family: str, level: str, target: Path, bench: Path,
          fault: suite.Fault | None) -> AlignmentOutcome:  # fmt: skip
    """Pairing accuracy against the truth, and whether the top suspect is the fault (or its gap, or at
    mix the module right around it)."""
    from parity.shared.compare.alignment import BASIS_GAP, pair_calls
    from parity.shared.compare.engine import call_modules, compare_dumps
    from parity.shared.compare.options import CompareOptions
    from parity.shared.compare.pairing import pair_exact
    from parity.shared.compare.rows import side_rows
    from parity.shared.dump.reader import load_construct, load_dump

    npu, ref = side_rows(load_dump(target), tensor_mode=True), side_rows(load_dump(bench), tensor_mode=True)
    pairing, aligned = pair_calls(npu, ref, modules=call_modules(target, bench))  # as the engine pairs
    partner: dict[str, str | None] = {}
    for r, (api, j) in enumerate(zip(npu.apis, pairing.bench_index, strict=True)):
        in_gap = aligned is not None and aligned.basis[r] == BASIS_GAP
        if in_gap:
            partner.setdefault(api, None)
        elif j >= 0:
            partner[api] = ref.apis[j]
        else:
            partner.setdefault(api, "(unpaired)")
    expected = truth(target, bench)
    wrong = [f"{api} -> {partner.get(api)} (truth {want})" for api, want in expected.items()
             if partner.get(api, "(unpaired)") != want]  # fmt: skip
    by_name: dict[str, str | None] = {}
    for api, j in zip(npu.apis, pair_exact(npu, ref).bench_index, strict=True):
        if j >= 0:
            by_name[api] = ref.apis[j]
        else:
            by_name.setdefault(api, None)
    right_by_name = sum(by_name.get(api) == want for api, want in expected.items())
    result = compare_dumps(target, bench, CompareOptions(replay_top=0))
    named = [s.gap or s.api for s in result.suspects]
    top = result.suspects[0] if result.suspects else None
    hit = False
    if fault is not None and top is not None:
        gap_calls = next((g.target for g in (aligned.gaps if aligned else []) if g.api == top.api), ())
        accepted = {fault.entry}
        if level == "mix":
            parent = load_construct(target.parent / "construct.json").get(fault.entry)
            accepted |= {parent} if parent else set()
        hit = top.api in accepted or bool(accepted & set(gap_calls))
    return AlignmentOutcome(family, level, fault is not None, len(expected), len(expected) - len(wrong),
                            right_by_name, fault.entry if fault else None, named[0] if named else None, hit,
                            named, wrong)  # fmt: skip


def run_family(family: str, levels: tuple[str, ...] = LEVELS,
               verbose: bool = False) -> list[AlignmentOutcome]:  # fmt: skip
    """The family's pairs at each level: with its fault, and without (rounding only)."""
    torch.set_num_threads(1)
    root = suite.workdir()
    out = []
    try:
        for level in levels:
            bench = dump(root / f"{level}-bench", family, False, level, None)
            for fault in (FAULTS[family], None):
                label = "fault" if fault else "clean"
                target = dump(root / f"{level}-{label}", family, True, level, fault)
                outcome = judge(family, level, target, bench, fault)
                out.append(outcome)
                if verbose:
                    print(f"[{family}/{level}/{label}] pairing {outcome.right}/{outcome.calls}, top "
                          f"{outcome.top!r} (truth {outcome.truth}); named {outcome.named[:3]}", flush=True)
                    for line in outcome.wrong[:8]:
                        print(f"    wrong: {line}")
    finally:
        suite.cleanup(root)
    return out


def table(outcomes: list[AlignmentOutcome]) -> str:
    head = f"{'level':<7}{'pairs':>6}{'pairing':>10}{'by name':>9}{'top-1':>8}"
    lines = [head + f"{'pairs w/o fault naming a call':>31}"]
    for level in LEVELS:
        cases = [o for o in outcomes if o.level == level]
        if not cases:
            continue
        calls, right = sum(o.calls for o in cases), sum(o.right for o in cases)
        named = sum(o.right_by_name for o in cases) / max(1, calls)
        faulty = [o for o in cases if o.faulty]
        clean = [o for o in cases if not o.faulty]
        top1 = sum(o.top1 for o in faulty) / max(1, len(faulty))
        alarms = f"{sum(bool(o.named) for o in clean)}/{len(clean)}"
        lines.append(f"{level:<7}{len(cases):>6}{right / max(1, calls):>10.1%}{named:>9.1%}{top1:>8.1%}"
                     f"{alarms:>31}")  # fmt: skip
    for o in outcomes:
        mark = "ok " if (o.top1 if o.faulty else not o.named) else "MISS"
        lines.append(f"  {mark} {o.family:<6}{o.level:<4}{'fault' if o.faulty else 'clean':<6} pairing "
                     f"{o.right}/{o.calls}, top {o.top} (truth {o.truth})")  # fmt: skip
    return "\n".join(lines)
