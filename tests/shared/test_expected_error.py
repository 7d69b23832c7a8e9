"""The expected-error model (the rounding a correct kernel may add, from the recorded shapes and arguments),
the systematic finding (a target whose every matmul-class call differs by TF32's rounding), and the advisor's
three lines agreeing with the ranked suspects (issue 22, items 1 and 3)."""

from __future__ import annotations

import dataclasses
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from parity.shared.compare import advisor
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.expected_error import (
    Recorded,
    api_class,
    expected_rounding,
    op_of,
    reduction_length,
    unit_roundoff,
)
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import CompareResult
from parity.shared.replay.verdicts import ReplayVerdict, SideReplay, Verdict

from tests.factories import DumpBuilder

T = Recorded  # a tensor argument: its shape


def S(value: float) -> Recorded:  # noqa: N802 - a scalar argument, as the dump records it
    return Recorded((), value)


@pytest.mark.parametrize(
    ("op", "direction", "args", "length"),
    [
        ("linear", "forward", {"input.0": T((16, 32)), "input.1": T((64, 32))}, 32),
        ("linear", "backward", {"input.0": T((16, 32)), "input.1": T((64, 32))}, 64),  # grad_x sums over 64
        ("matmul", "forward", {"input.0": T((2, 8, 16)), "input.1": T((2, 16, 8))}, 16),
        ("bmm", "forward", {"input.0": T((4, 5, 40)), "input.1": T((4, 40, 3))}, 40),
        ("addmm", "forward", {"input.0": T((7,)), "input.1": T((3, 50)), "input.2": T((50, 7))}, 50),
        ("conv2d", "forward", {"input.0": T((4, 8, 16, 16)), "input.1": T((16, 8, 3, 3))}, 72),  # C_in*kh*kw
        ("conv2d", "backward",
         {"input.0": T((4, 8, 16, 16)), "input.1": T((16, 8, 3, 3)), "output.0": T((4, 16, 16, 16))}, 1024),
        ("layer_norm", "forward", {"input.0": T((4, 8, 96)), "input.1.0": S(96)}, 96),  # normalized_shape
        ("layer_norm", "forward", {"input.0": T((4, 8, 96)), "input.1.0": S(8), "input.1.1": S(96)}, 768),
        ("batch_norm", "forward", {"input.0": T((4, 8, 5, 5))}, 100),  # N*H*W per channel
        ("group_norm", "forward", {"input.0": T((4, 8, 5, 5)), "input.1": S(2)}, 100),
        ("softmax", "forward", {"input.0": T((2, 10, 30)), "input.dim": S(1)}, 10),  # a keyword dim
        ("log_softmax", "forward", {"input.0": T((2, 10, 30)), "input.1": S(-1)}, 30),
        ("sum", "forward", {"input.0": T((6, 7))}, 42),  # no dim: everything
        ("mean", "forward", {"input.0": T((6, 7, 5)), "input.1.0": S(0), "input.1.1": S(2)}, 30),
        ("scaled_dot_product_attention", "forward",
         {"input.0": T((2, 4, 8, 16)), "input.1": T((2, 4, 128, 16))}, 128),  # key sequence > head dim
        ("cross_entropy", "forward", {"input.0": T((8, 50)), "input.1": T((8,))}, 50),  # classes
        ("lstm", "forward", {"input.0": T((4, 8, 16)), "input.1.0": T((1, 4, 32))}, (16 + 32) * 8),
        ("gelu", "forward", {"input.0": T((16, 64))}, 1),  # elementwise
        ("embedding", "backward", {"input.0": T((4, 8)), "input.1": T((50, 32))}, 32),  # summed tokens
    ],
)  # fmt: skip
def test_reduction_length_comes_from_the_recorded_arguments(
    op: str, direction: str, args: dict[str, Recorded], length: int
) -> None:
    assert reduction_length(op, direction, args) == length


def test_expected_rounding_grows_with_the_reduction_and_with_a_coarser_dtype() -> None:
    def linear(k: int, dtype: str) -> float:
        return expected_rounding("linear", "forward", {"input.0": T((8, k))}, unit_roundoff(dtype))

    lengths = [1, 2, 16, 256, 4096]
    assert all(linear(a, "torch.float32") < linear(b, "torch.float32") for a, b in pairwise(lengths))
    dtypes = ["torch.float64", "torch.float32", "torch.float16", "torch.bfloat16"]
    assert all(linear(64, a) < linear(64, b) for a, b in pairwise(dtypes))
    u32 = unit_roundoff("torch.float32")
    assert expected_rounding("relu", "forward", {}, u32) == 2.0**-24  # an elementwise op: one rounding
    assert unit_roundoff("torch.int64") == 0.0 and unit_roundoff(None) == 0.0


def test_ops_and_classes_from_entry_names() -> None:
    assert op_of("Functional.linear.3.backward") == "linear"
    assert op_of("Tensor.__matmul__.0.forward") == "matmul"
    assert op_of("Module.blocks.0.fc.Linear.forward.0") == "linear"
    assert [api_class(o) for o in ("conv2d", "layer_norm", "log_softmax", "mean", "nll_loss", "gelu")] == [
        "matmul", "norm", "softmax", "reduce", "loss", "elementwise"]  # fmt: skip


# ------------------------------------------------------------------------------------------------------
# a pair of "devices": the target's matmuls round their operands to TF32, elementwise ops are exact


def _tf32(a: np.ndarray) -> np.ndarray:
    bits = a.astype(np.float32).view(np.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(np.float32).astype(np.float64)


def _device_pair(fault_at: int | None = None, layers: int = 5, *, tf32: bool = True,
                 fp16_tanh_at: int | None = None,
                 linear_fault_at: int | None = None) -> tuple[DumpBuilder, DumpBuilder]:  # fmt: skip
    """``layers`` x (linear, tanh, layer_norm over 64 as a keyword list), computed in float64 and rounded to
    float32: the bench exactly, the target with TF32 operands for its linears (``tf32``); ``fault_at``: the
    target's ``tanh`` call there adds 1e-2 relative noise; ``fp16_tanh_at``: it computes in float16;
    ``linear_fault_at``: the target's ``linear`` call there adds 1e-3 relative noise."""
    rng = np.random.default_rng(0)
    npu, bench = DumpBuilder(), DumpBuilder()
    x = xb = rng.standard_normal((32, 64)).astype(np.float32)
    operand = _tf32 if tf32 else (lambda a: a.astype(np.float64))
    for k in range(layers):
        w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
        b = (rng.standard_normal(64) / 8).astype(np.float32)
        y = (operand(x) @ operand(w).T + b).astype(np.float32)
        yb = (xb.astype(np.float64) @ w.T.astype(np.float64) + b).astype(np.float32)
        if k == linear_fault_at:
            y = (y * (1 + 1e-3 * rng.standard_normal(y.shape))).astype(np.float32)
        npu.api(f"Functional.linear.{k}.forward", [x, w, b], [y])
        bench.api(f"Functional.linear.{k}.forward", [xb, w, b], [yb])
        t, tb = np.tanh(y), np.tanh(yb)
        if k == fault_at:
            t = (t * (1 + 1e-2 * rng.standard_normal(t.shape))).astype(np.float32)
        if k == fp16_tanh_at:
            t = np.tanh(y.astype(np.float16)).astype(np.float32)
        npu.api(f"Functional.tanh.{k}.forward", [y], [t])
        bench.api(f"Functional.tanh.{k}.forward", [yb], [tb])
        x, xb = (_norm(v) for v in (t, tb))
        npu.api(f"Functional.layer_norm.{k}.forward", [t], [x], kwargs={"normalized_shape": [64]})
        bench.api(f"Functional.layer_norm.{k}.forward", [tb], [xb], kwargs={"normalized_shape": [64]})
    return npu, bench


def _norm(v: np.ndarray) -> np.ndarray:
    v64 = v.astype(np.float64)
    centred = v64 - v64.mean(-1, keepdims=True)
    return (centred / np.sqrt(v64.var(-1, keepdims=True) + 1e-5)).astype(np.float32)


def _compare(tmp_path: Path, npu: DumpBuilder, bench: DumpBuilder, replay_top: int = 10) -> CompareResult:
    return compare_dumps(npu.write(tmp_path / "npu"), bench.write(tmp_path / "bench"),
                         CompareOptions(replay_top=replay_top))  # fmt: skip


def test_every_matmul_differing_by_tf32_rounding_is_one_finding_and_no_suspect(tmp_path: Path) -> None:
    result = _compare(tmp_path, *_device_pair())
    assert result.suspects == [] and result.first_divergence is None
    (finding,) = result.systematic
    assert finding.api_class == "matmul" and finding.first == "Functional.linear.0.forward"
    assert 1e-4 < finding.level < 2e-3 and finding.differing == finding.calls == 5
    assert finding.text.startswith("every matmul-class call differs by ~")
    assert "TF32 or a lower-precision accumulation on the target" in finding.text
    # The three lines say so, and name no node.
    assert result.advice.line is None and result.advice.suspect_node is None
    assert finding.text in result.advice.text
    # The float64 replay of the class's first call decides the alternative: it sits at the class's level.
    assert "The float64 replay of Functional.linear.0.forward: target output " in result.advice.text
    assert "both kernels agree with float64 within rounding" in result.advice.text
    assert result.summary()["systematic"] == [finding.as_dict()]
    # Without a replay the advice says to run one.
    table_only = _compare(tmp_path / "table", *_device_pair(), replay_top=0).advice.text
    assert advisor.SYSTEMATIC_ALTERNATIVE.format(first="Functional.linear.0.forward") in table_only


def test_a_fault_behind_a_systematic_difference_is_the_top_suspect_and_the_advice(tmp_path: Path) -> None:
    result = _compare(tmp_path, *_device_pair(fault_at=2))
    assert [s.api for s in result.suspects][:1] == ["Functional.tanh.2.forward"]
    assert [f.api_class for f in result.systematic] == ["matmul"]
    # One judgement: "Suspect Nodes" is the top suspect's output row, with msprobe's hint and the finding.
    top = result.suspects[0]
    assert result.advice.line == top.row_index
    assert result.advice.suspect_node == "Functional.tanh.2.forward.output.0"
    # ... the replay's verdict on it, then msprobe's words for a computation error, then the finding.
    replayed = result.replay["verdicts"][0]  # type: ignore[index]
    assert replayed["entry"] == top.api and replayed["verdict"] == "target"
    assert result.advice.text.startswith(f"{replayed['text']}. {advisor.FORWARD_OUTPUT_SUGGEST}")
    assert result.systematic[0].text in result.advice.text


def test_the_rounding_of_each_call_is_read_from_its_recorded_shapes_and_keywords(tmp_path: Path) -> None:
    from parity.shared.compare.localization import localize

    result = _compare(tmp_path, *_device_pair(layers=1))
    states = [r.cells[0].split(".forward.")[1].split(".")[0] for r in result.rows]  # input / output
    judged = localize(result.rows, states, result.facts, result.mode).judged
    rounding = dict(zip(judged.columns.apis, judged.rounding.tolist(), strict=True))
    u = 2.0**-24
    linear = expected_rounding("linear", "forward", {"input.0": T((32, 64))}, u)  # K = 64
    norm = expected_rounding("layer_norm", "forward", {"input.1.0": S(64)}, u)  # the normalized size
    assert rounding["Functional.linear.0.forward"] == linear
    assert rounding["Functional.layer_norm.0.forward"] == norm
    assert rounding["Functional.tanh.0.forward"] == u


def _verdict(entry: str, target: float, bench: float) -> ReplayVerdict:
    from parity.shared.replay.verdicts import verdict_of

    def side(name: str, distance: float) -> SideReplay:
        return SideReplay(name, distance=distance, allowance=3e-6, reduction_length=1, dtype="float32")

    return verdict_of(entry, "forward", side("target", target), side("bench", bench))


def test_a_replay_verdict_is_what_the_advice_says_of_the_top_suspect(tmp_path: Path) -> None:
    """The seam the float64 replay fills: a verdict on the top suspect replaces msprobe's guess."""
    from parity.shared.compare.localization import localize

    result = _compare(tmp_path, *_device_pair(fault_at=2), replay_top=0)
    states = [r.cells[0].split(".forward.")[1].split(".")[0] for r in result.rows]
    loc = localize(result.rows, states, result.facts, result.mode)
    verdict = _verdict("Functional.tanh.2.forward", 1e-2, 3e-8)
    assert verdict.verdict is Verdict.TARGET and verdict.wrong == "target"
    assert verdict.text.endswith("the target's kernel is wrong")
    advice = advisor.advise(result.rows, result.facts.names, result.mode, loc, {verdict.api: verdict})
    assert advice.suspect_node == "Functional.tanh.2.forward.output.0"
    assert advice.text.startswith(f"{verdict.text}. {advisor.FORWARD_OUTPUT_SUGGEST}")
    bench_wrong = _verdict(verdict.api, 3e-8, 1e-2)
    assert bench_wrong.wrong == "bench"
    text = advisor.advise(result.rows, result.facts.names, result.mode, loc, {verdict.api: bench_wrong}).text
    assert advisor.BENCH_WRONG_SUGGEST in text


# ------------------------------------------------------------------------------------------------------
# the float64 replay in the judgement (tensor mode): it re-ranks, and every line says what it found


def test_the_ranked_list_the_advisor_lines_and_the_replay_section_agree(tmp_path: Path) -> None:
    result = _compare(tmp_path, *_device_pair(fault_at=2))
    doc = result.replay
    assert doc is not None and doc["note"] is None and doc["replayed"] >= len(doc["verdicts"])
    shown = [v["entry"] for v in doc["verdicts"]]  # type: ignore[union-attr]
    ranked = [s.api for s in result.suspects]
    assert shown[: len(ranked)] == ranked[: len(shown)]
    assert shown[0] == ranked[0] == "Functional.tanh.2.forward"
    assert result.advice.suspect_node == f"{ranked[0]}.output.0"
    assert "the target's kernel is wrong" in result.advice.text.splitlines()[0]
    assert "float64 replay: target output " in result.suspects[0].reason  # the suspect's evidence too
    # The class's other calls replay at the TF32 level the finding names: none of them is blamed.
    linears = [v for v in doc["verdicts"] if "linear" in str(v["entry"])]  # type: ignore[union-attr]
    assert all(v["verdict"] == "neither" for v in linears), linears


def test_a_first_matmul_fault_behind_a_systematic_finding_is_named_by_the_replay(tmp_path: Path) -> None:
    """A fault in the first linear carries into every later one: from the table alone, a systematic finding.
    Its replay is far beyond the class's others' (which replay within rounding): it is the suspect, and the
    finding is withdrawn."""
    npu, bench = _device_pair(tf32=False, linear_fault_at=0)
    table = _compare(tmp_path / "table", npu, bench, replay_top=0)
    assert [f.first for f in table.systematic] == ["Functional.linear.0.forward"]
    assert "Functional.linear.0.forward" not in [s.api for s in table.suspects][:1]
    result = _compare(tmp_path / "replay", npu, bench)
    assert [s.api for s in result.suspects][:1] == ["Functional.linear.0.forward"]
    assert result.systematic == []
    assert result.first_divergence is not None
    assert result.first_divergence.api == "Functional.linear.0.forward"
    assert result.advice.suspect_node == "Functional.linear.0.forward.output.0"
    assert "the target's kernel is wrong" in result.advice.text


def test_an_fp16_internal_elementwise_fault_under_a_tf32_target_is_named_first(tmp_path: Path) -> None:
    """tanh computed in float16 on a TF32 target: its table error is no bigger than what the TF32 linear
    before it carries in, but its output is far from its own float64 replay, where a correct tanh is within
    one rounding."""
    result = _compare(tmp_path, *_device_pair(fp16_tanh_at=3))
    assert [s.api for s in result.suspects][:1] == ["Functional.tanh.3.forward"]
    assert [f.api_class for f in result.systematic] == ["matmul"]  # TF32 stays a finding, no call's fault
    verdicts = {v["entry"]: v for v in result.replay["verdicts"]}  # type: ignore[index]
    assert verdicts["Functional.tanh.3.forward"]["verdict"] == "target"
    assert result.advice.suspect_node == "Functional.tanh.3.forward.output.0"


def test_a_call_that_rounds_nothing_is_blamed_for_float16_values_and_teaches_no_level() -> None:
    """A 3-D linear's recorded backward is its view's: the bench's replays exactly. A target whose values
    there fit float16 while its incoming gradient's do not went through float16 (a fault, whatever its
    distance); and such calls do not pull their class's level to zero for the class's real GEMMs."""
    from parity.shared.compare.replay_judgement import _levels
    from parity.shared.replay.verdicts import verdict_of

    exact = SideReplay("bench", distance=0.0, allowance=3e-6, reduction_length=1, dtype="float32")
    held = SideReplay("target", distance=2e-6, allowance=3e-6, reduction_length=1, dtype="float32",
                      held="float16")  # fmt: skip
    assert verdict_of("Functional.linear.0.backward", "backward", held, exact).verdict is Verdict.TARGET
    plain = dataclasses.replace(held, held=None)
    assert verdict_of("Functional.linear.0.backward", "backward", plain, exact).verdict is Verdict.NEITHER

    def gemm(entry: str, target: float, bench: float) -> ReplayVerdict:
        side = dataclasses.replace(exact, distance=bench)
        return ReplayVerdict(entry, "backward", Verdict.NEITHER, dataclasses.replace(plain, distance=target),
                             side, "")  # fmt: skip

    views = [gemm(f"Functional.linear.{k}.backward", 0.0, 0.0) for k in range(3)]
    real = [gemm(f"Functional.linear.{k}.backward", 3e-4, 4e-8) for k in (3, 4, 5)]
    levels = _levels([*views, *real], {v.entry: "matmul" for v in [*views, *real]})
    assert levels["Functional.linear.5.backward"] == pytest.approx(3e-4)
