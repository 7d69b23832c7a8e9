"""The compiled half of tensor mode: one fused pass per segment of a tensor pair, in C or in numba.

The C module (``_fused.c``, built with the package where a C compiler is found; an optional extension, so an
install without one still succeeds) loads in well under a millisecond. Without it the same pass comes from
numba (:mod:`.numba_kernel`), whose import and cached-kernel load cost 0.5 s to 1.5 s a process. Both give the
accumulators of ``tensor.numpy_pass`` bit for bit (the tests hold all three equal), so which one ran never
shows in a cell. :data:`NATIVE` says which: ``tensor`` and ``parallel`` read it (through
``tensor.native_kernel``, which asks without importing numba) to decide whether a compare is large enough to
repay the kernel's start-up; the C one has none to repay.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from parity.shared.metrics.accumulators import N_ACC, native_kernel

#: Whether :func:`fused_pass` is the C module's (else numba's).
NATIVE = native_kernel()

if NATIVE:
    from parity.shared.metrics._fused import fused_pass as _native_pass  # type: ignore[import-not-found]

    def fused_pass(n: Any, b: Any, n_kind: int, b_kind: int, re_in_f32: bool, start: int,
                   stop: int) -> np.ndarray:  # fmt: skip
        """The accumulators of ``n[start:stop]`` against ``b[start:stop]`` (``tensor``'s ``A_*`` slots)."""
        acc = np.empty(N_ACC)
        _native_pass(n, b, n_kind, b_kind, re_in_f32, start, stop, acc)
        return acc

else:
    from parity.shared.metrics.numba_kernel import fused_pass  # type: ignore[no-redef]  # noqa: F401
