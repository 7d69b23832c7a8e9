"""A slice of the injected-fault suite (``benchmarks/bench_localization.py``) end to end: a real training
step dumped by Parity's client with one call degraded, compared by the engine, the faulty API named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import localization_suite as suite  # noqa: E402

pytestmark = pytest.mark.slow

CASES = [
    suite.Fault("mlp", "Functional.gelu", 0, "noise-1e-3"),  # forward, below msprobe's thresholds
    suite.Fault("mlp", "Functional.linear", 1, "bwd-fp16"),  # backward only
    suite.Fault("gpt", "Functional.softmax", 0, "bf16"),  # behind the causal mask's identical -inf fill
]


@pytest.fixture(scope="module")
def benches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bench")
    return {family: suite.dump_run(root / family, family) for family in ("mlp", "gpt")}


@pytest.mark.parametrize("fault", CASES, ids=lambda f: f.label)
def test_the_faulty_call_is_the_top_suspect_and_the_first_divergence(
    fault: suite.Fault, benches: dict[str, Path], tmp_path: Path
) -> None:
    target = suite.dump_run(tmp_path / "target", fault.family, fault=fault)
    ranked, first, _ = suite.compare(target, benches[fault.family])
    assert ranked[:1] == [fault.entry] and first == fault.entry


def test_an_identical_gpt_run_names_no_suspect(benches: dict[str, Path], tmp_path: Path) -> None:
    same = suite.dump_run(tmp_path / "same", "gpt")
    assert suite.compare(same, benches["gpt"])[:2] == ([], None)


@pytest.mark.parametrize("kernel", suite.KERNELS)
def test_a_gpt_run_on_another_kernel_names_no_call(
    kernel: str, benches: dict[str, Path], tmp_path: Path
) -> None:
    """Another device's kernels (every reduction in float64, or also TF32 matmuls), no fault: no call is
    named; TF32 is one systematic finding of the matmul class."""
    target = suite.dump_run(tmp_path / kernel, "gpt", kernel=kernel)
    ranked, first, _, systematic = suite.judged(target, benches["gpt"])
    assert (ranked, first) == ([], None)
    assert len(systematic) == (kernel == "tf32")
    assert all(f.startswith("every matmul-class call differs by ~") for f in systematic)


def test_a_fault_on_another_kernel_is_the_top_suspect(benches: dict[str, Path], tmp_path: Path) -> None:
    fault = suite.Fault("mlp", "Functional.linear", 1, "fp16")
    target = suite.dump_run(tmp_path / "target", "mlp", fault=fault, kernel="f64")
    assert suite.compare(target, benches["mlp"])[0][:1] == [fault.entry]


def test_the_tf32_stand_in_rounds_gemm_operands_not_a_views_backward(tmp_path: Path) -> None:
    """Real TF32 rounds a GEMM's operands and writes float32: a 3-D linear's recorded backward (its view's,
    handing on the incoming gradient) stays exact, and holds no float16 values a fault could hide among;
    the GEMM under it does round (its gradient for the layer before differs from the bench's)."""
    import json

    from parity.shared.replay.precision import held_format

    def tensors(dump: Path, entry: str, key: str) -> list[torch.Tensor]:
        data = json.loads(dump.read_text())["data"][entry][key]
        folder = dump.parent / "dump_tensor_data"
        return [torch.load(folder / t["data_name"], weights_only=True) for t in data]

    bench = suite.dump_run(tmp_path / "bench", "lstm")
    target = suite.dump_run(tmp_path / "tf32", "lstm", kernel="tf32")
    entry = "Functional.linear.0.backward"
    (grad_in,), (grad_out,) = tensors(target, entry, "input"), tensors(target, entry, "output")
    assert torch.equal(grad_out, grad_in.reshape(grad_out.shape))
    assert held_format([grad_out], [grad_in]) is None and not torch.equal(grad_out, grad_out.half().float())
    above = "Functional.layer_norm.0.backward"  # its incoming gradient is what the linear's GEMM handed up
    assert not torch.equal(tensors(target, above, "input")[0], tensors(bench, above, "input")[0])
