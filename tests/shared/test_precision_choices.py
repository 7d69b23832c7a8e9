"""Precision choices are causes (issue 34): a call whose target asked for a lower precision, or for other
arguments, than the bench is judged by what the bench asked for and named as what it is.

Each case dumps one training step of a small model twice with Parity's client (the bench as written, the
target with one port bug), and compares the two dumps with the engine."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from parity.client import PrecisionDebugger
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.headers import full_header
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import CompareResult
from parity.shared.plan import make_plan
from parity.shared.report.summary import rank_summary, single_rank_summary
from torch import nn

Port = Callable[[torch.Tensor], torch.Tensor]


def _rms_norm(h: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Llama's RMSNorm: the variance in ``dtype`` (float32 upcast in the model, bfloat16 in the bug)."""
    variance = h.to(dtype).pow(2).mean(-1, keepdim=True)
    return (h * torch.rsqrt(variance + 1e-6)).to(torch.float32)


class Net(nn.Module):
    """linear → RMSNorm → GELU → layer_norm → linear, each step replaceable by a port's version."""

    def __init__(self, *, norm: Port | None = None, act: Port | None = None, ln: Port | None = None) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 8)
        self.norm = norm or (lambda h: _rms_norm(h, torch.float32))
        self.act = act or F.gelu
        self.ln = ln or (lambda h: F.layer_norm(h, (64,), eps=1e-5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.a(x))
        h = self.ln(self.act(self.b(h)))
        return self.c(h)


Optimizer = Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer]


def _dump(root: Path, model: nn.Module, *, task: str = "tensor", autocast: bool = False,
          optimizer: Optimizer | None = None) -> Path:  # fmt: skip
    """One training step (forward, loss, backward, SGD or ``optimizer``) of ``model`` dumped at L1 into
    ``root``."""
    PrecisionDebugger.reset()
    root.mkdir(parents=True)
    config = root / "config.json"
    config.write_text(json.dumps({"task": task, "dump_path": str(root), "level": "L1", "step": [0]}))
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    opt = (optimizer or (lambda params: torch.optim.SGD(params, lr=0.1)))(model.parameters())
    PrecisionDebugger(str(config))
    PrecisionDebugger.start()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    PrecisionDebugger.drain()
    PrecisionDebugger.reset()
    return next(root.glob("step0/*/dump.json"))


def _compare(tmp_path: Path, target: dict[str, Port], *, task: str = "tensor", autocast: bool = False,
             replay_top: int = 0) -> CompareResult:  # fmt: skip
    torch.manual_seed(0)
    bench = _dump(tmp_path / "bench", Net(), task=task)
    torch.manual_seed(0)
    port = _dump(tmp_path / "target", Net(**target), task=task, autocast=autocast)
    return compare_dumps(port, bench, CompareOptions(replay_top=replay_top))


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_a_cast_to_bfloat16_where_the_bench_upcasts_is_named_as_such(tmp_path: Path, task: str) -> None:
    """RMSNorm's variance in bfloat16 (the missing upcast): the cast is within bfloat16's rounding, so
    judged by its own dtype it passed; judged by the bench's float32 it is the first suspect."""
    result = _compare(tmp_path, {"norm": lambda h: _rms_norm(h, torch.bfloat16)}, task=task)
    top = result.suspects[0]
    assert top.api == "Tensor.to.0.forward"
    assert "the target rounds to bfloat16 where the bench stays in float32" in top.reason
    assert result.first_divergence is not None and result.first_divergence.api == "Tensor.to.0.forward"


def test_gelu_with_the_tanh_approximation_is_named_by_its_argument(tmp_path: Path) -> None:
    """Inputs bit-identical, output 1e-4 off where rounding allows 1e-7: the call is judged (the argument
    only the target passed leaves it judged) and its reason says what it asked for."""
    result = _compare(tmp_path, {"act": lambda h: F.gelu(h, approximate="tanh")})
    top = result.suspects[0]
    assert top.api == "Functional.gelu.0.forward"
    assert "approximate: 'tanh' vs not passed" in top.reason and "inputs identical" in top.reason


def _messages(result: CompareResult) -> dict[str, str]:
    column = full_header(result.mode, stack=result.stack_mode).index("Err_message")
    return {str(row.cells[0]): str(row.cells[column]) for row in result.rows}


def test_an_argument_row_says_what_differs_and_the_plan_lists_its_call(tmp_path: Path) -> None:
    """An argument only the target passes, and one both pass with other values: each row says what the two
    sides asked for, never that a data file is missing; ``parity plan`` lists the call."""
    one_sided = _compare(tmp_path / "one", {"act": lambda h: F.gelu(h, approximate="tanh")})
    message = _messages(one_sided)["Functional.gelu.0.forward.input.approximate"]
    assert message == "Argument approximate: 'tanh' vs not passed."
    torch.manual_seed(0)
    bench = _dump(tmp_path / "both" / "bench", Net(ln=lambda h: F.layer_norm(h, (64,), eps=1e-5)))
    torch.manual_seed(0)
    target = _dump(tmp_path / "both" / "target", Net(ln=lambda h: F.layer_norm(h, (64,), eps=1e-2)))
    both = compare_dumps(target, bench, CompareOptions())
    message = _messages(both)["Functional.layer_norm.0.forward.input.eps"]
    assert message.endswith("Argument eps: 0.01 vs 1e-05.") and "data file" not in message
    summary = single_rank_summary(rank_summary(one_sided, {}))
    plan = make_plan(json.loads(json.dumps(summary, default=str)), neighbours=0)
    assert "Functional.gelu.0.forward" in [call.api for call in plan.calls]


def test_another_eps_is_named_by_its_argument(tmp_path: Path) -> None:
    result = _compare(tmp_path, {"ln": lambda h: F.layer_norm(h, (64,), eps=1e-2)})
    top = result.suspects[0]
    assert top.api == "Functional.layer_norm.0.forward"
    assert "eps: 0.01 vs 1e-05" in top.reason


def test_an_extra_cast_only_the_target_calls_is_judged_by_the_bench_precision(tmp_path: Path) -> None:
    """The target's GELU on bfloat16 values (``x.to(bfloat16)`` before it, ``.float()`` after): calls the
    bench does not make, a gap, whose boundary is judged by the bench's float32."""
    result = _compare(tmp_path, {"act": lambda h: F.gelu(h.to(torch.bfloat16)).float()})
    top = result.suspects[0]
    assert top.gap is not None and top.gap.startswith("target Tensor.to.2.forward")
    assert "the target rounds to bfloat16 where the bench stays in float32" in top.reason


def test_bfloat16_autocast_is_one_systematic_finding_and_no_call_is_named(tmp_path: Path) -> None:
    result = _compare(tmp_path, {}, autocast=True)
    assert result.suspects == []
    (finding,) = result.systematic
    assert finding.text.startswith("the target computes under bfloat16 autocast")
    assert finding.api_class == "matmul" and finding.first == "Functional.linear.0.forward"
    assert "Systematic: the target computes under bfloat16 autocast" in result.advice.text


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_a_fault_inside_an_autocast_run_is_still_named(tmp_path: Path, task: str) -> None:
    """Under bfloat16 autocast a tanh GELU hides inside bfloat16's rounding; its argument names it."""
    result = _compare(tmp_path, {"act": lambda h: F.gelu(h, approximate="tanh")}, task=task, autocast=True)
    assert [f.api_class for f in result.systematic] == ["matmul"]
    assert result.suspects[0].api == "Functional.gelu.0.forward"
    assert "approximate: 'tanh' vs not passed" in result.suspects[0].reason


def test_the_same_code_twice_names_nothing_and_finds_nothing(tmp_path: Path) -> None:
    result = _compare(tmp_path, {})
    assert result.suspects == [] and result.systematic == []


def test_the_replay_tells_an_argument_from_a_kernel(tmp_path: Path) -> None:
    """Each side replays right with its own arguments; the target's inputs with the bench's arguments give
    the bench's output: the verdict is ``arguments``, and the suspect's reason says so."""
    result = _compare(tmp_path, {"act": lambda h: F.gelu(h, approximate="tanh")}, replay_top=10)
    assert result.replay is not None
    verdicts = {v["entry"]: v for v in result.replay["verdicts"]}  # type: ignore[union-attr]
    gelu = verdicts["Functional.gelu.0.forward"]
    assert gelu["verdict"] == "arguments"
    assert gelu["text"].endswith("within rounding, so approximate: 'tanh' vs not passed is the cause")
    assert result.suspects[0].api == "Functional.gelu.0.forward"
    assert "float64 replay: with the bench's arguments the target's inputs give" in result.suspects[0].reason
    assert "the difference comes from their inputs" not in gelu["text"]


def test_the_replay_never_says_identical_inputs_made_the_difference(tmp_path: Path) -> None:
    """Under autocast the first linear reads identical inputs and each side is right in its own format: the
    difference is the formats (verdict ``precision``), not the inputs."""
    result = _compare(tmp_path, {}, autocast=True, replay_top=10)
    assert result.replay is not None
    verdicts = {v["entry"]: v for v in result.replay["verdicts"]}  # type: ignore[union-attr]
    first = verdicts["Functional.linear.0.forward"]
    assert first["verdict"] == "precision"
    assert "from identical inputs: the difference is the target's bfloat16 against the bench's float32" in (
        first["text"])
    assert result.suspects == []
