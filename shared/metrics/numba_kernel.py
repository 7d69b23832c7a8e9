"""The fused pass in numba: the fallback of :mod:`.kernel` where the C module (``_fused.c``) was not built.

numba is the dearest import of a compare: importing it and loading the cached kernel cost 0.5 s to 1.5 s a
process, more than a whole compare of small pairs. So ``kernel`` imports this module only without the C
module, and ``tensor`` only calls the kernel for a compare large enough to repay that; otherwise its numpy
pass gives the same accumulators.

``cache=True`` keeps the compiled machine code on disk (``__pycache__`` beside this file, or numba's user
cache dir where that is read-only), so only the first process after an install compiles it. numba keys that
cache to this file alone: the constants imported from ``tensor`` are baked into the machine code, so after
changing one of them, touch this file (or clear its cache). A stale kernel would not go unseen: the tests
hold it equal, bit for bit, to the numpy pass, which reads the constants afresh.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit
from parity.shared.metrics.accumulators import (
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
    KIND_NATIVE,
    N_ACC,
)


@njit(cache=True, fastmath=False, nogil=True, inline="always")
def _decode16(bits: int, kind: int) -> float:  # pragma: no cover - compiled
    """Exact float value of a bfloat16 (kind 1) or float16 (kind 2) bit pattern."""
    u = np.uint32(bits)
    negative = (u >> 15) & 1
    if kind == KIND_BF16:
        exp = np.int64((u >> 7) & 0xFF)
        man = np.int64(u & 0x7F)
        if exp == 0xFF:
            v = math.inf if man == 0 else math.nan
        elif exp == 0:
            v = math.ldexp(float(man), -133)
        else:
            v = math.ldexp(float(man + 128), int(exp - 134))
    else:
        exp = np.int64((u >> 10) & 0x1F)
        man = np.int64(u & 0x3FF)
        if exp == 0x1F:
            v = math.inf if man == 0 else math.nan
        elif exp == 0:
            v = math.ldexp(float(man), -24)
        else:
            v = math.ldexp(float(man + 1024), int(exp - 25))
    return -v if negative else v


@njit(cache=True, fastmath=False, nogil=True)
def fused_pass(n, b, n_kind, b_kind, re_in_f32, start, stop):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Accumulate every tensor-mode statistic over ``n[start:stop]`` vs ``b[start:stop]`` in one pass.

    NaN/Inf at identical positions (same class and, for inf, same sign) count as 0 == 0; any other
    non-finite pairing is counted as a mismatch and left out.
    """
    acc = np.zeros(N_ACC)
    acc[A_MAX_ABS_IDX] = -1.0
    acc[A_FIRST_MISMATCH] = -1.0
    eps32 = np.float32(_EPS32)
    thr1_32 = np.float32(0.001)
    thr5_32 = np.float32(0.005)
    eps64 = _EPS64
    max_abs = 0.0
    max_abs_idx = -1
    max_re = 0.0
    lt1 = 0
    lt5 = 0
    mismatches = 0
    first_mismatch = -1
    dot = 0.0
    nn = 0.0
    bb = 0.0
    dd = 0.0
    i = start
    while i < stop:
        end = min(i + _BLOCK, stop)
        s_dot = 0.0
        s_nn = 0.0
        s_bb = 0.0
        s_dd = 0.0
        for j in range(i, end):
            x = _decode16(n[j], n_kind) if n_kind != KIND_NATIVE else float(n[j])
            y = _decode16(b[j], b_kind) if b_kind != KIND_NATIVE else float(b[j])
            if not (math.isfinite(x) and math.isfinite(y)):
                if (math.isnan(x) and math.isnan(y)) or x == y:
                    x = 0.0
                    y = 0.0
                else:
                    mismatches += 1
                    if first_mismatch < 0:
                        first_mismatch = j
                    continue
            s_dot += x * y
            s_nn += x * x
            s_bb += y * y
            d = x - y
            s_dd += d * d
            ad = abs(d)
            if ad > max_abs or (ad != ad and max_abs == max_abs):
                max_abs = ad
                max_abs_idx = j
            if re_in_f32:
                xf = np.float32(x)
                yf = np.float32(y)
                if yf == np.float32(0.0):
                    xf = xf + eps32
                    yf = yf + eps32
                re32 = abs((xf - yf) / yf)
                if re32 < thr1_32:
                    lt1 += 1
                if re32 < thr5_32:
                    lt5 += 1
                re = float(re32)
            else:
                xd = x
                yd = y
                if yd == 0.0:
                    xd = xd + eps64
                    yd = yd + eps64
                re = abs((xd - yd) / yd)
                if re < 0.001:
                    lt1 += 1
                if re < 0.005:
                    lt5 += 1
            if re > max_re or (re != re and max_re == max_re):
                max_re = re
        dot += s_dot
        nn += s_nn
        bb += s_bb
        dd += s_dd
        i = end
    acc[A_DOT] = dot
    acc[A_NN] = nn
    acc[A_BB] = bb
    acc[A_DD] = dd
    acc[A_MAX_ABS] = max_abs
    acc[A_MAX_ABS_IDX] = max_abs_idx
    acc[A_MAX_RE] = max_re
    acc[A_LT1] = lt1
    acc[A_LT5] = lt5
    acc[A_MISMATCH] = mismatches
    acc[A_FIRST_MISMATCH] = first_mismatch
    return acc
