"""What the fused tensor pass and its readers agree on: the accumulator slots, the element kinds, the block.

``tensor`` (the numpy pass and the cells), ``kernel`` (which compiled pass runs) and ``numba_kernel`` (the
numba pass) all read these; kept here, below the three, so that none of them imports another for its
constants (they used to import each other, a cycle). ``_fused.c`` repeats ``BLOCK`` and ``N_ACC``, and
:func:`native_kernel` refuses a build whose copies differ.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["KIND_BF16", "KIND_FP16", "KIND_NATIVE", "N_ACC", "native_kernel"]

_EPS64 = float(np.finfo(np.float64).eps)
_EPS32 = float(np.finfo(np.float32).eps)
#: Elements summed pairwise as one block (the kernels' and the numpy pass's unit, so their sums agree).
_BLOCK = 1024

KIND_NATIVE = 0  # read the array's elements as they are (float32/64, ints, bools)
KIND_BF16 = 1  # uint16 bit patterns of bfloat16
KIND_FP16 = 2  # uint16 bit patterns of IEEE float16 (numba has no float16 arithmetic on CPU)

# Indices into the accumulator vector the kernel returns.
(A_DOT, A_NN, A_BB, A_DD, A_MAX_ABS, A_MAX_ABS_IDX, A_MAX_RE, A_LT1, A_LT5, A_MISMATCH,
 A_FIRST_MISMATCH) = range(11)  # fmt: skip
N_ACC = 11


@functools.cache
def native_kernel() -> bool:
    """Whether the compiled kernel is the C module's (``_fused.c``), which costs nothing to start, so every
    pair takes it; else numba's, worth its start-up only for a large compare. Asking imports no numba."""
    try:
        from parity.shared.metrics import _fused  # type: ignore[attr-defined]
    except ImportError:  # not built: no C compiler where the package was installed
        return False
    # A build left over from other constants would sum differently: numba's kernel reads them afresh.
    return (_fused.BLOCK, _fused.N_ACC) == (_BLOCK, N_ACC)
