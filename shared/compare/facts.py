"""The typed facts of a comparison's rows: what the judgement reads, beside the cells the reports show.

A row's cells are msprobe's display: a shape is the text ``"[4, 8]"``, a NaN the text ``Nan``, a relative
error ``"12.5%"``, a metric that could not be computed ``unsupported``. Parsing those back to judge a call
was a second reading of the dump, and a lossy one. Here each row keeps its facts as numbers: on each side
its dtype, its dimensions, its four statistics (NaN where one is not a number, with a mask saying which are
numbers at all), a non-tensor argument's recorded value and type, its md5; for the pair the six tensor
metrics and flags for what the pass found (shapes that differ, NaN/Inf at other places, no file, judged
from statistics only). Localization, the call errors, the held-format screen, the advisor and the per-call
records all read these.

The facts are built from the dump's columns (``DumpColumns``) by index, column-wise; they travel with a
table part between processes (``slices.encode_part``), so every field is a plain value msgspec encodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from operator import ne
from typing import Any

import msgspec
import numpy as np
from parity.shared.dump.columns import DumpColumns

__all__ = [
    "F_INCOMPATIBLE",
    "F_NO_FILE",
    "F_POSITIONS",
    "F_SHAPE",
    "F_STATISTICS_ONLY",
    "F_UNINITIALISED",
    "FILL_FRACTION",
    "METRICS",
    "RowFacts",
    "SideFacts",
    "fill_limits",
    "unit_roundoff",
]

#: the pair's shapes differ (the dims, or the files the metrics read)
F_SHAPE = 1
#: NaN/Inf at other places on the two sides (the metrics could not be computed)
F_POSITIONS = 2
#: judged from the statistics only (a planned dump: neither side saved the tensor)
F_STATISTICS_ONLY = 4
#: a tensor file that one side lacks, or that could not be read
F_NO_FILE = 8
#: dtypes msprobe does not pair (another dtype family)
F_INCOMPATIBLE = 16
#: an output of ``empty``-like call: uninitialised memory, no data to compare
F_UNINITIALISED = 32

#: the metric columns of ``RowFacts.metrics``, in order
METRICS = ("cosine", "euc_dist", "max_abs_err", "max_relative_err", "one_thousandth", "five_thousandths")

#: Unit roundoff (half an ulp of 1) per dtype, by the dtype's name as dumps record it (``torch.float32``).
_UNIT_ROUNDOFF = {
    "float64": 2.0**-53, "double": 2.0**-53, "float32": 2.0**-24, "float": 2.0**-24, "float16": 2.0**-11,
    "half": 2.0**-11, "bfloat16": 2.0**-8, "float8_e4m3fn": 2.0**-4, "float8_e5m2": 2.0**-3,
    "complex128": 2.0**-53, "complex64": 2.0**-24,
}  # fmt: skip
#: A value this large (this fraction of its dtype's largest finite value, or infinite), equal on both
#: sides, is a fill, not data: attention masks are float32's minimum (or -inf) on both sides, and a mask's
#: Mean and Norm, its cosine and its share of agreeing elements say nothing of the values it hides.
FILL_FRACTION = 0.5
_FINITE_MAX = {"float16": 65504.0, "half": 65504.0, "bfloat16": 3.3895313892515355e38,
               "float32": 3.4028234663852886e38, "float64": 1.7976931348623157e308}  # fmt: skip
_NON_FINITE_TEXT = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "+inf": np.inf, "infinity": np.inf,
                    "-infinity": -np.inf}  # fmt: skip


@cache
def unit_roundoff(dtype: object) -> float:
    """The unit roundoff of a recorded dtype (``torch.float16`` → 2**-11); 0 for a non-floating one."""
    if not isinstance(dtype, str):
        return 0.0
    return _UNIT_ROUNDOFF.get(dtype.rsplit(".", 1)[-1], 0.0)


def fill_limits(dtypes: Sequence[str | None]) -> np.ndarray:
    """Each dtype's fill limit (``FILL_FRACTION`` of its largest finite value; float32's where unknown)."""
    table: dict[str | None, float] = {}
    out = np.empty(len(dtypes))
    for i, d in enumerate(dtypes):
        limit = table.get(d)
        if limit is None:
            name = d.rsplit(".", 1)[-1] if isinstance(d, str) else ""
            limit = table[d] = FILL_FRACTION * _FINITE_MAX.get(name, _FINITE_MAX["float32"])
        out[i] = limit
    return out


def _number(value: Any) -> float | None:
    """A dumped statistic as a float (ints, bools, msprobe's ``nan``/``inf`` texts included), else None."""
    kind = type(value)
    if kind is float or kind is int or kind is bool:
        return float(value)
    if kind is str:
        return _NON_FINITE_TEXT.get(value.strip().lower())
    return None


class SideFacts(msgspec.Struct, gc=False):
    """One side's leaf of each row (NPU, or bench; a row without this side has ``present`` 0)."""

    dtype: list[str | None]
    dims: list[tuple[int, ...] | None]  # a tensor's dimensions; None for a non-tensor leaf
    stats: bytes  # Max, Min, Mean, Norm as float64, 4 a row: NaN where a statistic is no number
    numeric: bytes  # 4 a row: 1 where the statistic is a number (NaN and infinities included)
    tensor: bytes  # 1: a tensor leaf
    present: bytes  # 1: the row has this side
    md5: list[str | None]
    values: dict[int, Any] = {}  # row -> a non-tensor argument's recorded value
    arg_types: dict[int, str] = {}  # row -> its type as dumped (``torch.dtype``, ``str``, ``int``, ...)

    @classmethod
    def gather(cls, cols: DumpColumns, index: Sequence[int] | np.ndarray) -> SideFacts:
        """The leaves ``index`` names (-1: the row has no leaf on this side), column-wise."""
        idx = np.asarray(index, dtype=np.intp)
        n = idx.size
        present = idx >= 0
        safe = np.where(present, idx, 0)
        if len(cols) == 0:
            return cls.absent(n)
        stats = np.frombuffer(cols.stats, dtype=np.float64).reshape(-1, 4)[safe].copy()
        plain = np.frombuffer(cols.plain, dtype=np.bool_)[safe] & present
        numeric = np.repeat(plain[:, None], 4, axis=1)
        stats[~present] = np.nan
        odd = cols.odd
        rows = idx.tolist()
        if odd:
            for r in np.flatnonzero(present & ~plain).tolist():
                for k, value in enumerate(odd.get(rows[r], (None,) * 4)):
                    number = _number(value)
                    numeric[r, k] = number is not None
                    stats[r, k] = np.nan if number is None else number
        tensor = np.frombuffer(cols.is_tensor, dtype=np.bool_)[safe] & present
        dtypes, shapes, md5s = [*cols.dtypes, None], [*cols.shapes, None], [*cols.md5s, None]
        dims_of = cols.dims.get
        dims = [dims_of(s) if t and s is not None else None  # type: ignore[arg-type]
                for s, t in zip(map(shapes.__getitem__, rows), tensor.tolist(), strict=True)]  # fmt: skip
        values: dict[int, Any] = {}
        arg_types: dict[int, str] = {}
        if cols.arg_types or not tensor.all():
            stats_of, types = cols.stats_of, cols.arg_types
            for r in np.flatnonzero(present & ~tensor).tolist():
                j = rows[r]
                values[r] = stats_of(j)[0]
                kind = types.get(j)
                if kind is not None:
                    arg_types[r] = kind
        return cls(list(map(dtypes.__getitem__, rows)), dims, stats.tobytes(), numeric.tobytes(),
                   tensor.tobytes(), present.tobytes(), list(map(md5s.__getitem__, rows)), values,
                   arg_types)  # fmt: skip

    @classmethod
    def absent(cls, n: int) -> SideFacts:
        """``n`` rows without this side."""
        return cls([None] * n, [None] * n, np.full(4 * n, np.nan).tobytes(), bytes(4 * n), bytes(n), bytes(n),
                   [None] * n)  # fmt: skip

    def __len__(self) -> int:
        return len(self.dtype)

    # ---- views

    def stats_array(self) -> np.ndarray:
        """The statistics as an ``(n, 4)`` float64 array (read-only)."""
        return np.frombuffer(self.stats, dtype=np.float64).reshape(-1, 4)

    def numeric_array(self) -> np.ndarray:
        return np.frombuffer(self.numeric, dtype=np.bool_).reshape(-1, 4)

    def tensor_array(self) -> np.ndarray:
        return np.frombuffer(self.tensor, dtype=np.bool_)

    def present_array(self) -> np.ndarray:
        return np.frombuffer(self.present, dtype=np.bool_)

    def units(self) -> np.ndarray:
        """Each row's unit roundoff (0 where the leaf is not floating, or absent)."""
        return np.fromiter(map(unit_roundoff, self.dtype), dtype=np.float64, count=len(self.dtype))

    def numels(self) -> np.ndarray:
        """Each row's number of elements (-1 where the leaf is no tensor of known shape)."""
        sizes: dict[tuple[int, ...] | None, int] = {None: -1}
        out = np.empty(len(self.dims), dtype=np.int64)
        for i, d in enumerate(self.dims):
            size = sizes.get(d)
            if size is None:
                size = sizes[d] = int(np.prod(d)) if d else 1
            out[i] = size
        return out

    # ---- slicing

    def take(self, start: int, stop: int) -> SideFacts:
        """Rows ``[start, stop)``, renumbered from 0."""
        return SideFacts(self.dtype[start:stop], self.dims[start:stop], self.stats[32 * start : 32 * stop],
                         self.numeric[4 * start : 4 * stop], self.tensor[start:stop],
                         self.present[start:stop], self.md5[start:stop], _shift(self.values, start, stop),
                         _shift(self.arg_types, start, stop))  # fmt: skip

    @classmethod
    def concat(cls, parts: Sequence[SideFacts]) -> SideFacts:
        values: dict[int, Any] = {}
        arg_types: dict[int, str] = {}
        offset = 0
        for p in parts:
            values.update((r + offset, v) for r, v in p.values.items())
            arg_types.update((r + offset, v) for r, v in p.arg_types.items())
            offset += len(p)
        return cls([d for p in parts for d in p.dtype], [d for p in parts for d in p.dims],
                   b"".join(p.stats for p in parts), b"".join(p.numeric for p in parts),
                   b"".join(p.tensor for p in parts), b"".join(p.present for p in parts),
                   [m for p in parts for m in p.md5], values, arg_types)  # fmt: skip


def _shift(sparse: dict[int, Any], start: int, stop: int) -> dict[int, Any]:
    return {r - start: v for r, v in sparse.items() if start <= r < stop}


class RowFacts(msgspec.Struct, gc=False):
    """The facts of every row of a table, in row order: the NPU rows, then the bench-only rows."""

    names: list[str]  # the row's name (the NPU leaf's; a bench-only row's bench name)
    npu: SideFacts
    bench: SideFacts
    metrics: bytearray  # ``METRICS`` as float64, 6 a row: NaN where the metric is no number
    flags: bytearray  # ``F_*`` bits, one byte a row

    @classmethod
    def build(cls, names: list[str], npu: DumpColumns, npu_index: Sequence[int] | np.ndarray,
              bench: DumpColumns, bench_index: Sequence[int] | np.ndarray) -> RowFacts:  # fmt: skip
        """Row ``i`` is NPU leaf ``npu_index[i]`` against bench leaf ``bench_index[i]`` (-1: none)."""
        n = len(names)
        n_side, b_side = SideFacts.gather(npu, npu_index), SideFacts.gather(bench, bench_index)
        differ = np.fromiter(map(ne, n_side.dims, b_side.dims), dtype=np.bool_, count=n)
        shape = differ & n_side.tensor_array() & b_side.tensor_array()
        flags = bytearray((shape.astype(np.uint8) * F_SHAPE).tobytes())
        return cls(names, n_side, b_side, bytearray(np.full(6 * n, np.nan).tobytes()), flags)

    def __len__(self) -> int:
        return len(self.names)

    def metrics_array(self) -> np.ndarray:
        """The metrics as a writable ``(n, 6)`` float64 array over the facts' own buffer."""
        return np.frombuffer(self.metrics, dtype=np.float64).reshape(-1, 6)

    def flags_array(self) -> np.ndarray:
        """The flags as a writable uint8 array over the facts' own buffer."""
        return np.frombuffer(self.flags, dtype=np.uint8)

    def flag(self, i: int, bits: int) -> None:
        self.flags[i] |= bits

    def has(self, bits: int) -> np.ndarray:
        """Which rows carry any of ``bits``."""
        return (self.flags_array() & bits) != 0

    def take(self, start: int, stop: int) -> RowFacts:
        return RowFacts(self.names[start:stop], self.npu.take(start, stop), self.bench.take(start, stop),
                        self.metrics[48 * start : 48 * stop], self.flags[start:stop])  # fmt: skip

    @classmethod
    def concat(cls, parts: Sequence[RowFacts]) -> RowFacts:
        if len(parts) == 1:
            return parts[0]
        return cls([name for p in parts for name in p.names], SideFacts.concat([p.npu for p in parts]),
                   SideFacts.concat([p.bench for p in parts]), bytearray(b"".join(p.metrics for p in parts)),
                   bytearray(b"".join(p.flags for p in parts)))  # fmt: skip

    def masked(self) -> np.ndarray:
        """Which rows are masked tensors: their Max or Min a fill value (``fill_limits``) equal on both sides,
        an attention mask's float32 minimum or -inf."""
        a, b = self.npu.stats_array()[:, :2], self.bench.stats_array()[:, :2]
        both = self.npu.numeric_array()[:, :2] & self.bench.numeric_array()[:, :2]
        with np.errstate(invalid="ignore"):
            fill = (a == b) & both & (np.abs(a) >= fill_limits(self.npu.dtype)[:, None])
        return fill.any(axis=1) & self.npu.tensor_array() & self.bench.tensor_array()

    def value(self, side: str, i: int) -> Any:
        """Row ``i``'s recorded non-tensor value on ``side`` (``npu``/``bench``); None for a tensor."""
        facts = self.npu if side == "npu" else self.bench
        return facts.values.get(i)
