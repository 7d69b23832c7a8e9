"""The localization benchmark on real model code (``benchmarks/hf_suite.py``) checked as a harness: the
dumps, the truth sets, the kernel variants, the table. The engine's verdicts are measured by the benchmark,
not asserted here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import hf_suite  # noqa: E402
import localization_suite as suite  # noqa: E402

needs_transformers = pytest.mark.skipif(hf_suite.missing() is not None, reason=str(hf_suite.missing()))
FAULTS = {f.label: f for f in hf_suite.FAULTS}


def test_every_fault_marks_lines_and_names_a_known_family_and_model() -> None:
    assert len(hf_suite.FAULTS) >= 60
    for fault in hf_suite.FAULTS:
        faulty, _calls, spans = hf_suite.marked_lines(fault)
        assert faulty, fault.label
        assert all(any(line in span for span in spans) for line in faulty), fault.label
        assert fault.family in hf_suite.FAMILIES and fault.model in hf_suite.MODELS, fault.label
    assert len(FAULTS) == len(hf_suite.FAULTS)  # labels are unique


def test_a_marker_on_a_wrapped_statement_marks_each_of_its_lines() -> None:
    faulty, _, _ = hf_suite.marked_lines(FAULTS["qwen3moe:router-softmax-bf16"])
    lines = Path(hf_suite.FAULTS_FILE).read_text().splitlines()
    start = next(n for n in sorted(faulty) if "softmax(" in lines[n - 1])
    assert {start, start + 1} <= faulty  # the call opens a line above its marker


def test_a_gap_suspect_stands_for_every_target_call_in_it() -> None:
    order = ["A.0.forward", "B.0.forward", "C.0.forward", "D.0.forward"]
    gap = "target B.0.forward ... D.0.forward ~ bench X.0.forward"
    assert suite._stands_for("B.0.forward", gap, order) == {"B.0.forward", "C.0.forward", "D.0.forward"}
    assert suite._stands_for("A.0.forward", None, order) == {"A.0.forward"}
    out = suite.Outcome("x", "tensor", "clean", "C.0.forward", ["B.0.forward"], None,
                        answers=frozenset({"C.0.forward"}),
                        named_calls=[suite._stands_for("B.0.forward", gap, order)])  # fmt: skip
    assert out.top1 and out.top3 and not out.first_hit


def test_the_suite_says_why_it_cannot_run_without_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf_suite.importlib.util, "find_spec", lambda name: None)
    assert "pip install -e '.[hf]'" in str(hf_suite.missing())


@pytest.mark.slow
@needs_transformers
def test_one_model_end_to_end_dumps_truth_sets_variants_and_table(tmp_path: Path) -> None:
    """Llama with an eps fault and a backward-only one, at mix in statistics mode, in three variants (the
    aten-default target from a subprocess): every pair judged, truth sets as the marked lines say."""
    eps, bwd = FAULTS["llama:rmsnorm-eps-1e-5"], FAULTS["llama:rmsnorm-bwd-bf16"]
    variants = ("clean", "aten-default", "autocast-bf16")
    outcomes = hf_suite.run_unit(
        "llama", "statistics", [eps.label, bwd.label], variants, ("mix",), verbose=False
    )
    assert sorted((o.variant, o.label) for o in outcomes) == sorted(
        (v, label) for v in variants for label in ("llama:no fault", eps.label, bwd.label)
    )
    for o in outcomes:
        assert o.level == "mix" and o.mode == "statistics"
        if o.label == eps.label:  # the add of the wrong eps, each RMSNorm's
            assert o.answers and all(a.startswith("Tensor.__add__.") for a in o.answers)
            assert sum(a.endswith(".forward") for a in o.answers) == 5
        elif o.label == bwd.label:
            # msprobe records the calls a custom backward makes: the bf16 casts at the fault's lines are
            # the answers (recorded API calls), so no forward call and no module stands in for them
            assert o.answers and not any(a.startswith("Module.") for a in o.answers)
            assert {a.split(".")[1] for a in o.answers} == {"detach", "to"}
            assert all(a.startswith("Tensor.") for a in o.answers)
        else:
            assert not o.answers and o.truth is None
    text = hf_suite.table(outcomes)
    for variant in variants:
        assert f"statistics mix   {variant:<15}eps" in text
        assert f"statistics mix   {variant:<15}all" in text
    for what in ("identical", "aten-default", "autocast-bf16"):
        assert f"statistics mix   {what:<24}" in text


@pytest.mark.slow
@needs_transformers
def test_at_l1_a_backward_fault_is_its_backward_calls_and_no_module(tmp_path: Path) -> None:
    fault = FAULTS["llama:rmsnorm-bwd-bf16"]
    case = hf_suite.Case(str(tmp_path / "t"), "llama", "statistics", "L1", "clean", fault.label)
    answers = hf_suite.truth(fault, hf_suite.dump_case(case), "L1")
    assert answers and not any(a.startswith("Module.") for a in answers)
    # the backward's own calls at the fault's lines (msprobe records a custom backward's calls)
    assert {a.split(".")[1] for a in answers} == {"detach", "to"}
