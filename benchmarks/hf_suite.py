"""The localization benchmark on real model code (``bench_localization.py --models hf``, issue 34).

Hugging Face transformers models (Llama, GPT-2, BERT, T5, ViT, Mixtral, and Qwen3-MoE where the installed
transformers has it) built from tiny configs with fixed seeds (no download), eager attention, no dropout;
one training step (forward with the model's own loss, backward, an AdamW step) dumped by Parity's client
(the localization suite's ``ParityDumper``) at L1 and at mix, in tensor and statistics mode, compared by
the engine (``localization_suite.judgement``).

The target carries one port fault of ``hf_faults.py``: a piece of the model's own code replaced by a copy
that is wrong the way a port is (a precision choice, an approximation, an eps, a kernel, a backward, an
overflow, a routing, a RoPE). The ground truth does not ask the engine: it is the target's entries whose
innermost frame in ``hf_faults.py`` (stack.json) is at a line marked ``# <- fault`` (``truth``).

Kernel variants (``VARIANTS``) run the target on what a CPU really offers, against the bench at the
machine's own kernels: ``clean`` (the same kernels), ``aten-default`` (the target dumped in a subprocess with
``ATEN_CPU_CAPABILITY=default``: ATen's scalar kernels), ``onednn-bf16`` (oneDNN's bf16 mode for float32
GEMMs and convolutions; only on a CPU with AMX or AVX512-BF16, probed in /proc/cpuinfo), ``autocast-bf16``
(the target's forward under ``torch.autocast("cpu", dtype=torch.bfloat16)``); and, asked for by name,
``sdpa`` (the target's attention is ``F.scaled_dot_product_attention`` where the bench's is eager: another
kernel and another trace). Each variant has its pair
without a fault (nothing should be named; a systematic finding is allowed and counted apart), and each
fault runs in it except where the variant itself does what the fault does (``HFFault.hidden_by``: a bf16
GEMM under autocast is no fault) or does not run the fault's code (``skipped``).

transformers is optional (``pip install -e '.[hf]'``; ``make venv`` installs it): ``missing()`` says so.

    .venv/bin/python benchmarks/hf_suite.py dump CASES.json   # dumps cases in this process (aten-default)
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MethodType
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hf_faults  # noqa: E402
import localization_suite as suite  # noqa: E402
from hf_faults import CALL_MARK, FAMILIES, FAULT_MARK, FAULTS, HFFault  # noqa: E402

MODELS = ("llama", "gpt2", "bert", "t5", "vit", "mixtral", "qwen3moe")
LEVELS = ("L1", "mix")
MODES = ("tensor", "statistics")
VARIANTS = ("clean", "aten-default", "onednn-bf16", "autocast-bf16", "sdpa")
#: what ``--models hf`` runs unless told (``sdpa`` is asked for by name)
DEFAULT_VARIANTS = VARIANTS[:4]
#: where the target is dumped in a subprocess with this environment
SUBPROCESS_ENV = {"aten-default": {"ATEN_CPU_CAPABILITY": "default"}}
#: the CPU flags (/proc/cpuinfo) that let oneDNN compute float32 GEMMs in bf16
ONEDNN_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
VOCAB, HIDDEN, SEQ, BATCH = 100, 32, 8, 2
#: the overflow faults' models: q and k projections scaled so that the largest attention logit is 14 to 27,
#: a trained model's size (a tiny model fresh from its init has logits below 1)
HOT_QK_SCALE = 20.0
FAULTS_FILE = os.path.realpath(inspect.getsourcefile(hf_faults) or hf_faults.__file__)


def missing() -> str | None:
    """Why the suite cannot run here (transformers is not installed), or None."""
    if importlib.util.find_spec("transformers") is None:
        return (
            "the hf suite needs transformers, an optional dependency: pip install -e '.[hf]' "
            "(make venv installs it)"
        )
    return None


def available_models() -> tuple[str, ...]:
    """The models this transformers has (Qwen3-MoE came with 4.51)."""
    import transformers

    return tuple(m for m in MODELS if m != "qwen3moe" or hasattr(transformers, "Qwen3MoeConfig"))


def onednn_bf16_skip() -> str | None:
    """Why the onednn-bf16 variant cannot run on this CPU, or None."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError as exc:
        return f"onednn-bf16 skipped: /proc/cpuinfo unreadable ({exc})"
    if not flags & set(ONEDNN_BF16_FLAGS):
        return (
            "onednn-bf16 skipped: this CPU has neither AMX-BF16 nor AVX512-BF16 (/proc/cpuinfo), so "
            "oneDNN has no bf16 mode for float32 GEMMs here"
        )
    return None


# ------------------------------------------------------------------------------------------------------
# models


def _config_and_class(model: str, attn: str) -> tuple[Any, type[nn.Module]]:
    import transformers

    tf: Any = transformers  # (its configs take keywords its annotations do not list)

    small: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
        "attn_implementation": attn,
    }
    llama_like = {**small, "num_key_value_heads": 2}
    if model == "llama":
        return tf.LlamaConfig(**llama_like), tf.LlamaForCausalLM
    if model == "mixtral":
        return (
            tf.MixtralConfig(
                **llama_like, num_local_experts=4, num_experts_per_tok=2, experts_implementation="eager"
            ),
            tf.MixtralForCausalLM,
        )
    if model == "qwen3moe":
        return (
            tf.Qwen3MoeConfig(
                **llama_like,
                head_dim=8,
                moe_intermediate_size=HIDDEN,
                num_experts=4,
                num_experts_per_tok=2,
                experts_implementation="eager",
            ),
            tf.Qwen3MoeForCausalLM,
        )
    if model == "gpt2":
        return (
            tf.GPT2Config(
                vocab_size=VOCAB,
                n_embd=HIDDEN,
                n_layer=2,
                n_head=4,
                n_positions=64,
                activation_function="gelu",
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                bos_token_id=1,
                eos_token_id=2,
                attn_implementation=attn,
            ),
            tf.GPT2LMHeadModel,
        )
    if model == "bert":
        return (
            tf.BertConfig(**small, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
            tf.BertForMaskedLM,
        )
    if model == "vit":
        vit = {k: v for k, v in small.items() if k not in ("vocab_size", "max_position_embeddings")}
        return (
            tf.ViTConfig(
                **vit,
                image_size=16,
                patch_size=4,
                num_channels=3,
                num_labels=10,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
            ),
            tf.ViTForImageClassification,
        )
    if model == "t5":
        return (
            tf.T5Config(
                vocab_size=VOCAB,
                d_model=HIDDEN,
                d_kv=8,
                d_ff=2 * HIDDEN,
                num_layers=2,
                num_decoder_layers=2,
                num_heads=4,
                dropout_rate=0.0,
                feed_forward_proj="gated-gelu",
                decoder_start_token_id=0,
                pad_token_id=0,
                attn_implementation=attn,
            ),
            tf.T5ForConditionalGeneration,
        )
    raise ValueError(f"unknown model {model!r}; known: {MODELS}")


def _batch(model: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    if model == "vit":
        return {
            "pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g),
            "labels": torch.randint(0, 10, (BATCH,), generator=g),
        }
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    if model == "t5":
        return {"input_ids": ids, "labels": torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)}
    if model == "bert":
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        mask[1, -2:] = 0  # the second sentence is padded
        labels = ids.clone()
        labels[:, ::2] = -100
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
    return {"input_ids": ids, "labels": ids}


def _heat(net: nn.Module, model: str) -> None:
    """Scale the query and key projections by ``HOT_QK_SCALE`` (both sides alike): attention logits of a
    trained model's size, where float16's exp overflows (past 11.09)."""
    with torch.no_grad():
        for name, module in net.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            if model == "gpt2" and leaf == "c_attn":
                module.weight[:, : 2 * HIDDEN] *= HOT_QK_SCALE  # Conv1D: (in, out) with q, k, v side by side
            elif leaf in ("q_proj", "k_proj", "query", "key") and isinstance(module, nn.Linear):
                module.weight *= HOT_QK_SCALE


def build(model: str, hot: bool = False, attn: str = "eager") -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The model (the same weights on every call) in training mode, and its batch."""
    import transformers

    transformers.logging.set_verbosity_error()
    config, cls = _config_and_class(model, attn)
    torch.manual_seed(0)
    net = cls(config)
    net.train()
    if hot:
        _heat(net, model)
    return net, _batch(model)


def train_step(net: nn.Module, batch: dict[str, torch.Tensor], autocast: bool = False) -> None:
    """One step: the forward with the model's own loss (under bf16 autocast when asked), backward, AdamW."""
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else nullcontext():
        loss = net(**batch).loss
    loss.backward()
    opt.step()


def skipped(fault: HFFault, variant: str) -> str | None:
    """Why ``fault`` does not run in ``variant`` (None: it does)."""
    if variant in fault.hidden_by:
        return "the variant's own bf16 GEMMs do what the fault does"
    if variant == "sdpa" and any(p.attr == "eager_attention_forward" for p in fault.patches):
        return "the variant does not run the eager attention the fault patches"
    return None


@contextmanager
def injected(net: nn.Module, fault: HFFault) -> Iterator[None]:
    """The fault's patches applied to ``net`` (instance attributes) and its modeling module, undone after."""
    undo: list[tuple[Any, str, Any]] = []
    try:
        for patch in fault.patches:
            if patch.cls is None:
                modeling = sys.modules[type(net).__module__]
                undo.append((modeling, patch.attr, getattr(modeling, patch.attr)))
                setattr(modeling, patch.attr, patch.fn)
                continue
            hits = [
                m for name, m in net.named_modules() if type(m).__name__ == patch.cls and patch.where in name
            ]
            if not hits:
                raise ValueError(f"{fault.label}: no {patch.cls} module at {patch.where!r}")
            for module in hits:
                undo.append((module, patch.attr, None))
                setattr(module, patch.attr, MethodType(patch.fn, module))
        yield
    finally:
        for owner, attr, old in reversed(undo):
            if old is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, old)


@contextmanager
def kernels(variant: str) -> Iterator[None]:
    """The target's kernels in ``variant`` (within this process; aten-default is a subprocess's env)."""
    if variant != "onednn-bf16":
        yield
        return
    backends: tuple[Any, ...] = (torch.backends.mkldnn.matmul, torch.backends.mkldnn.conv)  # type: ignore[attr-defined]
    before = [b.fp32_precision for b in backends]
    try:
        for b in backends:
            b.fp32_precision = "bf16"
        yield
    finally:
        for b, old in zip(backends, before, strict=True):
            b.fp32_precision = old


# ------------------------------------------------------------------------------------------------------
# dumping


@dataclass(frozen=True)
class Case:
    """One dump: a model, its fault's label (None: none), mode, level, variant, and where it goes."""

    dump_dir: str
    model: str
    task: str
    level: str
    variant: str = "clean"
    fault: str | None = None
    hot: bool = False


_FAULTS = {f.label: f for f in FAULTS}
_TOOL: list[suite.ParityDumper] = []


def dump_case(case: Case) -> Path:
    """One training step of ``case`` dumped by Parity's client in this process; its dump.json."""
    if not _TOOL:
        _TOOL.append(suite.ParityDumper())
    tool = _TOOL[0]
    fault = _FAULTS[case.fault] if case.fault else None
    net, batch = build(case.model, hot=case.hot, attn="sdpa" if case.variant == "sdpa" else "eager")
    dump_dir = Path(case.dump_dir)
    with tool.session(dump_dir, case.task, "statistics", level=case.level):
        with injected(net, fault) if fault else nullcontext(), kernels(case.variant):
            tool.start(net)
            train_step(net, batch, autocast=case.variant == "autocast-bf16")
            tool.stop()
    found = sorted(dump_dir.glob("step0/*/dump.json"))
    if not found:
        raise RuntimeError(f"{dump_dir}: no dump written")
    return found[0]


def dump_cases(cases: list[Case], variant: str) -> list[Path]:
    """The cases dumped: here, or in one subprocess with the variant's environment."""
    env = SUBPROCESS_ENV.get(variant)
    if env is None:
        return [dump_case(c) for c in cases]
    if not cases:
        return []
    spec = Path(cases[0].dump_dir).parent / f"cases-{variant}.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(json.dumps([asdict(c) for c in cases]))
    command = [sys.executable, str(Path(__file__).resolve()), "dump", str(spec)]
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
        env={**os.environ, **env, "OMP_NUM_THREADS": "1"},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} ({env}) exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return [Path(p) for p in json.loads(proc.stdout.strip().splitlines()[-1])]


# ------------------------------------------------------------------------------------------------------
# ground truth

_FRAME = re.compile(r"^File (?P<path>.+), line (?P<line>\d+), in ")


_COMPOUND = (
    ast.If,
    ast.For,
    ast.While,
    ast.With,
    ast.Try,
    ast.FunctionDef,
    ast.ClassDef,
    ast.AsyncFunctionDef,
)


@functools.cache
def _statements() -> list[range]:
    """The line ranges of hf_faults.py's simple statements (a marker on any line of a statement that the
    formatter wrapped marks all of it: a call's frame may name any of its lines)."""
    tree = ast.parse(Path(FAULTS_FILE).read_text())
    return [
        range(node.lineno, (node.end_lineno or node.lineno) + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.stmt) and not isinstance(node, _COMPOUND)
    ]


def marked_lines(fault: HFFault) -> tuple[frozenset[int], frozenset[int], list[range]]:
    """The lines of the fault's statements marked ``# <- fault``, of those marked ``# <- its call``, and the
    line ranges of its code."""
    statements = _statements()
    faulty: set[int] = set()
    calls: set[int] = set()
    spans = []
    for obj in fault.code:
        lines, start = inspect.getsourcelines(inspect.unwrap(obj))
        spans.append(range(start, start + len(lines)))
        for k, text in enumerate(lines):
            for mark, into in ((FAULT_MARK, faulty), (CALL_MARK, calls)):
                if mark in text:
                    into.update(*(st for st in statements if start + k in st))
    return frozenset(faulty), frozenset(calls), spans


def _fault_frames(frames: list[str], spans: list[range]) -> list[int]:
    """The lines of ``frames`` (innermost first) that lie in the fault's code."""
    out = []
    for frame in frames:
        m = _FRAME.match(frame)
        if m and os.path.realpath(m["path"]) == FAULTS_FILE:
            line = int(m["line"])
            if any(line in span for span in spans):
                out.append(line)
    return out


def truth(fault: HFFault, dump_json: Path, level: str) -> frozenset[str]:
    """The target's entries that are right answers for ``fault`` (see the module docstring): those whose
    innermost frame in the fault's code is at a ``# <- fault`` line. Where none of those is an API call
    (the faulty code runs unrecorded: a backward), the calls made from a ``# <- its call`` line, and at mix
    the modules around them. Each with its backward entry."""
    from parity.shared.dump.naming import backward_of, parse_entry
    from parity.shared.dump.reader import load_construct, load_stack

    faulty, calls, spans = marked_lines(fault)
    at_fault: set[str] = set()
    at_call: set[str] = set()
    for entry, frames in load_stack(dump_json.parent / "stack.json").items():
        lines = _fault_frames(frames, spans)
        if lines and lines[0] in faulty:
            at_fault.add(entry)
        if any(line in calls for line in lines):
            at_call.add(entry)

    def is_api(name: str) -> bool:
        parsed = parse_entry(name)
        return parsed is not None and parsed.kind == "api"

    chosen = set(at_fault)
    if not any(is_api(e) for e in at_fault):
        chosen |= at_call
        if level == "mix":
            construct = load_construct(dump_json.parent / "construct.json")
            chosen |= {p for e in at_call if (p := construct.get(e)) and not is_api(p)}
    entries = set(json.loads(dump_json.read_text())["data"])
    chosen |= {b for e in chosen if (b := backward_of(e)) in entries}
    return frozenset(e for e in chosen if e in entries)


# ------------------------------------------------------------------------------------------------------
# judging


@dataclass
class HFOutcome(suite.Outcome):
    """A localization outcome of the hf suite: the suite's ``Outcome`` with the level and fault family."""

    level: str = "L1"
    family: str = ""  # the fault family; "" for a pair without a fault


def judge(
    label: str,
    mode: str,
    level: str,
    variant: str,
    target: Path,
    bench: Path,
    fault: HFFault | None,
    verbose: bool,
) -> HFOutcome:
    """The engine's verdict on one pair, against the fault's truth set (``truth``)."""
    answers = truth(fault, target, level) if fault else frozenset()
    if fault is not None and not answers:
        raise RuntimeError(f"{label} ({level}): no entry of the target at the fault's marked lines")
    j = suite.judgement(target, bench)
    out = HFOutcome(
        label,
        mode,
        variant,
        min(answers) if answers else None,
        j.ranked,
        j.first,
        j.scores,
        j.systematic,
        answers,
        j.named_calls,
        j.first_calls,
        level=level,
        family=fault.family if fault else "",
    )
    if verbose:
        ok = out.top1 if fault else not out.false_alarm
        found = f"  [systematic: {'; '.join(j.systematic)}]" if j.systematic else ""
        truth_text = f" truth {sorted(answers)}" if fault else ""
        print(
            f"[{mode:10s} {level:3s} {variant:13s}] {'ok  ' if ok else 'MISS'} {label}{truth_text} -> "
            f"top-3 {j.ranked[:3]}, first {j.first}{found}",
            flush=True,
        )
    return out


def run_unit(
    model: str,
    mode: str,
    labels: list[str],
    variants: tuple[str, ...],
    levels: tuple[str, ...],
    verbose: bool,
) -> list[HFOutcome]:
    """Every pair of one model in one mode (one worker's share): per level the bench runs (plain, and hot
    where an overflow fault needs it), then per variant the pair without a fault and each fault (``labels``:
    the faults by label, which a worker process can be sent)."""
    faults = [_FAULTS[label] for label in labels]
    torch.set_num_threads(1)
    root = suite.workdir()
    out: list[HFOutcome] = []
    try:
        benches: dict[tuple[str, bool], Path] = {}
        for level in levels:
            for hot in sorted({False} | {f.hot for f in faults}):
                name = f"{level}-bench{'-hot' if hot else ''}"
                benches[(level, hot)] = dump_case(Case(str(root / name), model, mode, level, hot=hot))
        for variant in variants:
            cases: list[tuple[Case, HFFault | None]] = []
            for level in levels:
                cases.append((Case(str(root / f"{level}-{variant}-none"), model, mode, level, variant), None))
                for n, each in enumerate(faults):
                    if skipped(each, variant) is None:
                        where = str(root / f"{level}-{variant}-{n}")
                        cases.append((Case(where, model, mode, level, variant, each.label, each.hot), each))
            dumps = dump_cases([c for c, _ in cases], variant)
            for (case, fault), target in zip(cases, dumps, strict=True):
                label = fault.label if fault else f"{model}:no fault"
                bench = benches[(case.level, case.hot)]
                out.append(judge(label, mode, case.level, variant, target, bench, fault, verbose))
    finally:
        suite.cleanup(root)
    return out


# ------------------------------------------------------------------------------------------------------
# the table


def table(outcomes: list[HFOutcome]) -> str:
    """Per mode and level: top-1, top-3 and first divergence per fault family and kernel variant; then the
    pairs without a fault (calls named, systematic findings) per variant."""
    head = f"{'mode':<11}{'level':<6}{'variant':<15}{'family':<15}{'cases':>6}{'top-1':>8}{'top-3':>8}"
    lines = [head + f"{'first div.':>12}"]
    for mode in MODES:
        for level in LEVELS:
            for variant in VARIANTS:
                cases = [
                    o for o in outcomes if (o.mode, o.level, o.variant) == (mode, level, variant) and o.family
                ]
                if not cases:
                    continue
                for family in (*FAMILIES, "all"):
                    rows = [o for o in cases if family in ("all", o.family)]
                    if not rows:
                        continue
                    n = len(rows)
                    top1, top3, first = (
                        sum(getattr(o, k) for o in rows) / n for k in ("top1", "top3", "first_hit")
                    )
                    lines.append(
                        f"{mode:<11}{level:<6}{variant:<15}{family:<15}{n:>6}{top1:>8.1%}{top3:>8.1%}"
                        f"{first:>12.1%}"
                    )
    lines.append("")
    lines.append(
        f"{'mode':<11}{'level':<6}{'pairs without a fault':<24}{'calls named':>12}{'systematic':>12}"
    )
    for mode in MODES:
        for level in LEVELS:
            for variant in VARIANTS:
                pairs = [
                    o
                    for o in outcomes
                    if (o.mode, o.level, o.variant) == (mode, level, variant) and not o.family
                ]
                if pairs:
                    what = "identical" if variant == "clean" else variant
                    named = f"{sum(o.false_alarm for o in pairs)}/{len(pairs)}"
                    found = f"{sum(bool(o.systematic) for o in pairs)}/{len(pairs)}"
                    lines.append(f"{mode:<11}{level:<6}{what:<24}{named:>12}{found:>12}")
    alarms = sorted(
        {
            f"{o.mode} {o.level} {o.variant} {o.label}: {o.ranked[:3]}"
            for o in outcomes
            if not o.family and o.false_alarm
        }
    )
    lines.extend(f"  named without a fault: {a}" for a in alarms[:12])
    findings = sorted({f for o in outcomes if not o.family for f in o.systematic})
    lines.extend(f"  systematic: {f}" for f in findings[:8])
    return "\n".join(lines)


def _dump_main(spec: str) -> int:
    """``hf_suite.py dump CASES.json``: dump each case here; print their dump.json paths as JSON."""
    torch.set_num_threads(1)
    wanted = os.environ.get("ATEN_CPU_CAPABILITY")
    have = torch.backends.cpu.get_cpu_capability()
    if wanted and have.lower() != wanted.lower():
        raise RuntimeError(f"ATEN_CPU_CAPABILITY={wanted} asked for, but torch runs {have}")
    cases = [Case(**c) for c in json.loads(Path(spec).read_text())]
    paths = [str(dump_case(c)) for c in cases]
    print(json.dumps(paths))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "dump":
        raise SystemExit(_dump_main(sys.argv[2]))
    print(__doc__, file=sys.stderr)
    raise SystemExit(2)
