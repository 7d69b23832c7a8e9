"""The advisor (compare.md §7.3, msprobe's texts) and Parity's ranked suspects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from parity.shared.compare import advisor
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import Advice

from tests.factories import stats_leaf, write_raw_dump

OK = stats_leaf(1.0, 0.0, 0.5, 1.0)
BAD = stats_leaf(9.0, 0.0, 0.5, 1.0)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("Functional.linear.0.forward.input.0", advisor.FORWARD_INPUT_SUGGEST),
        ("Functional.linear.0.forward.output.0", advisor.FORWARD_OUTPUT_SUGGEST),
        ("Torch.matmul.0.forward.output.0", advisor.DETERMINISTIC_SUGGEST),
        ("Functional.relu.0.backward.input.0", advisor.BACKWARD_INPUT_SUGGEST),
        ("Functional.relu.0.backward.output.0", advisor.BACKWARD_OUTPUT_SUGGEST),
        ("Functional.layer_norm.0.backward.output.0", advisor.DETERMINISTIC_SUGGEST),
        (
            "Module.input_layernorm.RMSNorm.forward.0.output.0",
            advisor.FORWARD_INPUT_SUGGEST,
        ),  # msprobe's quirk
    ],
)
def test_advice_text_by_name(name: str, text: str) -> None:
    assert advisor.advice_text(name) == text


def test_format_advice_three_lines() -> None:
    text = advisor.format_advice(Advice(line=3, suspect_node="Torch.f.0.forward.output.0", text="Do X."))
    assert text == "Line: 3\nSuspect Nodes: Torch.f.0.forward.output.0\nExpert Advice: Do X.\n"


def test_format_all_clear() -> None:
    text = advisor.format_advice(Advice(line=None, suspect_node=None, text=advisor.NO_ERR_SUGGEST))
    assert text == (
        "Line: NA\nSuspect Nodes: NA\n"
        "Expert Advice: All data in comparison result meets the accuracy requirements.\n"
    )


def _write(tmp_path: Path, npu: dict[str, Any], bench: dict[str, Any]) -> tuple[Path, Path]:
    return write_raw_dump(tmp_path / "npu", npu), write_raw_dump(tmp_path / "bench", bench)


def test_advice_points_at_the_first_failing_row(tmp_path: Path) -> None:
    npu = {
        "Torch.a.0.forward": {"input_args": [OK], "output": [OK]},
        "Torch.b.0.forward": {"input_args": [OK], "output": [BAD]},
    }
    bench = {
        "Torch.a.0.forward": {"input_args": [OK], "output": [OK]},
        "Torch.b.0.forward": {"input_args": [OK], "output": [OK]},
    }
    result = compare_dumps(*_write(tmp_path, npu, bench), CompareOptions())
    assert result.advice == Advice(
        line=3, suspect_node="Torch.b.0.forward.output.0", text=advisor.FORWARD_OUTPUT_SUGGEST
    )


def test_unmatched_rows_are_not_the_advice(tmp_path: Path) -> None:
    result = compare_dumps(*_write(tmp_path, {"Torch.x.0.forward": {"output": [OK]}}, {}), CompareOptions())
    assert result.advice.line is None


def _suspect_dumps(tmp_path: Path) -> tuple[Path, Path]:
    npu = {
        "Torch.a.0.forward": {"input_args": [OK], "output": [OK]},
        "Torch.b.0.forward": {"input_args": [OK], "output": [BAD]},  # the error appears here
        "Torch.c.0.forward": {"input_args": [BAD], "output": [BAD]},  # inherited: not a suspect
    }
    bench = {
        "Torch.a.0.forward": {"input_args": [OK], "output": [OK]},
        "Torch.b.0.forward": {"input_args": [OK], "output": [OK]},
        "Torch.c.0.forward": {"input_args": [OK], "output": [OK]},
    }
    return _write(tmp_path, npu, bench)


def test_suspects_are_apis_whose_inputs_agree_but_outputs_do_not(tmp_path: Path) -> None:
    result = compare_dumps(*_suspect_dumps(tmp_path), CompareOptions())
    # b turns identical inputs into different outputs; c's forward only inherits b's error.
    assert [(s.api, s.direction) for s in result.suspects] == [("Torch.b.0.forward", "forward")]
    first = result.first_divergence
    assert first is not None and first.api == "Torch.b.0.forward"
    assert result.rows[first.row_index].cells[0] == "Torch.b.0.forward.output.0"
    assert "Torch.b.0.forward.output.0" in first.reason and first.stack is None


def test_a_backward_suspect_carries_its_forward_user_frame(tmp_path: Path) -> None:
    npu = {
        "Torch.c.0.forward": {"input_args": [OK], "output": [OK]},
        "Torch.c.0.backward": {"input": [OK], "output": [BAD]},
    }
    bench = {
        "Torch.c.0.forward": {"input_args": [OK], "output": [OK]},
        "Torch.c.0.backward": {"input": [OK], "output": [OK]},
    }
    npu_json, bench_json = _write(tmp_path, npu, bench)
    (npu_json.parent / "stack.json").write_text(
        json.dumps({"0": [["Torch.c.0.forward"], [
            "File /venv/lib/python3.11/site-packages/torch/nn/modules/module.py, line 1, in _call_impl, \n x",
            "File /w/model.py, line 9, in forward, \n z = c(y)",
        ]]})  # fmt: skip
    )
    result = compare_dumps(npu_json, bench_json, CompareOptions())
    assert [(s.api, s.stack) for s in result.suspects] == [
        ("Torch.c.0.backward", "File /w/model.py, line 9, in forward, \n z = c(y)"),  # the user's frame
    ]


def test_a_row_failing_only_by_its_red_highlight_is_the_advice(tmp_path: Path) -> None:
    """msprobe's verdict says Yes (cosine 0.99995, tiny MaxAbsErr) but the output's one-thousandth ratio
    collapses while the input agrees: the row is red, so the advisor must not print the all-clear."""
    import numpy as np

    from tests.factories import DumpBuilder

    rng = np.random.default_rng(0)
    x = rng.standard_normal(256).astype(np.float32)
    y = (x * 1e-2).astype(np.float32)
    noisy = (y * (1 + 1e-2 * rng.standard_normal(256))).astype(np.float32)
    npu = DumpBuilder().api("Torch.scale.0.forward", [x], [noisy]).write(tmp_path / "npu")
    bench = DumpBuilder().api("Torch.scale.0.forward", [x], [y]).write(tmp_path / "bench")
    result = compare_dumps(npu, bench, CompareOptions())
    out_row = result.rows[1]
    assert out_row.cells[result.header.index("Accuracy Reached or Not")] == "Yes"
    assert out_row.highlight is not None and out_row.highlight.value == "red"
    assert result.advice == Advice(
        line=1, suspect_node="Torch.scale.0.forward.output.0", text=advisor.FORWARD_OUTPUT_SUGGEST
    )
