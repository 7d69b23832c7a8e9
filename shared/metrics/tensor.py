"""Tensor-mode metrics (compare.md §4): the §4.2 validation chain and one fused pass per tensor pair.

msprobe computes each metric with its own numpy pass over float64 copies (a dozen passes, ~5x the tensor's
bytes of temporaries). Here one compiled loop (C, or numba without the C module) reads both arrays in their
own dtype (float16 and bfloat16 as raw bits, decoded exactly) and accumulates everything at once in float64:
the dot product, both squared norms, the squared distance, the max absolute error (and where it is), the max
relative error and the two ratio counts, plus the NaN/Inf position check. Nothing the size of the tensor is
allocated.

Numbers follow msprobe v2 to the printed digit (§4.3): the relative error is computed in
``T = result_type(N, B, float32)`` (float64 once either side is an int or a bool) with ε_T substituted where
the bench is 0, and the ratio thresholds compared in ``T``; everything else is float64. Where msprobe is
wrong Parity is not: +inf against -inf at one position is a NaN/Inf position mismatch, not "equal".

Sums are taken block by block (``_BLOCK`` elements, then added to running totals) over fixed
``SEGMENT_ELEMENTS`` segments combined in order, so a tensor split across workers gives bit-identical results
to the serial pass.

The fused loop is compiled (:mod:`.kernel`: the C module ``_fused``, or numba's where it was not built),
imported only when it is used: ``numpy_pass`` gives the same accumulators bit for bit in plain numpy (in
bounded chunks). The C kernel costs nothing to start, so every pair takes it; numba's start-up is most of a
small compare's time, so with numba ``parallel`` chooses once per compare, by its total size, and a lone call
by the pair's size (``NUMPY_MAX_ELEMENTS``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from parity.shared.metrics.accumulators import (  # noqa: F401  (re-exported: the engine's names for them)
    _BLOCK,
    _EPS32,
    _EPS64,
    A_BB,
    A_DD,
    A_DOT,
    A_FIRST_MISMATCH,
    A_LT1,
    A_LT5,
    A_MAX_ABS,
    A_MAX_ABS_IDX,
    A_MAX_RE,
    A_MISMATCH,
    A_NN,
    KIND_BF16,
    KIND_FP16,
    KIND_NATIVE,
    N_ACC,
    native_kernel,
)
from parity.shared.tensor_io import RawTensor

UNSUPPORTED = "unsupported"
SHAPE_UNMATCHED = "shape unmatched"
NOT_AVAILABLE = "N/A"
NAN = "Nan"

MSG_NO_NPU_FILE = "NPU does not have data file."
MSG_NO_BENCH_FILE = "Bench does not have data file."
MSG_UNREADABLE = "Data is unreadable."
MSG_EMPTY = "This is empty data, can not compare."
MSG_SHAPE = "Shape of NPU and bench tensor do not match. Skipped."
MSG_ZERO_D = (  # msprobe's spelling, trailing space included: its messages are appended to one another
    "This is type of 0-d tensor, can not calculate 'Cosine', 'EucDist', 'One Thousandth Err Ratio' and "
    "'Five Thousandths Err Ratio'. "
)
MSG_NAN_INF_POSITION = "The position of inf or nan in NPU and bench Tensor do not match."
MSG_DTYPE = "Dtype of NPU and bench tensor do not match."
MSG_LENGTH_ONE = "This is a 1-d tensor of length 1."
MSG_COSINE_NPU_ZERO = "Cannot compare by Cosine Similarity, All the data is Zero in npu dump data."
MSG_COSINE_BENCH_ZERO = "Cannot compare by Cosine Similarity, All the data is Zero in Bench dump data."
MSG_COSINE_NAN = "Cannot compare by Cosine Similarity, the dump data has NaN."
MSG_MAX_ABS_NAN = "Cannot compare by MaxAbsError, the data contains nan/inf/-inf in dump data."
MSG_MAX_REL_NAN = "Cannot compare by MaxRelativeError, the data contains nan/inf/-inf in dump data."

#: Cosine values above this are shown with 6 decimals instead of 12 (msprobe's ``COSINE_THRESHOLD``).
COSINE_THRESHOLD = 0.9999

#: Elements per segment: the unit a large tensor is split into; results never depend on how segments are
#: spread over workers because their partial sums are always combined in segment order.
SEGMENT_ELEMENTS = 1 << 22

Metric = float | str


def missing_file_message(name: str) -> str:
    """msprobe's message for a data file that is missing or fails to load."""
    return f"Dump file: {name} not found or read failed."


@dataclass(frozen=True, slots=True)
class TensorMetrics:
    """The six tensor-mode cells of one row, each a number or one of msprobe's sentinel strings.

    ``messages`` are msprobe's Err_message fragments, each once, in the order msprobe produces them.
    ``max_abs_err_index`` is Parity's own: the flat (C-order) index of the first largest absolute error
    in the squeezed arrays, ``None`` when MaxAbsErr was not computed.
    """

    cosine: Metric
    euc_dist: Metric
    max_abs_err: Metric
    max_relative_err: Metric
    one_thousandth: Metric
    five_thousandths: Metric
    messages: tuple[str, ...] = ()
    max_abs_err_index: int | None = None
    #: the tensor file that was missing or could not be read (its path as the job gave it), if any
    unread_file: str | None = None

    @classmethod
    def all_cells(cls, value: str, *messages: str) -> TensorMetrics:
        """Every metric cell set to the same sentinel (``unsupported``, ``N/A``, ``shape unmatched``)."""
        return cls(value, value, value, value, value, value, tuple(m for m in messages if m))


def format_value(value: float) -> float:
    """msprobe's 12-decimal rounding (``float('{:.12f}')``): anything below 5e-13 becomes 0.0."""
    return float(f"{value:.12f}")


# --- the fused kernel --------------------------------------------------------------------------------



#: A pair of up to this many elements takes the numpy pass, a larger one the compiled kernel (``.kernel``),
#: unless the caller chooses (``compiled=``; ``parallel`` chooses once per compare, by its total size). The
#: numpy pass costs about 50 ns an element against the kernel's 1 ns, but the kernel costs 0.5 s to 1.5 s a
#: process to import and load.
NUMPY_MAX_ELEMENTS = 1 << 16
#: Elements the numpy pass holds at once (a whole number of blocks): its temporaries stay near 3 MB.
NUMPY_CHUNK = 64 * _BLOCK


def _as_float64(arr: np.ndarray, kind: int) -> np.ndarray:
    """The elements as float64, exactly (bfloat16 and float16 bit patterns decoded)."""
    if kind == KIND_BF16:
        with np.errstate(invalid="ignore"):  # a signalling-NaN pattern warns as it widens; it stays NaN
            return (arr.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if kind == KIND_FP16:
        return arr.view(np.float16).astype(np.float64)
    return arr.astype(np.float64)


def _block_sums(values: np.ndarray) -> np.ndarray:
    """Each ``_BLOCK``'s sum, added left to right as the kernel does (``cumsum`` adds strictly in order)."""
    size = values.size
    full = size - size % _BLOCK
    parts = np.cumsum(values[:full].reshape(-1, _BLOCK), axis=1)[:, -1] if full else values[:0]
    return np.append(parts, np.cumsum(values[full:])[-1]) if full < size else parts


def numpy_pass(n: np.ndarray, b: np.ndarray, n_kind: int, b_kind: int, re_in_f32: bool, start: int,
               stop: int) -> np.ndarray:  # fmt: skip
    """``kernel.fused_pass`` in numpy: the same accumulators, bit for bit (tests hold them equal), in about
    twenty array passes over chunks of ``NUMPY_CHUNK`` elements; for compares too small to repay numba."""
    acc = np.zeros(N_ACC)
    acc[A_MAX_ABS_IDX] = acc[A_FIRST_MISMATCH] = -1.0
    sums: list[list[np.ndarray]] = [[], [], [], []]
    for lo in range(start, stop, NUMPY_CHUNK):  # chunks start on block boundaries, as the kernel's blocks
        hi = min(lo + NUMPY_CHUNK, stop)
        x, y = _as_float64(n[lo:hi], n_kind), _as_float64(b[lo:hi], b_kind)
        with np.errstate(all="ignore"):
            finite = np.isfinite(x) & np.isfinite(y)
            skipped = 0
            if not finite.all():
                # Non-finite at the same place with the same class count as 0 against 0; any other pairing
                # is a mismatch, left out of every sum, count and maximum (zeroed, its ratio hits taken back).
                mismatch = ~finite & ~((np.isnan(x) & np.isnan(y)) | (x == y))
                skipped = int(np.count_nonzero(mismatch))
                if skipped and acc[A_FIRST_MISMATCH] < 0:
                    acc[A_FIRST_MISMATCH] = lo + int(np.argmax(mismatch))
                x, y = np.where(finite, x, 0.0), np.where(finite, y, 0.0)
            d = x - y
            ad = np.abs(d)
            if re_in_f32:
                xf, yf = x.astype(np.float32), y.astype(np.float32)
                zero = yf == np.float32(0.0)
                eps = np.float32(_EPS32)
                xf, yf = np.where(zero, xf + eps, xf), np.where(zero, yf + eps, yf)
                re32 = np.abs((xf - yf) / yf)
                lt1 = np.count_nonzero(re32 < np.float32(0.001))
                lt5 = np.count_nonzero(re32 < np.float32(0.005))
                re = re32.astype(np.float64)
            else:
                zero = y == 0.0
                xd, yd = np.where(zero, x + _EPS64, x), np.where(zero, y + _EPS64, y)
                re = np.abs((xd - yd) / yd)
                lt1, lt5 = np.count_nonzero(re < 0.001), np.count_nonzero(re < 0.005)
            for k, products in enumerate((x * y, x * x, y * y, d * d)):
                sums[k].append(_block_sums(products))
        # The kernel keeps the first largest value (strictly greater replaces it), and a NaN once one appears.
        k = int(np.argmax(ad))  # the first maximum, or the first NaN
        top, best = float(ad[k]), float(acc[A_MAX_ABS])
        if top > best or (top != top and best == best):
            acc[A_MAX_ABS], acc[A_MAX_ABS_IDX] = top, lo + k
        top, best = (math.nan if np.isnan(re).any() else float(np.max(re))), float(acc[A_MAX_RE])
        if top > best or (top != top and best == best):
            acc[A_MAX_RE] = top
        acc[A_LT1] += lt1 - skipped
        acc[A_LT5] += lt5 - skipped
        acc[A_MISMATCH] += skipped
    for slot, parts in zip((A_DOT, A_NN, A_BB, A_DD), sums, strict=True):
        if parts:  # the block sums added in order; ``+ 0.0`` gives the kernel's sign of an all-zero sum
            acc[slot] = float(np.cumsum(np.concatenate(parts))[-1]) + 0.0
    return acc


def combine_partials(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Combine per-segment accumulators, in segment order (so the result never depends on who ran what)."""
    total = parts[0].copy()
    for part in parts[1:]:
        for k in (A_DOT, A_NN, A_BB, A_DD, A_LT1, A_LT5, A_MISMATCH):
            total[k] += part[k]
        pm, tm = part[A_MAX_ABS], total[A_MAX_ABS]
        if pm > tm or (math.isnan(pm) and not math.isnan(tm)):
            total[A_MAX_ABS] = pm
            total[A_MAX_ABS_IDX] = part[A_MAX_ABS_IDX]
        pr, tr = part[A_MAX_RE], total[A_MAX_RE]
        if pr > tr or (math.isnan(pr) and not math.isnan(tr)):
            total[A_MAX_RE] = pr
        if total[A_FIRST_MISMATCH] < 0:
            total[A_FIRST_MISMATCH] = part[A_FIRST_MISMATCH]
    return total


# --- preparing a pair --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreparedPair:
    """A validated pair ready for the fused pass: flat arrays, how to read them, and the dtype rule."""

    n: np.ndarray
    b: np.ndarray
    n_kind: int
    b_kind: int
    re_in_f32: bool
    size: int
    messages: tuple[str, ...]


def _logical_dtype(raw: RawTensor) -> np.dtype:  # type: ignore[type-arg]
    """The dtype msprobe would see after loading (bfloat16 is widened to float32)."""
    return np.dtype(np.float32) if raw.bfloat16 else raw.array.dtype


def _kernel_view(raw: RawTensor) -> tuple[np.ndarray, int]:
    arr = raw.array.reshape(-1)  # a view for the contiguous (memory-mapped) arrays dumps hold
    if raw.bfloat16:
        return arr, KIND_BF16
    if arr.dtype == np.float16:
        return arr.view(np.uint16), KIND_FP16
    if arr.dtype == np.bool_:
        return arr.view(np.uint8), KIND_NATIVE
    return arr, KIND_NATIVE


def relative_error_in_float32(n_dtype: np.dtype, b_dtype: np.dtype) -> bool:  # type: ignore[type-arg]
    """Whether ``T = result_type(N, B, float32)`` is float32 (ints and bools are cast to float64 first)."""
    if n_dtype.kind != "f" or b_dtype.kind != "f":
        return False
    return bool(np.result_type(n_dtype, b_dtype, np.float32) == np.float32)


def validate(npu: RawTensor, bench: RawTensor) -> TensorMetrics | PreparedPair:
    """The §4.2 chain in v2 order, after loading: a finished :class:`TensorMetrics` when the chain stops
    the row (or for a 0-d pair, whose two metrics are computed here), else the pair for the fused pass."""
    n_dtype, b_dtype = _logical_dtype(npu), _logical_dtype(bench)
    if n_dtype.kind not in "biuf" or b_dtype.kind not in "biuf":
        return TensorMetrics.all_cells(UNSUPPORTED, MSG_UNREADABLE)
    if npu.array.size == 0:
        return TensorMetrics.all_cells(UNSUPPORTED, MSG_EMPTY)
    if npu.array.shape != bench.array.shape:
        return TensorMetrics.all_cells(SHAPE_UNMATCHED, MSG_SHAPE)
    if npu.array.ndim == 0:
        return _zero_d(npu.to_numpy(), bench.to_numpy())
    n, n_kind = _kernel_view(npu)
    b, b_kind = _kernel_view(bench)
    messages = (MSG_DTYPE,) if n_dtype != b_dtype else ()
    re_in_f32 = relative_error_in_float32(n_dtype, b_dtype)
    return PreparedPair(n, b, n_kind, b_kind, re_in_f32, int(n.size), messages)


def segments(size: int) -> list[tuple[int, int]]:
    """The fixed ``[start, stop)`` segments a pair of ``size`` elements is accumulated over."""
    return [(s, min(s + SEGMENT_ELEMENTS, size)) for s in range(0, size, SEGMENT_ELEMENTS)] or [(0, 0)]


def run_segment(pair: PreparedPair, start: int, stop: int, *, compiled: bool | None = None) -> np.ndarray:
    """Accumulators of one segment of a prepared pair: on the compiled kernel (imported at its first use; it
    releases the GIL while it runs) or the numpy pass; ``compiled=None`` takes the C kernel for any pair and
    numba's for a pair of more than ``NUMPY_MAX_ELEMENTS``."""
    if compiled is None:
        compiled = native_kernel() or pair.size > NUMPY_MAX_ELEMENTS
    if not compiled:
        return numpy_pass(pair.n, pair.b, pair.n_kind, pair.b_kind, pair.re_in_f32, start, stop)
    from parity.shared.metrics.kernel import fused_pass

    return fused_pass(pair.n, pair.b, pair.n_kind, pair.b_kind, pair.re_in_f32, start, stop)  # type: ignore[no-any-return]


def finish(pair: PreparedPair, acc: np.ndarray, *, ndim: int = 1) -> TensorMetrics:
    """Turn combined accumulators into the six cells, with msprobe's special cases and rounding."""
    if acc[A_MISMATCH] > 0:
        return TensorMetrics.all_cells(NOT_AVAILABLE, MSG_NAN_INF_POSITION)
    messages: list[str] = list(pair.messages)
    size = pair.size

    cosine: Metric
    if size == 1:
        cosine = UNSUPPORTED
        messages.append(MSG_LENGTH_ONE)
    else:
        n_norm, b_norm = math.sqrt(acc[A_NN]), math.sqrt(acc[A_BB])
        if n_norm <= _EPS64 and b_norm <= _EPS64:
            cosine = 1.0
        elif n_norm <= _EPS64 or b_norm <= _EPS64:
            cosine = NAN
            messages.append(MSG_COSINE_NPU_ZERO if n_norm <= _EPS64 else MSG_COSINE_BENCH_ZERO)
        else:
            with np.errstate(all="ignore"):
                raw_cos = float(np.float64(acc[A_DOT]) / (np.float64(n_norm) * np.float64(b_norm)))
            if math.isnan(raw_cos):
                cosine = NAN
                messages.append(MSG_COSINE_NAN)
            else:
                cosine = min(max(format_value(raw_cos), -1.0), 1.0)
                if cosine > COSINE_THRESHOLD:
                    cosine = round(cosine, 6)
    euc_dist: Metric = math.sqrt(acc[A_DD])
    max_abs, max_abs_msg = _max_metric(acc[A_MAX_ABS], MSG_MAX_ABS_NAN)
    max_rel, max_rel_msg = _max_metric(acc[A_MAX_RE], MSG_MAX_REL_NAN)
    messages += [m for m in (max_abs_msg, max_rel_msg) if m]
    return TensorMetrics(
        cosine=cosine,
        euc_dist=euc_dist,
        max_abs_err=max_abs,
        max_relative_err=max_rel,
        one_thousandth=format_value(acc[A_LT1] / size),
        five_thousandths=format_value(acc[A_LT5] / size),
        messages=_unique(messages),
        max_abs_err_index=int(acc[A_MAX_ABS_IDX]) if acc[A_MAX_ABS_IDX] >= 0 else None,
    )


def _max_metric(value: float, nan_message: str) -> tuple[Metric, str]:
    if math.isnan(value):
        return NAN, nan_message
    return format_value(value), ""


def _unique(messages: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(m for m in messages if m))


def _zero_d(n: np.ndarray, b: np.ndarray) -> TensorMetrics:
    """0-d pair: only MaxAbsErr and MaxRelativeErr; msprobe applies no NaN/Inf position rule here."""
    x, y = float(n), float(b)
    with np.errstate(all="ignore"):
        t = np.float32 if relative_error_in_float32(n.dtype, b.dtype) else np.float64
        xt: Any = t(x)
        yt: Any = t(y)
        eps: Any = t(np.finfo(t).eps)
        if yt == 0:
            xt, yt = xt + eps, yt + eps
        re = float(np.abs((xt - yt) / yt))
    max_abs, max_abs_msg = _max_metric(abs(x - y), MSG_MAX_ABS_NAN)
    max_rel, max_rel_msg = _max_metric(re, MSG_MAX_REL_NAN)
    return TensorMetrics(
        cosine=UNSUPPORTED,
        euc_dist=UNSUPPORTED,
        max_abs_err=max_abs,
        max_relative_err=max_rel,
        one_thousandth=UNSUPPORTED,
        five_thousandths=UNSUPPORTED,
        messages=_unique([MSG_ZERO_D, max_abs_msg, max_rel_msg]),
        max_abs_err_index=0 if max_abs_msg == "" else None,
    )


def unmask(pair: PreparedPair, fill: float) -> tuple[PreparedPair, int]:
    """The pair with its masked elements (equal on both sides and at least ``fill`` in magnitude: an
    attention mask's float32 minimum, ``-inf``) set to 0 on both sides, as float64 copies, and how many
    there were. A mask is no data: with it, the cosine of any two masked score tensors is 1 and the ratios
    count its elements as agreeing. Unchanged (count 0) where none, or every element, is masked."""
    x, y = _as_float64(pair.n, pair.n_kind), _as_float64(pair.b, pair.b_kind)  # copies: files stay as read
    with np.errstate(invalid="ignore"):
        masked = (x == y) & (np.abs(x) >= fill)
    count = int(np.count_nonzero(masked))
    if count == 0 or count == pair.size:
        return pair, 0
    x[masked] = 0.0
    y[masked] = 0.0
    return dataclasses.replace(pair, n=x, b=y, n_kind=KIND_NATIVE, b_kind=KIND_NATIVE), count


def compare_raw(npu: RawTensor, bench: RawTensor, *, compiled: bool | None = None,
                fill: float = math.inf) -> TensorMetrics:  # fmt: skip
    """Metrics of one loaded pair (as :func:`parity.shared.tensor_io.open_tensor` returns them); ``compiled``
    as in :func:`run_segment` (the cells are the same either way). A finite ``fill``: the metrics are taken
    over the elements that are not masked with values of at least that magnitude (``unmask``)."""
    prepared = validate(npu, bench)
    if isinstance(prepared, TensorMetrics):
        return prepared
    masked = 0
    if fill < math.inf:
        prepared, masked = unmask(prepared, fill)
    parts = [run_segment(prepared, start, stop, compiled=compiled) for start, stop in segments(prepared.size)]
    acc = combine_partials(parts)
    if masked:  # each masked element counted as agreeing (0 against 0): the ratios are of the others
        acc[A_LT1] -= masked
        acc[A_LT5] -= masked
        messages = (*prepared.messages, masked_message(masked, prepared.size))
        prepared = dataclasses.replace(prepared, size=prepared.size - masked, messages=messages)
    return finish(prepared, acc)


def masked_message(masked: int, size: int) -> str:
    """The Err_message fragment of a pair whose metrics leave its masked elements out."""
    return f"{masked} of {size} elements are a mask (equal fill values): left out of the metrics."


def compare_arrays(npu: np.ndarray, bench: np.ndarray) -> TensorMetrics:
    """Tensor-mode metrics of two arrays as loaded by :func:`parity.shared.tensor_io.load_tensor`.

    The arrays are compared as given (loading already squeezed them); no copy of their size is made.
    """
    return compare_raw(RawTensor(np.asarray(npu)), RawTensor(np.asarray(bench)))
