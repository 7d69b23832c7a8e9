"""The localization model's rules (issue 10): identical values are never suspects, execution order across
forward and backward, the noise floor learned from the run pair, the user-code stack frame, md5 mode and
the rank that diverged first."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from parity.shared.compare.call_errors import CallColumns, statistics_errors
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.facts import RowFacts, _number
from parity.shared.compare.localization import (
    SUSPECT_SCORE,
    CallEvidence,
    _allow_for_small_tensors,
    first_diverged_rank,
    first_divergence,
    stats_error,
    user_frame,
)
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import CompareResult, Suspect
from parity.shared.dump.columns import ColumnsBuilder
from parity.shared.report.advisor import advisor_text

from tests.factories import DumpBuilder, stats_leaf, write_raw_dump

OPTIONS = CompareOptions()


def _chain(rng: np.random.Generator, n_calls: int, noise: float, fault_at: int | None, fault: float,
           seed_noise: int = 1) -> tuple[DumpBuilder, DumpBuilder]:  # fmt: skip
    """Two runs of ``n_calls`` chained calls ``Torch.f{k}`` (each feeds the next), then the loss's backward
    (fed the identical gradient 1, as every backward starts); the target run adds a relative ``noise`` at
    every call and ``fault`` at call ``fault_at``."""
    noise_rng = np.random.default_rng(seed_noise)
    npu, bench = DumpBuilder(), DumpBuilder()
    x = rng.standard_normal(512).astype(np.float32)
    xb = x.copy()
    for k in range(n_calls):
        yb = np.tanh(xb * 1.1).astype(np.float32)
        y = np.tanh(x * 1.1).astype(np.float32)
        rel = noise + (fault if k == fault_at else 0.0)
        if rel:
            y = (y * (1 + rel * noise_rng.standard_normal(512))).astype(np.float32)
        npu.api(f"Torch.f{k}.0.forward", [x], [y])
        bench.api(f"Torch.f{k}.0.forward", [xb], [yb])
        x, xb = y, yb
    grad = np.ones(512, dtype=np.float32)
    g_bench = (xb * 0.5).astype(np.float32)
    g_npu = (g_bench * (1 + noise * noise_rng.standard_normal(512))).astype(np.float32)
    npu.api("Torch.loss.0.backward", [grad], [g_npu])
    bench.api("Torch.loss.0.backward", [grad], [g_bench])
    return npu, bench


def _compare_raw(tmp_path: Path, npu: dict[str, object], bench: dict[str, object]) -> CompareResult:
    return compare_dumps(write_raw_dump(tmp_path / "n", npu), write_raw_dump(tmp_path / "b", bench), OPTIONS)


def _compare(tmp_path: Path, npu: DumpBuilder, bench: DumpBuilder) -> CompareResult:
    return compare_dumps(npu.write(tmp_path / "npu"), bench.write(tmp_path / "bench"), OPTIONS)


# ------------------------------------------------------------------------------------------------------
# identical values, identical NaN/Inf positions included


def test_identical_non_finite_values_are_never_suspects(tmp_path: Path) -> None:
    """GPT's causal mask: ``masked_fill(att, mask, -inf)`` with the scalar -inf on both sides and -inf at the
    same positions of the output is no loss of precision, whatever msprobe's highlight rule says."""
    att = np.arange(16, dtype=np.float32).reshape(4, 4)
    mask = np.triu(np.ones((4, 4), dtype=bool), 1)
    filled = np.where(mask, -np.inf, att).astype(np.float32)
    soft = np.exp(filled - filled.max(axis=1, keepdims=True))
    soft = (soft / soft.sum(axis=1, keepdims=True)).astype(np.float32)
    runs = []
    for _ in range(2):
        b = DumpBuilder()
        b.api("Tensor.masked_fill.0.forward", [att, mask, float("-inf")], [filled])
        b.api("Functional.softmax.0.forward", [filled], [soft])
        runs.append(b)
    result = _compare(tmp_path, *runs)
    assert result.suspects == [] and result.first_divergence is None
    assert result.advice.line is None  # the three lines give the all-clear too
    assert "Top suspects: none" in advisor_text(result)


def test_identical_nan_statistics_are_not_an_error() -> None:
    nan, inf = float("nan"), float("inf")
    assert stats_error([nan, -inf, nan, nan], [nan, -inf, nan, nan]) == 0.0
    assert stats_error([1.0, -inf, nan, inf], [1.0, -inf, nan, inf]) == 0.0
    assert stats_error([nan, 0.0, 0.5, 1.0], [1.0, 0.0, 0.5, 1.0]) == float("inf")
    assert stats_error([1.0, -inf, nan, inf], [2.0, -inf, nan, inf]) == pytest.approx(0.5)


def test_nan_in_an_output_whose_inputs_agree_is_the_top_suspect(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(64).astype(np.float32)
    y = np.tanh(x)
    bad = y.copy()
    bad[5] = np.nan
    npu = DumpBuilder().api("Torch.f.0.forward", [x], [bad]).api("Torch.g.0.forward", [bad], [bad * 2])
    bench = DumpBuilder().api("Torch.f.0.forward", [x], [y]).api("Torch.g.0.forward", [y], [y * 2])
    result = _compare(tmp_path, npu, bench)
    assert [s.api for s in result.suspects] == ["Torch.f.0.forward"]  # g only inherits the NaN
    assert "NaN/Inf positions" in result.suspects[0].reason


def _facts(rows: list[tuple[str, tuple[object, ...], tuple[object, ...], tuple[int, ...]]]) -> RowFacts:
    """The facts of rows ``(name, NPU statistics, bench statistics, dims)``, through the dump's columns."""
    sides = (ColumnsBuilder(), ColumnsBuilder())
    shapes: dict[tuple[int, ...], str] = {}
    for name, npu, bench, dims in rows:
        text = shapes.setdefault(dims, str(list(dims)))
        for builder, stats in zip(sides, (npu, bench), strict=True):
            builder.entry_names.append(name)
            builder.entry_starts.append(len(builder))
            builder.add(f"{name}.output.0", "output", "torch.float32", text, None, stats, None, None, True)  # type: ignore[arg-type]
    n, b = (builder.build(shapes) for builder in sides)
    index = np.arange(len(rows))
    return RowFacts.build([r[0] for r in rows], n, index, b, index)


def test_the_column_wise_statistics_errors_equal_the_row_rule() -> None:
    """The column-wise rule over the facts gives the one-row rule's floats, on a table that mixes NaN, inf,
    None, ints, msprobe's texts, equal and zero values."""
    rng = np.random.default_rng(3)
    odd: list[object] = [float("nan"), float("inf"), -float("inf"), None, 0, 3, "Nan", "N/A", 0.0, True]
    rows = []
    for k in range(400):
        npu = rng.standard_normal(4) * 10.0 ** rng.integers(-8, 8)
        bench = npu * (1 + rng.standard_normal(4) * 10.0 ** -rng.integers(1, 9))
        stats: list[object] = [*npu.tolist(), *(bench if k % 5 else npu).tolist()]
        if k % 3 == 0:
            stats[int(rng.integers(8))] = odd[int(rng.integers(len(odd)))]
        rows.append((f"Torch.f.{k}.forward", tuple(stats[:4]), tuple(stats[4:]), (4,)))
    plain = [stats_error([_number(x) for x in n], [_number(x) for x in b]) for _, n, b, _ in rows]
    vector = statistics_errors(_facts(rows)).tolist()
    assert [None if v != v else v for v in vector] == plain
    assert sum(v == 0.0 for v in plain) >= 50


def test_a_mask_equal_on_both_sides_is_no_data_to_the_statistics_error() -> None:
    """Scores masked with float32's minimum: the mask sets no magnitude and swamps Mean and Norm, so the
    error is the unmasked maximum's (1e-3 here), not 1e-3 against 3.4e38."""
    low = -3.4028234663852886e38
    rows = [("Torch.add.0.forward", (2.002, low, -1e37, 3e38), (2.0, low, -1e37, 3e38), (4, 4))]
    assert statistics_errors(_facts(rows))[0] == pytest.approx(1e-3, rel=1e-2)


# ------------------------------------------------------------------------------------------------------
# execution order


def test_first_divergence_follows_execution_order_across_forward_and_backward(tmp_path: Path) -> None:
    """A backward call that ran before the optimizer's update is the first divergence, although a forward
    entry (the update, recorded after backward) also stands out: execution order, not forward first."""
    ok, bad = stats_leaf(1.0, -1.0, 0.0, 4.0), stats_leaf(1.0, -1.0, 0.0, 4.04)  # 1e-2 off
    w, w_bad = stats_leaf(2.0, -2.0, 0.0, 8.0), stats_leaf(2.0, -2.0, 0.0, 16.0)  # 1.0 off
    npu = {
        "Functional.linear.0.forward": {"input_args": [ok], "output": [ok]},
        "Functional.linear.0.backward": {"input": [ok], "output": [bad]},  # the fault
        # the optimizer's update, recorded after backward: its error jumps far above its input's too
        "Tensor.add_.0.forward": {"input_args": [w, bad], "output": [w_bad]},
    }
    bench = {
        "Functional.linear.0.forward": {"input_args": [ok], "output": [ok]},
        "Functional.linear.0.backward": {"input": [ok], "output": [ok]},
        "Tensor.add_.0.forward": {"input_args": [w, ok], "output": [w]},
    }
    result = _compare_raw(tmp_path, npu, bench)
    assert {s.api for s in result.suspects} == {"Functional.linear.0.backward", "Tensor.add_.0.forward"}
    assert result.first_divergence is not None
    assert result.first_divergence.api == "Functional.linear.0.backward"
    assert result.advice.suspect_node == "Functional.linear.0.backward.output.0"


def test_an_error_that_does_not_carry_on_is_not_the_first_divergence() -> None:
    """A logging-only call stands out first but nothing reads its output; the first divergence is the
    first suspect whose error reaches a later call's inputs."""
    log = CallEvidence("Torch.norm.0.forward", 0, 0, 0, 0.0, 1e-1, score=5.0)
    fault = CallEvidence("Torch.f.0.forward", 1, 1, 1, 0.0, 1e-2, score=4.0)
    after = CallEvidence("Torch.g.0.forward", 2, 2, 2, 1e-2, 1e-2, score=-0.1)
    inputs = np.array([c.input_err for c in (log, fault, after)])
    assert first_divergence(inputs, [log, fault]) is fault
    assert first_divergence(inputs[:2], [log, fault]) is log  # nothing after either: the earliest


# ------------------------------------------------------------------------------------------------------
# the noise floor


def test_a_jump_above_the_background_is_found_and_ranked_first(tmp_path: Path) -> None:
    """Every call carries 1e-5 noise (two devices' kernels); call 6 adds 1e-3: it is the top suspect,
    although msprobe's fixed thresholds pass every row."""
    npu, bench = _chain(np.random.default_rng(0), 12, 1e-5, 6, 1e-3)
    result = _compare(tmp_path, npu, bench)
    assert result.suspects[0].api == "Torch.f6.0.forward"
    assert result.first_divergence is not None and result.first_divergence.api == "Torch.f6.0.forward"
    assert "the background" in result.suspects[0].reason


def test_noise_alone_names_no_suspect(tmp_path: Path) -> None:
    npu, bench = _chain(np.random.default_rng(1), 12, 1e-5, None, 0.0)
    result = _compare(tmp_path, npu, bench)
    assert result.suspects == [] and result.first_divergence is None


def test_the_same_error_without_background_is_found(tmp_path: Path) -> None:
    npu, bench = _chain(np.random.default_rng(2), 12, 0.0, 4, 1e-6)
    result = _compare(tmp_path, npu, bench)
    assert [s.api for s in result.suspects][:1] == ["Torch.f4.0.forward"]


def test_row_scores_rank_the_faulty_call_first(tmp_path: Path) -> None:
    npu, bench = _chain(np.random.default_rng(0), 8, 1e-5, 3, 1e-2)
    result = _compare(tmp_path, npu, bench)
    assert result.row_scores is not None and len(result.row_scores) == len(result.rows)
    best = max(range(len(result.rows)), key=lambda i: result.row_scores[i] or -1e9)  # type: ignore[index]
    assert result.rows[best].api == "Torch.f3.0.forward"


def _training(n_calls: int, noise: float, fault_at: int | None, fault: float, *, seed: int = 0,
              updates: bool = True) -> tuple[DumpBuilder, DumpBuilder]:  # fmt: skip
    """A training step in miniature, each side computed from its own values: ``n_calls`` chained forward
    calls, the loss (forward, and its backward fed the identical gradient 1), then one SGD update per call
    (``w - 0.01 * grad``: small gains, as an optimizer has). The target run adds a fresh relative ``noise``
    to every output and ``fault`` at forward call ``fault_at``; the first call is the only one whose inputs
    are identical."""
    rng, noise_rng = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    runs = (DumpBuilder(), DumpBuilder())
    x0 = rng.standard_normal(512).astype(np.float32)
    weights = [rng.standard_normal(512).astype(np.float32) for _ in range(n_calls)]
    for side, run in enumerate(runs):
        target = side == 0

        def out(value: np.ndarray, extra: float = 0.0, *, target: bool = target) -> np.ndarray:
            rel = (noise + extra) if target else 0.0
            return (value * (1 + rel * noise_rng.standard_normal(value.shape))).astype(np.float32)

        x = x0
        for k in range(n_calls):
            y = out(np.tanh(x * weights[k]), fault if k == fault_at else 0.0)
            run.api(f"Torch.f{k}.0.forward", [x, weights[k]], [y])
            x = y
        loss = out(0.5 * x * x)
        run.api("Torch.loss.0.forward", [x], [loss])
        grad = out(x.copy())
        run.api("Torch.loss.0.backward", [np.ones(512, dtype=np.float32)], [grad])
        if updates:
            for k in range(n_calls):
                run.api(f"Tensor.add_.{k}.forward", [weights[k], grad], [out(weights[k] - 0.01 * grad)])
    return runs


def test_a_noisy_pair_without_a_fault_names_nothing_not_even_its_first_call(tmp_path: Path) -> None:
    """The first call is the only one with identical inputs: its error alone is no yardstick for itself,
    and the later calls' fresh background says it is noise."""
    for noise in (1e-6, 1e-4):
        result = _compare(tmp_path / f"{noise}", *_training(12, noise, None, 0.0))
        assert result.suspects == [] and result.first_divergence is None


def test_a_noisy_pair_with_a_fault_at_its_first_call_names_it(tmp_path: Path) -> None:
    result = _compare(tmp_path, *_training(12, 1e-5, 0, 1e-3))
    assert [s.api for s in result.suspects][:1] == ["Torch.f0.0.forward"]
    assert result.first_divergence is not None and result.first_divergence.api == "Torch.f0.0.forward"


def test_an_exact_pair_with_a_fault_at_its_first_call_names_it(tmp_path: Path) -> None:
    """Without noise: named through the damped later calls, and, where nothing damps it (a forward chain
    alone), through a call that computes exactly from identical inputs (the pair has no background)."""
    result = _compare(tmp_path / "step", *_training(12, 0.0, 0, 1e-4))
    assert [s.api for s in result.suspects][:1] == ["Torch.f0.0.forward"]
    npu, bench = _training(12, 0.0, 0, 1e-4, updates=False)
    side = np.linspace(-1, 1, 64, dtype=np.float32)
    for run in (npu, bench):
        run.api("Torch.exp.0.forward", [side], [np.exp(side)])  # identical data, identical result
    result = _compare(tmp_path / "forward", npu, bench)
    assert [s.api for s in result.suspects] == ["Torch.f0.0.forward"]


def test_the_loss_backward_carrying_a_fault_does_not_hide_it(tmp_path: Path) -> None:
    """The loss's backward is fed the identical gradient 1, but what its forward saved carries the fault's
    error: it is no background sample, or the fault would be its own background."""
    result = _compare(tmp_path, *_training(12, 0.0, 3, 1e-3))
    assert [s.api for s in result.suspects][:1] == ["Torch.f3.0.forward"]
    assert result.first_divergence is not None and result.first_divergence.api == "Torch.f3.0.forward"


def test_a_small_tensors_chance_draw_is_allowed_its_sampling_spread() -> None:
    """The same score just above the threshold: an 8-element output's normwise error is one draw spread by
    ~1/4 of its size, so it is allowed 1.75x and stays below; a 4,096-element output's is spread by ~1%,
    so it stands out still."""
    stats = (1.0, -1.0, 0.0, 1.0)
    facts = _facts([("Torch.small.0.forward", stats, stats, (8,)),
                    ("Torch.big.0.forward", stats, stats, (64, 64))])
    cols = CallColumns(["Torch.small.0.forward", "Torch.big.0.forward"], np.array([0, 1]), np.array([1, 2]),
                       np.array([0, 1]), np.array([1e-5, 1e-5]), np.array([3e-5, 3e-5]))  # fmt: skip
    scores = np.full(2, SUSPECT_SCORE + 0.1)
    _allow_for_small_tensors(facts, ["output", "output"], cols, scores, np.ones(2, dtype=bool), SUSPECT_SCORE)
    assert scores[0] < SUSPECT_SCORE <= scores[1]


def _relu_step(fault: float, *, flips: int = 0, seed: int = 0) -> tuple[DumpBuilder, DumpBuilder]:
    """Noisy calls (1e-5 relative, fresh at each) around a ReLU, forward then backward, so its forward
    inputs differ; the target's ReLU backward adds ``fault`` relative noise to the gradient it hands on, and
    ``flips`` of its forward inputs sit so close to 0 that the noise flips their sign (a tie that flips)."""
    rng, noise_rng = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    x0 = rng.standard_normal(1024).astype(np.float32)
    near_zero = rng.choice(1024, size=flips, replace=False)
    runs = (DumpBuilder(), DumpBuilder())
    for side, run in enumerate(runs):
        target = side == 0

        def out(value: np.ndarray, rel: float = 1e-5, *, target: bool = target) -> np.ndarray:
            rel = rel if target else 0.0
            return (value * (1 + rel * noise_rng.standard_normal(value.shape))).astype(np.float32)

        x = x0
        for k in range(12):
            y = out(np.tanh(x * 1.1))
            run.api(f"Torch.f{k}.0.forward", [x], [y])
            x = y
        x = x.copy()
        x[near_zero] = 1e-7 if target else -1e-7  # the sign each side sees
        run.api("Functional.relu.0.forward", [x], [np.maximum(x, 0.0)])
        grad = out(np.linspace(0.5, 1.5, 1024, dtype=np.float32))
        routed = np.where(x > 0.0, grad, 0.0).astype(np.float32)
        run.api("Functional.relu.0.backward", [grad], [out(routed, fault)])
        for k in reversed(range(12)):
            g = out(routed * 0.9)
            run.api(f"Torch.f{k}.0.backward", [routed], [g])
            routed = g
    return runs


def test_a_selecting_ops_backward_is_judged_element_by_element(tmp_path: Path) -> None:
    """ReLU's forward inputs differ, so normwise its gradient error has no yardstick (a flipped tie sends a
    whole element elsewhere); element-wise, every outgoing element carries its incoming element's error, and
    the fault's elements newly off by more than 1e-3 stand out."""
    result = _compare(tmp_path, *_relu_step(1e-3))
    assert [s.api for s in result.suspects][:1] == ["Functional.relu.0.backward"]
    assert "routed by its forward's selection" in result.suspects[0].reason


def test_flipped_ties_in_a_selecting_ops_backward_are_no_suspect(tmp_path: Path) -> None:
    """Three flipped ReLU signs route three whole gradient elements differently (normwise, 5% of the
    gradient), but they are a few elements, within the share that flipped ties explain."""
    result = _compare(tmp_path, *_relu_step(0.0, flips=3))
    assert result.suspects == [] and result.first_divergence is None


# ------------------------------------------------------------------------------------------------------
# the stack frame and the Excel row


FRAMES = [
    "File /venv/lib/python3.11/site-packages/torch/overrides.py, line 1771, in handle_torch_function, \n r",
    "File /venv/lib/python3.11/site-packages/torch/nn/modules/linear.py, line 134, in forward, \n r",
    "File /opt/msprobe/pytorch/api_registry.py, line 9, in wrapped, \n r",
    "File /usr/lib/python3.11/contextlib.py, line 81, in inner, \n r",
    "File /home/me/project/model.py, line 42, in forward, \n y = self.proj(x)",
    "File /home/me/project/train.py, line 7, in <module>, \n loss = model(x)",
]


def test_user_frame_skips_torch_tooling_site_packages_and_the_standard_library() -> None:
    assert user_frame(FRAMES) == FRAMES[4]
    assert user_frame(FRAMES[:4]) is None
    assert user_frame([]) is None


def test_suspects_carry_the_user_frame_and_the_excel_row(tmp_path: Path) -> None:
    npu, bench = _chain(np.random.default_rng(0), 5, 0.0, 2, 1e-3)
    npu.stack = {"0": [["Torch.f2.0.forward"], FRAMES]}
    result = _compare(tmp_path, npu, bench)
    suspect = result.suspects[0]
    assert suspect.api == "Torch.f2.0.forward" and suspect.stack == FRAMES[4]
    assert suspect.excel_row == suspect.row_index + 2  # the header is Excel's row 1
    assert result.rows[suspect.row_index].cells[0] == "Torch.f2.0.forward.output.0"
    text = advisor_text(result)
    assert f"Excel row {suspect.excel_row}" in text and "model.py, line 42" in text
    assert text.splitlines()[0] == f"Line: {suspect.excel_row}"  # one row number everywhere (issue 36)


# ------------------------------------------------------------------------------------------------------
# md5 mode and ranks


def test_md5_mode_names_the_first_call_whose_inputs_match_and_outputs_do_not(tmp_path: Path) -> None:
    def leaf(md5: str) -> dict[str, object]:
        return stats_leaf(1.0, 0.0, 0.5, 1.0, md5=md5)

    npu = {
        "Torch.a.0.forward": {"input_args": [leaf("aa")], "output": [leaf("bb")]},
        "Torch.b.0.forward": {"input_args": [leaf("bb")], "output": [leaf("XX")]},  # here
        "Torch.c.0.forward": {"input_args": [leaf("XX")], "output": [leaf("YY")]},  # inherited
        "Torch.d.0.forward": {"input_args": [leaf("dd")], "output": [leaf("ZZ")]},  # a second source
    }
    bench = {
        "Torch.a.0.forward": {"input_args": [leaf("aa")], "output": [leaf("bb")]},
        "Torch.b.0.forward": {"input_args": [leaf("bb")], "output": [leaf("cc")]},
        "Torch.c.0.forward": {"input_args": [leaf("cc")], "output": [leaf("ee")]},
        "Torch.d.0.forward": {"input_args": [leaf("dd")], "output": [leaf("ff")]},
    }
    result = _compare_raw(tmp_path, npu, bench)
    assert [s.api for s in result.suspects] == ["Torch.b.0.forward", "Torch.d.0.forward"]
    assert result.first_divergence is not None and result.first_divergence.api == "Torch.b.0.forward"


def _first(api: str, collectives: int) -> Suspect:
    return Suspect(rank=1, api=api, direction="forward", row_index=0, reason="",
                   collectives_before=collectives)  # fmt: skip


def test_the_rank_that_diverged_first_is_judged_around_the_collectives() -> None:
    # Rank 1 went wrong inside its own computation before the 3rd collective; rank 0 only received the
    # damage through that all_reduce; rank 2 diverged later still; rank 3 never did.
    firsts = {
        0: _first("Distributed.all_reduce.2.forward", 2),
        1: _first("Functional.gelu.7.forward", 2),
        2: _first("Functional.linear.9.forward", 4),
        3: None,
    }
    found = first_diverged_rank(firsts)
    assert found is not None
    assert (found.rank, found.api, found.at_collective) == (1, "Functional.gelu.7.forward", False)
    assert first_diverged_rank({0: None}) is None


def test_multi_rank_summary_names_the_first_rank(tmp_path: Path) -> None:
    from parity.shared.compare.job import run_compare
    from parity.shared.compare.spec import load_compare_spec

    for rank, fault_at in ((0, None), (1, 2)):
        npu, bench = _chain(np.random.default_rng(rank), 4, 0.0, fault_at, 1e-3)
        npu.write(tmp_path / "npu" / "step0" / f"rank{rank}")
        bench.write(tmp_path / "bench" / "step0" / f"rank{rank}")
    spec_file = tmp_path / "compare.json"
    spec_file.write_text(json.dumps({"npu_path": str(tmp_path / "npu" / "step0"),
                                     "bench_path": str(tmp_path / "bench" / "step0")}))  # fmt: skip
    outputs = run_compare(load_compare_spec(spec_file), tmp_path / "out", OPTIONS)
    summary = json.loads(outputs.summary.read_text())  # type: ignore[union-attr]
    assert summary["first_diverged"]["rank"] == 1
    assert summary["first_diverged"]["api"] == "Torch.f2.0.forward"
