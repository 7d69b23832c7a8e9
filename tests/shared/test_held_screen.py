"""The held-format screen: from the table's recorded max and min alone, the calls that computed in float16
and wrote float32 join the float64 replay's candidates, whatever their table score."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.localization import Localization, localize
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.replay_judgement import HELD_LIMIT, candidates

from tests.factories import DumpBuilder


def _tf32(a: np.ndarray) -> np.ndarray:
    bits = a.astype(np.float32).view(np.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(np.float32).astype(np.float64)


def _norm(v: np.ndarray) -> np.ndarray:
    v64 = v.astype(np.float64)
    centred = v64 - v64.mean(-1, keepdims=True)
    return (centred / np.sqrt(v64.var(-1, keepdims=True) + 1e-5)).astype(np.float32)


def _pair(fp16_norm_at: int | None = None, layers: int = 4) -> tuple[DumpBuilder, DumpBuilder]:
    """``layers`` x (linear, layer_norm, a float16 pass-on, a mask): the target's linears round their operands
    to TF32; ``fp16_norm_at``: the target's layer_norm there rounds its output to float16. Each layer also
    casts its norm's output through float16 on both sides (``Tensor.half_round``: a call passing
    float16-fitting values on) and builds an integer-valued mask from it (``Torch.gt``: zeros and ones)."""
    rng = np.random.default_rng(1)
    npu, bench = DumpBuilder(), DumpBuilder()
    x = xb = rng.standard_normal((32, 64)).astype(np.float32)
    for k in range(layers):
        w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
        y = (_tf32(x) @ _tf32(w).T).astype(np.float32)
        yb = (xb.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32)
        npu.api(f"Functional.linear.{k}.forward", [x, w], [y])
        bench.api(f"Functional.linear.{k}.forward", [xb, w], [yb])
        n, nb = _norm(y), _norm(yb)
        if k == fp16_norm_at:
            n = n.astype(np.float16).astype(np.float32)
        kwargs = {"normalized_shape": [64]}
        npu.api(f"Functional.layer_norm.{k}.forward", [y], [n], kwargs=kwargs)
        bench.api(f"Functional.layer_norm.{k}.forward", [yb], [nb], kwargs=kwargs)
        h, hb = (v.astype(np.float16).astype(np.float32) for v in (n, nb))
        npu.api(f"Torch.tanh.{k}.forward", [h], [np.tanh(h)])  # float16 values in: passes rounding on
        bench.api(f"Torch.tanh.{k}.forward", [hb], [np.tanh(hb)])
        npu.api(f"Torch.gt.{k}.forward", [n, np.zeros_like(n)], [(n > 0).astype(np.float32)])
        bench.api(f"Torch.gt.{k}.forward", [nb, np.zeros_like(nb)], [(nb > 0).astype(np.float32)])
        x, xb = n, nb
    return npu, bench


def _localize(tmp_path: Path, npu: DumpBuilder, bench: DumpBuilder) -> Localization:
    result = compare_dumps(npu.write(tmp_path / "npu"), bench.write(tmp_path / "bench"),
                           CompareOptions(replay_top=0))  # fmt: skip
    states = [r.cells[0].split(".forward.")[1].split(".")[0] for r in result.rows]
    return localize(result.rows, states, result.facts, result.mode)


def _screened(loc: Localization) -> list[str]:
    return [loc.judged.columns.apis[k] for k in np.flatnonzero(loc.judged.held).tolist()]


def test_a_float16_rounded_output_behind_a_tf32_error_is_screened_in(tmp_path: Path) -> None:
    loc = _localize(tmp_path, *_pair(fp16_norm_at=2))
    # Only the norm that rounded to float16: not the tanh passing float16 values on, not the 0/1 mask.
    assert _screened(loc) == ["Functional.layer_norm.2.forward"]
    # It is a replay candidate where the table's ranking alone does not reach it.
    no_screen = dataclasses.replace(loc.judged, held=np.zeros(0, dtype=bool))
    unscreened = dataclasses.replace(loc, judged=no_screen)
    assert "Functional.layer_norm.2.forward" not in candidates(unscreened, limit=1)
    assert "Functional.layer_norm.2.forward" in candidates(loc, limit=1)


def test_a_pair_without_a_fault_screens_nothing(tmp_path: Path) -> None:
    assert _screened(_localize(tmp_path, *_pair())) == []


def test_the_screen_adds_at_most_held_limit_calls_the_earliest_first(tmp_path: Path) -> None:
    loc = _localize(tmp_path, *_pair(layers=3))
    before = candidates(loc, limit=0)
    loc.judged.held[:] = True  # every call screened in
    added = [api for api in candidates(loc, limit=0) if api not in before]
    earliest = [api for api in loc.judged.columns.apis[:HELD_LIMIT] if api not in before]
    assert added == earliest and len(loc.judged.columns.apis) > HELD_LIMIT


def test_the_replay_names_the_screened_call_first(tmp_path: Path) -> None:
    npu, bench = _pair(fp16_norm_at=2)
    result = compare_dumps(npu.write(tmp_path / "npu"), bench.write(tmp_path / "bench"),
                           CompareOptions(replay_top=1))  # fmt: skip
    assert [s.api for s in result.suspects][:1] == ["Functional.layer_norm.2.forward"]
    verdicts = {v["entry"]: v for v in result.replay["verdicts"]}  # type: ignore[index]
    assert verdicts["Functional.layer_norm.2.forward"]["verdict"] == "target"
