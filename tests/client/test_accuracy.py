"""The dumps find real precision problems: bf16 autocast is flagged, a noisy op is the first suspect."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import RowStatus
from torch.nn import functional as F

from tests.client.conftest import dump_once, model_and_input, train_step


def _compare(npu: Path, bench: Path):  # type: ignore[no-untyped-def]
    return compare_dumps(npu / "step0/rank0/dump.json", bench / "step0/rank0/dump.json", CompareOptions())


MODELS = ["mlp", "cnn", "transformer", "lstm"]
LEVELS = ["L0", "L1", "mix"]

# Per model: the op perturbed, and the module that calls it (where L0 sees the loss first). Each op is one
# whose wrapper below receives its arguments exactly as the real call does (F.max_pool2d would not: its
# boolean dispatch re-spells them as keywords), so only the output differs between the two runs.
PERTURBED = {
    "mlp": ("relu", "Module.act.ReLU"),
    "cnn": ("conv2d", "Module.conv.Conv2d"),
    "transformer": ("gelu", "Module.ff.1.GELU"),
    "lstm": ("linear", "Module.fc.Linear"),
}


Step = Callable[[], torch.Tensor]


def _autocast(step: Step) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return step()


def _bf16_rounded(step: Step) -> torch.Tensor:
    """bf16 rounding without bf16 kernels: every floating tensor an API receives is rounded to bf16 and
    back, and the maths runs in fp32 (what bf16 storage costs, on any CPU)."""

    class RoundInputs(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            def rounded(v: object) -> object:
                if isinstance(v, torch.Tensor) and v.is_floating_point():
                    return v + (v.detach().to(torch.bfloat16).float() - v.detach())
                return v

            return func(*map(rounded, args), **{k: rounded(v) for k, v in (kwargs or {}).items()})

    with RoundInputs():
        return step()


@functools.cache
def bf16_kernels(kind: str) -> bool:
    """Whether this CPU runs ``kind`` under bf16 autocast, forward and backward. Some x86-64 CPUs lack
    oneDNN's bf16 primitives (an AMD EPYC: "could not create a primitive descriptor for the LSTM forward
    propagation primitive"); torch raises there rather than falling back."""
    model, x = model_and_input(kind)
    try:
        _autocast(lambda: train_step(model, x))
    except RuntimeError:
        return False
    return True


def _assert_flagged(tmp_path: Path, kind: str, level: str, perturb: Callable[[Step], torch.Tensor]) -> None:
    # Real-data compare: bf16 rounding (~0.4%) is below the statistics-mode thresholds of a tiny model.
    npu = dump_once(tmp_path / "npu", kind, level, wrap=perturb, task="tensor")
    bench = dump_once(tmp_path / "bench", kind, level, task="tensor")
    result = _compare(npu, bench)
    failing = [r.api for r in result.rows if r.status in (RowStatus.FAIL, RowStatus.WARNING)]
    expected = "Module." if level == "L0" else ("Functional.", "VF.", "Torch.")
    assert any(api.startswith(expected) for api in failing), failing[:10]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", MODELS)
def test_bf16_autocast_against_fp32_is_flagged(tmp_path: Path, kind: str, level: str) -> None:
    # Where the CPU has no bf16 kernel for this model, the same check runs on bf16 rounding instead: the
    # check is never skipped, only its perturbation changes (and the test says so in its output).
    if bf16_kernels(kind):
        _assert_flagged(tmp_path, kind, level, _autocast)
    else:
        print(f"no bf16 kernels for {kind} on this CPU: bf16 rounding in fp32 instead of autocast")
        _assert_flagged(tmp_path, kind, level, _bf16_rounded)


def test_bf16_rounding_against_fp32_is_flagged(tmp_path: Path) -> None:
    """The fallback perturbation itself, on every CPU (so it is known to work where it is needed)."""
    _assert_flagged(tmp_path, "lstm", "mix", _bf16_rounded)


def test_the_bf16_probe_reports_a_missing_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_kernel(*args: object, **kwargs: object) -> object:
        raise RuntimeError("could not create a primitive descriptor for the LSTM forward propagation")

    bf16_kernels.cache_clear()
    monkeypatch.setattr(torch._VF, "lstm", no_kernel)
    try:
        assert bf16_kernels("lstm") is False
    finally:
        bf16_kernels.cache_clear()


def _noisy(name: str) -> Callable[..., torch.Tensor]:
    """``F.<name>`` with 1e-2 relative noise on its output, seen (and named) as one ``Functional`` call."""
    orig = getattr(F, name)

    def perturbed(*args: object, **kwargs: object) -> torch.Tensor:
        tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
        if torch.overrides.has_torch_function(tensors):
            return torch.overrides.handle_torch_function(perturbed, tensors, *args, **kwargs)
        out = orig(*args, **kwargs)
        noise = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
        return out * (1 + 1e-2 * noise)

    perturbed.__module__ = "torch.nn.functional"
    perturbed.__name__ = perturbed.__qualname__ = name
    return perturbed


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", MODELS)
def test_perturbed_op_is_first_suspect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, level: str
) -> None:
    # Real-data compare: 1e-2 elementwise noise hardly moves max/min/mean/norm, but it moves cosine and
    # relative error, so the forward output is where the loss is first seen.
    op, module = PERTURBED[kind]
    bench = dump_once(tmp_path / "bench", kind, level, task="tensor")
    monkeypatch.setattr(F, op, _noisy(op))
    npu = dump_once(tmp_path / "npu", kind, level, task="tensor")
    result = _compare(npu, bench)
    assert result.suspects, [r.api for r in result.rows if r.status is not RowStatus.PASS][:10]
    expected = f"{module}.forward.0" if level == "L0" else f"Functional.{op}.0.forward"
    assert result.suspects[0].api == expected, [s.api for s in result.suspects]
