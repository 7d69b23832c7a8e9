"""Tensor-mode metrics against an independent plain-numpy reference, §12's worked example, §4.2's cases."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from parity.shared.metrics import tensor as tm
from parity.shared.metrics.tensor import TensorMetrics, compare_arrays, compare_raw
from parity.shared.tensor_io import RawTensor

# --- the reference: msprobe v2's numpy pipeline, written out plainly (with the ±inf fix) ----------


def _fmt(x: float) -> float:
    return float(f"{x:.12f}")


def reference(n: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """Raw (unrounded where that matters) metrics as msprobe's numpy code computes them."""
    if n.dtype.kind not in "biuf" or b.dtype.kind not in "biuf":
        return {"all": "unsupported", "messages": [tm.MSG_UNREADABLE]}
    if n.size == 0:
        return {"all": "unsupported", "messages": [tm.MSG_EMPTY]}
    if n.shape != b.shape:
        return {"all": "shape unmatched", "messages": [tm.MSG_SHAPE]}
    floats = n.dtype.kind == "f" and b.dtype.kind == "f"
    t = np.result_type(n.dtype, b.dtype, np.float32) if floats else np.dtype(np.float64)
    messages: list[str] = []
    if n.ndim == 0:
        messages.append(tm.MSG_ZERO_D)
    else:
        n, b = n.copy(), b.copy()
        n_bad, b_bad = ~np.isfinite(n.astype(np.float64)), ~np.isfinite(b.astype(np.float64))
        if n_bad.any() or b_bad.any():
            same = all(
                np.array_equal(f(n.astype(np.float64)), f(b.astype(np.float64)))
                for f in (np.isnan, np.isposinf, np.isneginf)
            )
            if not same:
                return {"all": "N/A", "messages": [tm.MSG_NAN_INF_POSITION]}
            n[n_bad] = 0
            b[b_bad] = 0
        if n.dtype != b.dtype:
            messages.append(tm.MSG_DTYPE)
    with np.errstate(all="ignore"):
        nt, bt = n.astype(t), b.astype(t)
        nt, bt = np.atleast_1d(nt).copy(), np.atleast_1d(bt).copy()
        zero = bt == 0
        eps = np.finfo(t).eps
        nt[zero] += eps
        bt[zero] += eps
        re = np.abs((nt - bt) / bt)
        n64, b64 = n.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
        out: dict[str, Any] = {"max_abs": float(np.max(np.abs(n64 - b64))), "max_rel": float(np.max(re))}
        if n.ndim == 0:
            out["messages"] = messages
            return out
        out["euc"] = float(np.linalg.norm(n64 - b64))
        out["lt1"] = float(np.sum(re < 0.001) / re.size)
        out["lt5"] = float(np.sum(re < 0.005) / re.size)
        if n64.size == 1:
            out["cos"] = "unsupported"
        else:
            na, nb = np.linalg.norm(n64), np.linalg.norm(b64)
            e = np.finfo(float).eps
            if na <= e and nb <= e:
                out["cos"] = 1.0
            elif na <= e or nb <= e:
                out["cos"] = "Nan"
            else:
                out["cos"] = float(np.dot(n64, b64) / (na * nb))
    out["messages"] = messages
    return out


def assert_matches_reference(got: TensorMetrics, n: np.ndarray, b: np.ndarray) -> None:
    ref = reference(n, b)
    if "all" in ref:
        assert got == TensorMetrics.all_cells(ref["all"], *ref["messages"])
        return
    assert tuple(m for m in got.messages if m in ref["messages"]) == tuple(ref["messages"])
    for name, key in (("max_abs_err", "max_abs"), ("max_relative_err", "max_rel")):
        value = getattr(got, name)
        if math.isnan(ref[key]):
            assert value == "Nan"
        else:
            assert value == _fmt(ref[key]), name
    if n.ndim == 0:
        assert (got.cosine, got.euc_dist, got.one_thousandth, got.five_thousandths) == ("unsupported",) * 4
        return
    assert got.one_thousandth == _fmt(ref["lt1"])
    assert got.five_thousandths == _fmt(ref["lt5"])
    assert got.euc_dist == pytest.approx(ref["euc"], rel=1e-12, abs=1e-300) or (
        math.isinf(ref["euc"]) and got.euc_dist == ref["euc"]
    )
    if isinstance(ref["cos"], str):
        assert got.cosine == ref["cos"]
    elif math.isnan(ref["cos"]):
        assert got.cosine == "Nan"
    else:
        expected = min(max(_fmt(ref["cos"]), -1.0), 1.0)
        tol = 1.01e-6 if expected > 0.9999 else 2e-12
        assert isinstance(got.cosine, float) and abs(got.cosine - expected) <= tol


# --- hypothesis pairs -----------------------------------------------------------------------------

DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8", "bool"]
SPECIALS = [0.0, -0.0, 1.0, math.nan, math.inf, -math.inf, 1e-3, 65504.0]


def _cast(values: np.ndarray, dtype: str) -> np.ndarray:
    values = np.asarray(values)
    if dtype == "bfloat16":  # what load_tensor returns for a bf16 file: bf16 values widened to float32
        return torch.from_numpy(np.array(values, np.float32)).to(torch.bfloat16).float().numpy()
    if dtype == "bool":
        return values != 0
    if dtype in ("int32", "int64", "uint8"):
        clean = np.nan_to_num(values, nan=0.0, posinf=100.0, neginf=-100.0)
        clean = np.clip(clean, 0 if dtype == "uint8" else -1e6, 255 if dtype == "uint8" else 1e6)
        return clean.astype(dtype)
    with np.errstate(over="ignore"):
        return values.astype(dtype)


@st.composite
def pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, str, str]:
    shape = draw(st.sampled_from([(), (0,), (1,), (2,), (7,), (3, 5), (1, 40), (300,)]))
    elements = st.one_of(
        st.floats(-1e4, 1e4, allow_nan=False, width=32), st.sampled_from(SPECIALS), st.floats(-1.0, 1.0)
    )
    n = draw(hnp.arrays(np.float64, shape, elements=elements))
    mode = draw(st.sampled_from(["perturb", "independent", "equal"]))
    if mode == "perturb":  # relative errors around the 0.001 / 0.005 thresholds
        rel = draw(hnp.arrays(np.float64, shape, elements=st.floats(-0.01, 0.01)))
        b = n * (1 + rel)
    elif mode == "independent":
        b = draw(hnp.arrays(np.float64, shape, elements=elements))
    else:
        b = n.copy()
    n_dtype = draw(st.sampled_from(DTYPES))
    b_dtype = draw(st.sampled_from([n_dtype, n_dtype, *DTYPES]))
    return _cast(n, n_dtype), _cast(b, b_dtype), n_dtype, b_dtype


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs())
def test_fused_pass_matches_numpy_reference(pair: tuple[np.ndarray, np.ndarray, str, str]) -> None:
    n, b, _, _ = pair
    assert_matches_reference(compare_arrays(n, b), n, b)


def _bf16_raw(values: np.ndarray) -> RawTensor:
    bits = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(torch.bfloat16)
    return RawTensor(bits.view(torch.int16).numpy().view(np.uint16), bfloat16=True)


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(np.float32, st.integers(1, 200), elements=st.floats(-1e3, 1e3, width=32)),
    st.floats(-0.02, 0.02),
)
def test_raw_bfloat16_bits_match_widened_float32(values: np.ndarray, rel: float) -> None:
    n_raw, b_raw = _bf16_raw(values), _bf16_raw(values * np.float32(1 + rel))
    widened = compare_arrays(n_raw.to_numpy(), b_raw.to_numpy())
    assert compare_raw(n_raw, b_raw) == widened
    assert_matches_reference(widened, n_raw.to_numpy(), b_raw.to_numpy())


def test_bfloat16_decoding_is_exact_for_every_bit_pattern() -> None:
    bits = np.arange(1 << 16, dtype=np.uint16)
    widened = RawTensor(bits, bfloat16=True).to_numpy()
    finite = np.isfinite(widened)
    # pair each value with itself shifted: any decoding error would change MaxAbsErr/position checks
    got = compare_raw(RawTensor(bits[finite], bfloat16=True), RawTensor(widened[finite]))
    assert got.max_abs_err == 0.0 and got.euc_dist == 0.0


def test_float16_decoding_is_exact_for_every_bit_pattern() -> None:
    values = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    finite = values[np.isfinite(values)]
    got = compare_arrays(finite, finite.astype(np.float64))
    assert got.max_abs_err == 0.0 and got.euc_dist == 0.0
    assert got.messages == (tm.MSG_DTYPE,)


def test_large_pair_spanning_segments_matches_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    n = rng.standard_normal(300_000).astype(np.float32)
    b = (n * (1 + rng.normal(0, 2e-3, n.size))).astype(np.float32)
    b[::1000] = 0
    whole = compare_arrays(n, b)
    assert_matches_reference(whole, n, b)
    monkeypatch.setattr(tm, "SEGMENT_ELEMENTS", 65_536)
    assert len(tm.segments(n.size)) == 5
    assert compare_arrays(n, b).max_abs_err == whole.max_abs_err
    assert_matches_reference(compare_arrays(n, b), n, b)


def test_segments_in_order_are_bit_identical_however_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tm, "SEGMENT_ELEMENTS", 4096)
    rng = np.random.default_rng(1)
    n, b = rng.standard_normal(20_000), rng.standard_normal(20_000)
    prepared = tm.validate(RawTensor(n), RawTensor(b))
    assert isinstance(prepared, tm.PreparedPair)
    segs = tm.segments(prepared.size)
    forward = [tm.run_segment(prepared, s, e) for s, e in segs]
    backward = [tm.run_segment(prepared, s, e) for s, e in reversed(segs)][::-1]
    assert np.array_equal(tm.combine_partials(forward), tm.combine_partials(backward))
    assert tm.finish(prepared, tm.combine_partials(forward)) == compare_arrays(n, b)


# --- §12 worked example, to the printed digits ----------------------------------------------------

N12 = [1, 2, 3, 4, 0]
B12 = [1.0008, 2, 2.99, 4.1, 0]


def test_worked_example_float64() -> None:
    got = compare_arrays(np.array(N12, np.float64), np.array(B12, np.float64))
    assert got == TensorMetrics(0.99991, 0.10050194027977731, 0.1, 0.024390243902, 0.6, 0.8, (), 3)


def test_worked_example_float32() -> None:
    got = compare_arrays(np.array(N12, np.float32), np.array(B12, np.float32))
    assert (got.cosine, got.euc_dist, got.max_abs_err, got.max_relative_err) == (
        0.99991, 0.10050184454752888, 0.099999904633, 0.024390220642)  # fmt: skip
    assert (got.one_thousandth, got.five_thousandths, got.messages) == (0.6, 0.8, ())


def test_worked_example_float16_v2_figures() -> None:
    got = compare_arrays(np.array(N12, np.float16), np.array(B12, np.float16))
    assert (got.cosine, got.euc_dist, got.max_abs_err, got.max_relative_err) == (
        0.999908, 0.10203559433946092, 0.1015625, 0.024761904031)  # fmt: skip
    assert (got.one_thousandth, got.five_thousandths) == (0.6, 0.8)  # v1 printed Nan / 0.4 / 0.6 here


# --- §4.2, one case each --------------------------------------------------------------------------


def test_not_float_convertible_is_unreadable() -> None:
    got = compare_arrays(np.array(["a", "b"]), np.array(["a", "b"]))
    assert got == TensorMetrics.all_cells("unsupported", tm.MSG_UNREADABLE)


def test_empty_npu_is_unsupported() -> None:
    got = compare_arrays(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32))
    assert got == TensorMetrics.all_cells("unsupported", "This is empty data, can not compare.")


def test_shape_mismatch() -> None:
    got = compare_arrays(np.ones((2, 3)), np.ones((3, 2)))
    assert got.cosine == got.max_abs_err == got.five_thousandths == "shape unmatched"
    assert got.messages == ("Shape of NPU and bench tensor do not match. Skipped.",)


def test_zero_d_computes_only_max_errors_with_the_message_once() -> None:
    got = compare_arrays(np.array(2.0, np.float32), np.array(2.5, np.float32))
    assert (got.cosine, got.euc_dist, got.one_thousandth, got.five_thousandths) == ("unsupported",) * 4
    re_fp32 = float(np.float32(0.5) / np.float32(2.5))  # RE in T = float32
    assert (got.max_abs_err, got.max_relative_err) == (0.5, _fmt(re_fp32))
    assert got.messages == (tm.MSG_ZERO_D,)


def test_zero_d_nan_reports_nan_max_errors() -> None:
    got = compare_arrays(np.array(np.nan), np.array(1.0))
    assert (got.max_abs_err, got.max_relative_err) == ("Nan", "Nan")
    assert got.messages == (tm.MSG_ZERO_D, tm.MSG_MAX_ABS_NAN, tm.MSG_MAX_REL_NAN)


def test_nan_positions_differ_gives_na() -> None:
    got = compare_arrays(np.array([1.0, np.nan, 3.0]), np.array([1.0, 2.0, np.nan]))
    assert got == TensorMetrics.all_cells("N/A", tm.MSG_NAN_INF_POSITION)


def test_nan_and_inf_at_identical_positions_are_zeroed_and_counted_equal() -> None:
    n = np.array([1.0, np.nan, np.inf, -np.inf, 2.0])
    b = np.array([1.0, np.nan, np.inf, -np.inf, 2.2])
    got = compare_arrays(n, b)
    assert got.messages == ()
    assert got.one_thousandth == 0.8 and got.five_thousandths == 0.8  # 4 of 5 equal, over all 5 elements
    assert got.max_abs_err == _fmt(0.2000000000000002) and got.max_abs_err_index == 4
    assert got == compare_arrays(np.array([1.0, 0, 0, 0, 2.0]), np.array([1.0, 0, 0, 0, 2.2]))


def test_plus_inf_against_minus_inf_is_a_difference() -> None:
    got = compare_arrays(np.array([1.0, np.inf]), np.array([1.0, -np.inf]))
    assert got == TensorMetrics.all_cells("N/A", tm.MSG_NAN_INF_POSITION)


def test_nan_against_inf_is_a_difference() -> None:
    got = compare_arrays(np.array([1.0, np.nan], np.float16), np.array([1.0, np.inf], np.float16))
    assert got.cosine == "N/A"


def test_dtype_mismatch_is_reported_and_metrics_computed() -> None:
    got = compare_arrays(np.array([1.0, 2.0], np.float16), np.array([1.0, 2.0], np.float32))
    assert got.messages == ("Dtype of NPU and bench tensor do not match.",)
    assert got.cosine == 1.0 and got.max_abs_err == 0.0


def test_cosine_of_length_one_vector_is_unsupported() -> None:
    got = compare_arrays(np.array([3.0]), np.array([3.0]))
    assert got.cosine == "unsupported" and got.messages == (tm.MSG_LENGTH_ONE,)
    assert got.max_abs_err == 0.0 and got.one_thousandth == 1.0


def test_cosine_of_two_zero_tensors_is_one() -> None:
    got = compare_arrays(np.zeros(4, np.float32), np.zeros(4, np.float32))
    assert got.cosine == 1.0 and got.messages == () and got.max_relative_err == 0.0


@pytest.mark.parametrize(("n", "b", "message"), [
    ([0.0, 0.0], [1.0, 2.0], tm.MSG_COSINE_NPU_ZERO),
    ([1.0, 2.0], [0.0, 0.0], tm.MSG_COSINE_BENCH_ZERO),
])  # fmt: skip
def test_cosine_with_one_zero_side_is_nan(n: list[float], b: list[float], message: str) -> None:
    got = compare_arrays(np.array(n), np.array(b))
    assert got.cosine == "Nan" and got.messages == (message,)


def test_cosine_overflow_to_nan_is_reported() -> None:
    got = compare_arrays(np.array([1e300, 1e300]), np.array([1e300, 1e300]))
    assert got.cosine == "Nan" and tm.MSG_COSINE_NAN in got.messages


def test_float16_bench_zero_uses_float32_epsilon_not_nan() -> None:
    # msprobe v1 added float64 eps in float16 (rounded away): 0/0 = NaN poisoned MaxRelativeErr
    got = compare_arrays(np.array([0.0, 1e-3, 1.0], np.float16), np.array([0.0, 0.0, 1.0], np.float16))
    expected_re = float(np.float32(np.float16(1e-3)) / np.float32(np.finfo(np.float32).eps))
    assert got.max_relative_err == _fmt(float(np.float32(expected_re)))
    assert got.one_thousandth == _fmt(2 / 3)


def test_ratio_threshold_is_strict_and_compared_in_float32() -> None:
    b = np.float32(1.0)
    n = np.nextafter(np.float32(1.001), np.float32(0))  # RE just below 0.001 in float32 arithmetic
    re = abs((n - b) / b)
    got = compare_arrays(np.array([n, b], np.float32), np.array([b, b], np.float32))
    assert got.one_thousandth == (1.0 if re < np.float32(0.001) else 0.5)
    exact = compare_arrays(np.array([1005.0, 1.0]), np.array([1000.0, 1.0]))
    assert exact.max_relative_err == 0.005 and exact.five_thousandths == 0.5  # 0.005 is not < 0.005
    at_one = compare_arrays(np.array([1001.0, 1.0]), np.array([1000.0, 1.0]))
    assert at_one.max_relative_err == 0.001 and at_one.one_thousandth == 0.5


def test_cosine_rounding_six_and_twelve_decimals() -> None:
    high = compare_arrays(np.array([1.0, 1.0, 1.0]), np.array([1.0, 1.0, 1.001]))
    assert high.cosine == round(_fmt(3.001 / (math.sqrt(3) * math.sqrt(2 + 1.001**2))), 6)
    low = compare_arrays(np.array([1.0, 0.0]), np.array([1.0, 1.0]))
    assert low.cosine == _fmt(1 / math.sqrt(2))


def test_int_and_bool_pairs_use_float64_relative_error() -> None:
    got = compare_arrays(np.array([1, 0, 5], np.int64), np.array([1, 0, 4], np.int64))
    assert got.max_relative_err == 0.25 and got.max_abs_err == 1.0 and got.max_abs_err_index == 2
    flags = compare_arrays(np.array([True, False, True]), np.array([True, True, True]))
    assert flags.max_abs_err == 1.0 and flags.one_thousandth == _fmt(2 / 3)


# --- the numpy pass of small pairs against the compiled kernels (C and numba), bit for bit ----------


def _c_pass() -> Any:
    from parity.shared.metrics import kernel

    if not kernel.NATIVE:
        pytest.fail("the C kernel (parity.shared.metrics._fused) is not built; reinstall with a C compiler")
    return kernel.fused_pass


def _numba_pass() -> Any:
    from parity.shared.metrics.numba_kernel import fused_pass

    return fused_pass


KERNELS = {"c": _c_pass, "numba": _numba_pass}


def _assert_same_accumulators(prepared: tm.PreparedPair, start: int, stop: int, kernel: str) -> None:
    fused_pass = KERNELS[kernel]()
    args = (prepared.n, prepared.b, prepared.n_kind, prepared.b_kind, prepared.re_in_f32, start, stop)
    ours, compiled = tm.numpy_pass(*args), fused_pass(*args)
    assert np.array_equal(ours, compiled, equal_nan=True), (ours, compiled)
    assert np.array_equal(np.signbit(ours), np.signbit(compiled))  # -0.0 would print as "-0.0"


def test_the_c_kernel_is_built_where_a_c_compiler_is() -> None:
    """The install builds ``_fused.c`` as an optional extension; where a compiler exists a failed build
    would go unnoticed (numba's kernel taking over, 0.5 s slower a compare), so it is an error here."""
    import shutil
    import sysconfig

    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the package runs on numba's kernel")
    from parity.shared.metrics import kernel

    assert kernel.NATIVE and tm.native_kernel()


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs())
def test_numpy_pass_equals_the_kernel_on_hypothesis_pairs(
    kernel: str, pair: tuple[Any, Any, str, str]
) -> None:
    n, b, _, _ = pair
    prepared = tm.validate(RawTensor(np.asarray(n)), RawTensor(np.asarray(b)))
    if isinstance(prepared, tm.PreparedPair):
        _assert_same_accumulators(prepared, 0, prepared.size, kernel)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("seed", range(6))
def test_numpy_pass_equals_the_kernel_across_blocks(
    seed: int, kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several ``_BLOCK``s, raw bfloat16 and float16 bits, zeros of both signs, NaN/Inf at the same and at
    different places, a segment that does not start at 0, and (odd seeds) the numpy pass taking its input in
    chunks of two blocks: the same accumulators, the same cells."""
    if seed % 2:
        monkeypatch.setattr(tm, "NUMPY_CHUNK", 2 * tm._BLOCK)
    fused_pass = KERNELS[kernel]()
    rng = np.random.default_rng(seed)
    for _ in range(40):
        size = int(rng.integers(1, 5 * tm._BLOCK))
        n = rng.standard_normal(size) * 10.0 ** rng.integers(-3, 4)
        b = n * (1 + rng.normal(0, rng.choice([1e-4, 3e-3, 1.0]), size))
        b[rng.random(size) < 0.1] = 0.0
        n[rng.random(size) < 0.1] = -0.0
        both = rng.random(size) < 0.02
        n[both], b[both] = np.nan, np.nan
        if rng.random() < 0.3:
            odd = rng.random(size) < 0.02
            n[odd], b[odd] = np.inf, rng.choice([np.inf, -np.inf])
        sides = []
        for values in (n, b):
            kind = rng.choice(["float32", "float64", "float16", "bfloat16", "int32", "uint8", "int64"])
            if kind == "bfloat16":
                sides.append(_bf16_raw(values))
            else:
                with np.errstate(all="ignore"):
                    sides.append(RawTensor(values.astype(kind)))
        prepared = tm.validate(*sides)
        assert isinstance(prepared, tm.PreparedPair)
        _assert_same_accumulators(prepared, 0, prepared.size, kernel)
        _assert_same_accumulators(prepared, size // 3, size, kernel)
        acc = tm.numpy_pass(prepared.n, prepared.b, prepared.n_kind, prepared.b_kind, prepared.re_in_f32, 0,
                            prepared.size)  # fmt: skip
        compiled = fused_pass(prepared.n, prepared.b, prepared.n_kind, prepared.b_kind, prepared.re_in_f32, 0,
                              prepared.size)  # fmt: skip
        assert tm.finish(prepared, acc) == tm.finish(prepared, compiled)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_every_float16_bit_pattern_and_strided_input_give_the_numpy_pass(kernel: str) -> None:
    """All 65,536 float16 and bfloat16 patterns (subnormals, both zeros, NaNs, infinities) against a shifted
    copy, and inputs that are strided views rather than contiguous arrays."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    shifted = np.roll(bits, 7)
    for kind in (tm.KIND_FP16, tm.KIND_BF16):
        pair = tm.PreparedPair(bits, shifted, kind, kind, True, bits.size, ())
        _assert_same_accumulators(pair, 0, bits.size, kernel)
    values = np.random.default_rng(3).standard_normal(18 * tm._BLOCK)
    n, b = values[::3], (values * 1.001)[::2][: values[::3].size]
    strided = tm.PreparedPair(n, b, tm.KIND_NATIVE, tm.KIND_NATIVE, False, n.size, ())
    _assert_same_accumulators(strided, 5, strided.size, kernel)


def test_the_c_kernel_refuses_what_it_cannot_read() -> None:
    fused_pass = _c_pass()
    x = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="unsupported element format"):
        fused_pass(x.astype(np.complex64), x, tm.KIND_NATIVE, tm.KIND_NATIVE, True, 0, 4)
    with pytest.raises(IndexError, match="outside"):
        fused_pass(x, x, tm.KIND_NATIVE, tm.KIND_NATIVE, True, 0, 5)
    with pytest.raises(ValueError, match="1-d"):
        fused_pass(np.zeros((2, 2), np.float32), x, tm.KIND_NATIVE, tm.KIND_NATIVE, True, 0, 4)


#: A prelude for a child interpreter that runs as if the C module had not been built (numba's kernel).
WITHOUT_C_KERNEL = "import sys; sys.modules['parity.shared.metrics._fused'] = None\n"


@pytest.mark.parametrize("c_kernel", [True, False], ids=["c", "numba"])
def test_a_small_pair_never_imports_numba(c_kernel: bool) -> None:
    """The fixed cost of a small tensor compare: with numba's kernel numba is loaded only for a pair above
    NUMPY_MAX_ELEMENTS; with the C kernel, never."""
    code = (
        "import sys, numpy as np\n"
        "from parity.shared.metrics.tensor import NUMPY_MAX_ELEMENTS, compare_arrays\n"
        "x = np.linspace(-1, 1, NUMPY_MAX_ELEMENTS, dtype=np.float32)\n"
        "compare_arrays(x, x * np.float32(1.001))\n"
        "print('numba' in sys.modules)\n"
        "compare_arrays(np.append(x, 1), np.append(x, 1))\n"
        "print('numba' in sys.modules)\n"
    )
    import subprocess
    import sys

    code = code if c_kernel else WITHOUT_C_KERNEL + code
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == (["False", "False"] if c_kernel else ["False", "True"])
