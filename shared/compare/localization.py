"""Localization: which API call, in the order the calls ran, is where the two runs start to differ.

A comparison table answers "which rows differ"; after the first lost bit nearly all of them do. The question a
user asks is which *call* lost precision, so this module reads the finished table call by call, in execution
order (the dump's order: Parity's client writes each entry when its call completes, forward and backward
interleaved, so the order is exact; a msprobe dump is taken in its own order), and for each call sets the
error of its outputs against the error of its inputs:

* ``input_err``: the largest normwise relative error of its input, keyword and parameter tensors
  (``||npu - bench|| / ||bench||`` in tensor mode; from the relative changes of max, min, mean and norm in
  statistics mode; 0 or infinite in md5 mode);
* ``output_err``: the same over all its outputs together (each weighted by its norm).

A call is expected to pass on its inputs' error times a gain (the median of the other calls of its API kind,
else the upper gain of all other calls) plus a noise floor, added in quadrature. The floor is learned from
the run pair itself: the median output error of the calls whose inputs are identical (what a call adds on
its own; a call's own sample never counts for it). A pair often has one such call only, its first (the data
and the weights agree, nothing else does yet); that call is then judged by what comes after it:

* if a call that computes a floating output from identical recorded inputs gives an identical one, the pair
  computes exactly where its data agree, so there is no background and the floor stays MIN_FLOOR;
* otherwise the floor is a low quantile (DOWNSTREAM_QUANTILE) of the later calls' output errors: background
  noise is fresh at every call, so nearly every later output carries at least the background, whereas a
  fault's error reaches later calls only through their gains, which the loss, reductions and the optimizer's
  updates make small.

Two runs on different kernels differ a little everywhere; a call is only a suspect when its output
error stands SUSPECT_SCORE decades (5.6x) or more above that expectation. Its score is
``log10(output_err / expected)``. A backward call also reads what its forward saved, so its input error
includes its forward's input and output error.

Rules that hold whatever the numbers:

* identical values on both sides, identical NaN/Inf positions included, have error 0 and never make a
  suspect (the ``-inf`` fill value of ``masked_fill`` is not a loss of precision);
* a call whose inputs are unmatched is not judged (the loss happened before it or cannot be seen), nor is
  the backward of a selecting op (max pooling, ReLU, dropout, max/min, sort) whose forward inputs already
  differ: a tie that flips sends a gradient elsewhere, an error no gain can scale;
* md5 mode: a suspect is a call whose inputs all match and whose outputs do not; all score alike, so they are
  ranked in execution order.

The first divergence is the earliest suspect (in execution order) whose effect carries on: a later call's
inputs differ by at least a tenth of its output error. The engine turns a ``Localization`` into the
``Suspect`` list and the advisor's lines; the multi-rank view (``first_diverged_rank``) compares ranks by the
number of collectives each ran before its first divergence (a collective's counter is per rank, and every rank
runs the same collectives in the same order, so it is a clock the ranks share).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from parity.shared.compare.headers import CompareMode
from parity.shared.compare.result import Cell, CompareRow, RowStatus, Suspect
from parity.shared.dump.columns import STATE_INPUT, STATE_OUTPUT, STATE_PARAMETERS

__all__ = [
    "CallEvidence",
    "Localization",
    "RankDivergence",
    "direction_of",
    "first_diverged_rank",
    "localize",
    "row_errors",
    "user_frame",
]

#: A call stands out when its output error is this many decades above what its inputs and the noise explain:
#: 0.75 is 5.6x, chosen on benchmarks/bench_localization.py's noisy variant (seed 10; its sweep line gives
#: the figures at 0.5, 1.0 and 1.5). Seeds 11 and up were not used to choose it.
SUSPECT_SCORE = 0.75
#: Score given to a call whose outputs differ in their NaN/Inf positions (or md5) while its inputs agree.
INFINITE_SCORE = 12.0
#: The floor never goes below this (float64 rounding of a normwise error): exact runs have no noise to learn.
MIN_FLOOR = 1e-12
#: The quantile of the noise samples (output errors of calls with identical inputs) taken as the floor.
FLOOR_QUANTILE = 0.5
#: The share of the later calls' output errors below the floor of a call with no other noise sample.
DOWNSTREAM_QUANTILE = 0.1
#: ... taken from at least this many later calls (fewer say nothing of a background: the floor stays exact).
MIN_DOWNSTREAM_CALLS = 10
#: Gain allowed for an API kind with too few calls to learn its own (an upper quantile of all gains).
GAIN_QUANTILE = 0.9
#: A kind's own gain is learned from at least this many of its other calls.
MIN_KIND_CALLS = 1
#: "Carries on": a later call's input error reaches this share of the suspect's output error.
CARRY_SHARE = 0.1
_COLLECTIVE_PREFIX = "Distributed."
_MODULE_PREFIX = "Module."
_JUDGED_INPUTS = frozenset({STATE_INPUT, STATE_PARAMETERS, "kwargs", "input_kwargs"})
_UNKNOWN_STATUS = frozenset({RowStatus.UNMATCHED, RowStatus.BENCH_ONLY})  # uncomparable: a None argument
_COUNT = re.compile(r"^\d+$")
#: Ops whose backward routes the gradient by a comparison made in the forward (which element is the max, which
#: is positive, which was dropped): once their forward inputs differ at all, a tie that flips sends a gradient
#: elsewhere, an error no gain can scale. Their backward is not judged then (it is downstream of the cause).
_SELECTING_OPS = frozenset({
    "relu", "relu_", "relu6", "leaky_relu", "hardtanh", "threshold", "clamp", "clip", "max", "min", "amax",
    "amin", "sort", "topk", "kthvalue", "median", "argmax", "argmin", "dropout", "where", "maximum",
    "minimum",
})  # fmt: skip
_SELECTING_PREFIXES = ("max_pool", "adaptive_max_pool", "fractional_max_pool", "max_unpool")


def direction_of(api: str) -> str | None:
    """``forward``/``backward`` from an entry name (APIs: count then direction; modules: the other way)."""
    tokens = api.split(".")
    if "backward" in tokens[-2:]:
        return "backward"
    if "forward" in tokens[-2:]:
        return "forward"
    return None


def forward_of(api: str) -> str:
    """The forward entry of a backward one (``X.3.backward`` → ``X.3.forward``; modules: ``M.backward.3``)."""
    tokens = api.split(".")
    for k in (-1, -2):
        if len(tokens) >= -k and tokens[k] == "backward":
            tokens[k] = "forward"
            return ".".join(tokens)
    return api


def _selecting(api: str) -> bool:
    tokens = api.split(".")
    op = tokens[1] if len(tokens) > 1 else ""
    return op in _SELECTING_OPS or op.startswith(_SELECTING_PREFIXES)


def api_kind(api: str) -> str:
    """The API an entry calls, without its call count: ``Functional.gelu.3.backward`` → ``Functional.gelu
    .backward`` (calls of one kind share a gain)."""
    return ".".join(t for t in api.split(".") if not _COUNT.match(t))


# ------------------------------------------------------------------------------------------------------
# per-row errors


def _num(cell: Cell) -> float | None:
    """A statistics or metric cell as a float (msprobe's ``Nan``/``inf`` texts included), else None."""
    if isinstance(cell, bool):
        return float(cell)
    if isinstance(cell, (int, float)):
        return float(cell)
    if isinstance(cell, str):
        text = cell.strip().lower()
        if text in ("nan", "inf", "-inf", "+inf", "infinity", "-infinity"):
            return float(text.replace("infinity", "inf"))
    return None


def _same(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


def _magnitude(npu: Sequence[float | None], bench: Sequence[float | None]) -> float:
    """The largest finite |max|, |min| or |mean| on either side: the scale of a tensor's values."""
    return max((abs(v) for v in (*npu[:3], *bench[:3]) if v is not None and math.isfinite(v)), default=0.0)


def stats_error(npu: Sequence[float | None], bench: Sequence[float | None]) -> float | None:
    """Relative error from (max, min, mean, norm) on both sides: 0 when all four are identical (NaN equal to
    NaN), infinite when a statistic is non-finite on one side only or differs in sign of infinity, else the
    largest change of max/min/mean against the tensor's finite magnitude and of the norm against the norm.
    None when neither side has statistics."""
    if all(v is None for v in npu) and all(v is None for v in bench):
        return None
    err = 0.0
    magnitude = _magnitude(npu, bench)
    for k, (a, b) in enumerate(zip(npu, bench, strict=True)):
        if _same(a, b):
            continue
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            return math.inf
        scale = abs(b) if k == 3 else magnitude
        err = max(err, abs(a - b) / max(scale, MIN_FLOOR))
    return err


def row_norms(rows: Sequence[CompareRow], header: Sequence[str]) -> list[float | None]:
    """Each row's bench norm where it is finite (None otherwise): how much an output counts when a call's
    output errors are combined (a bias gradient that is ~0 by construction must not speak for the call)."""
    col = header.index("Bench l2norm") if "Bench l2norm" in header else -1
    if col < 0:
        return [None] * len(rows)
    out: list[float | None] = []
    for row in rows:
        v = row.cells[col]
        if type(v) is not float:
            v = _num(v)
        out.append(v if v is not None and v - v == 0.0 else None)  # finite
    return out


def row_floating(rows: Sequence[CompareRow], header: Sequence[str]) -> list[bool]:
    """Whether each row holds a floating tensor (its NPU dtype), for telling computed outputs from integer
    ones (labels, indices, masks agree on any kernel)."""
    if "NPU Dtype" not in header:
        return [True] * len(rows)
    col = header.index("NPU Dtype")
    return [isinstance(d := row.cells[col], str) and ("float" in d or "complex" in d) for row in rows]


def row_errors(rows: Sequence[CompareRow], header: Sequence[str], mode: CompareMode) -> list[float | None]:
    """Each row's relative error (0 = identical, ``inf`` = NaN/Inf positions or md5 differ, None = cannot
    be judged: unmatched, no data file, shapes differ)."""
    pos = {name: i for i, name in enumerate(header)}
    stat_cols = [pos[c] for c in ("NPU max", "NPU min", "NPU mean", "NPU l2norm")] if "NPU max" in pos else []
    bench_cols = (
        [pos[c] for c in ("Bench max", "Bench min", "Bench mean", "Bench l2norm")]
        if "Bench max" in pos
        else []
    )
    out: list[float | None] = []
    i0, i1, i2, i3 = stat_cols if stat_cols else (0, 0, 0, 0)
    j0, j1, j2, j3 = bench_cols if bench_cols else (0, 0, 0, 0)
    unknown = (RowStatus.UNMATCHED, RowStatus.BENCH_ONLY)
    for row in rows:
        if row.status in unknown:
            out.append(None)
            continue
        cells = row.cells
        if mode is CompareMode.MD5:
            result = cells[pos["Result"]]
            out.append(0.0 if result == "pass" else math.inf if result == "Different" else None)
            continue
        if mode is CompareMode.STATISTICS:
            a0, a1, a2, a3 = cells[i0], cells[i1], cells[i2], cells[i3]
            b0, b1, b2, b3 = cells[j0], cells[j1], cells[j2], cells[j3]
            # Fast path (most rows): eight finite floats. A 60,000-row table spends ~10x less here than
            # through the general rule; NaN, inf, None and texts take the general rule below.
            if (type(a0) is float and type(a1) is float and type(a2) is float and type(a3) is float
                    and type(b0) is float and type(b1) is float and type(b2) is float and type(b3) is float
                    and (a0 + a1 + a2 + a3 + b0 + b1 + b2 + b3) * 0.0 == 0.0):  # fmt: skip
                if a0 == b0 and a1 == b1 and a2 == b2 and a3 == b3:
                    out.append(0.0)
                    continue
                scale = max(abs(a0), abs(a1), abs(a2), abs(b0), abs(b1), abs(b2), MIN_FLOOR)
                err = max(abs(a0 - b0), abs(a1 - b1), abs(a2 - b2)) / scale
                out.append(max(err, abs(a3 - b3) / max(abs(b3), MIN_FLOOR)) if a3 != b3 else err)
                continue
        npu_stats = [_num(cells[i]) for i in stat_cols]
        bench_stats = [_num(cells[i]) for i in bench_cols]
        from_stats = stats_error(npu_stats, bench_stats)
        if mode is CompareMode.STATISTICS:
            out.append(from_stats)
            continue
        out.append(_tensor_error(cells, pos, npu_stats, bench_stats, from_stats))
    return out


def _tensor_error(cells: Sequence[Cell], pos: Mapping[str, int], npu_stats: Sequence[float | None],
                  bench_stats: Sequence[float | None], from_stats: float | None) -> float | None:  # fmt: skip
    """Tensor mode: ``EucDist / max(norms)`` where the fused pass gave a distance (identical NaN/Inf
    positions count as equal there), MaxAbsErr against the magnitude for a 0-d tensor, the statistics for
    a value without a data file."""
    message = str(cells[pos["Err_message"]] or "")
    if "position of inf or nan" in message:
        return math.inf
    if cells[pos["Cosine"]] == "shape unmatched":
        return None
    dist = _num(cells[pos["EucDist"]])
    if dist is not None and math.isfinite(dist):
        if dist == 0.0:
            return 0.0
        norms = [v for v in (npu_stats[3], bench_stats[3]) if v is not None]
        if norms and all(math.isfinite(v) for v in norms) and max(norms) > 0.0:
            return dist / max(norms)
        # Identical NaN/Inf positions (the distance leaves them out) make the norm non-finite: judge the
        # finite values by the largest difference against their magnitude instead.
        max_abs = _num(cells[pos["MaxAbsErr"]])
        magnitude = _magnitude(npu_stats, bench_stats)
        if max_abs is not None and math.isfinite(max_abs) and magnitude > 0.0:
            return max_abs / magnitude
        return from_stats if from_stats is not None else math.inf
    max_abs = _num(cells[pos["MaxAbsErr"]])
    if max_abs is not None and math.isfinite(max_abs):
        if max_abs == 0.0:
            return 0.0
        scale = _magnitude(npu_stats, bench_stats)
        return max_abs / scale if scale > 0.0 else math.inf
    if "not found or read failed" in message or "does not have data file" in message:
        return None if from_stats != 0.0 else 0.0
    return from_stats


# ------------------------------------------------------------------------------------------------------
# calls


@dataclass(slots=True)
class CallEvidence:
    """One API or module call: where its rows are, its input and output error, and its judgement."""

    api: str
    order: int  # position in execution order (0 = the first call)
    first_row: int  # index of the call's first row in the table
    worst_row: int  # its output row with the largest error (the row the advisor points at)
    input_err: float | None  # None: an input row could not be judged
    output_err: float | None
    direction: str | None = None
    collectives_before: int = 0  # collective calls that ran before this one (multi-rank ordering)
    recorded_input_err: float | None = None  # input_err before a backward's saved tensors count
    computes: bool = False  # a non-zero floating output with a norm none of its inputs has (no view, copy)
    expected: float = 0.0  # what its inputs and the noise explain
    gain: float = 1.0
    score: float = -math.inf  # log10(output_err / expected); SUSPECT_SCORE and up stand out

    @property
    def is_suspect(self) -> bool:
        return self.score >= SUSPECT_SCORE

    def evidence(self) -> str:
        """The numbers behind the judgement, in words."""
        if self.input_err is None or self.output_err is None:
            return "not judged"
        inputs = "inputs identical" if self.input_err == 0.0 else f"inputs agree to {_fmt(self.input_err)}"
        if math.isinf(self.output_err):
            return f"{inputs}; outputs differ in NaN/Inf positions (or checksum)"
        times = 10.0**self.score if math.isfinite(self.score) else math.inf
        return (f"{inputs}; output relative error {_fmt(self.output_err)}, "
                f"{_fmt_times(times)} the background {_fmt(self.expected)}")  # fmt: skip


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.1e}"


def _fmt_times(x: float) -> str:
    if math.isinf(x) or x >= 1e6:
        return ">1e6x"
    return f"{x:.0f}x"


@dataclass(slots=True)
class Localization:
    """The calls in execution order, the floor learned from the run pair, and the ranked suspects."""

    mode: CompareMode
    calls: list[CallEvidence]
    floor: float
    errors: list[float | None] = field(default_factory=list)  # per table row (see ``row_errors``)
    suspects: list[CallEvidence] = field(default_factory=list)  # ranked: highest score first
    first_divergence: CallEvidence | None = None

    def row_scores(self, n_rows: int) -> list[float | None]:
        """The score of each table row's call (None where the call was not judged or is identical), for
        sorting rows by score."""
        scores: list[float | None] = [None] * n_rows
        bounds = [c.first_row for c in self.calls] + [n_rows]
        for call, stop in zip(self.calls, bounds[1:], strict=True):
            if math.isfinite(call.score) or call.score > 0:
                value = round(call.score, 3)
                for i in range(call.first_row, stop):
                    scores[i] = value
        return scores


def _group_calls(rows: Sequence[CompareRow], states: Sequence[str], errors: Sequence[float | None],
                 norms: Sequence[float | None], floating: Sequence[bool]) -> list[CallEvidence]:  # fmt: skip
    """Consecutive rows of one entry make one call; bench-only rows (appended after the NPU rows) are no
    call of the NPU run.

    Inputs: the largest error of any input (one damaged input is enough). Outputs: the normwise error of
    all outputs together (``sqrt(sum (err_k * norm_k)^2 / sum norm_k^2)``), so that an output that is
    nearly zero by construction (the bias gradient of a conv followed by batch norm) weighs by its size;
    outputs without a finite norm count by their own error.
    """
    calls: list[CallEvidence] = []
    collectives = 0
    i, n = 0, len(rows)
    while i < n:
        api = rows[i].api
        start = i
        while i < n and rows[i].api == api:
            i += 1
        if rows[start].status is RowStatus.BENCH_ONLY:
            continue
        in_err: float | None = 0.0
        loose: float | None = None  # the largest output error among outputs without a norm
        num = den = 0.0
        worst, worst_err = -1, -1.0
        in_norms: set[float | None] = set()
        out_norms: set[float | None] = set()
        for j in range(start, i):
            err = errors[j]
            if states[j] == STATE_OUTPUT:
                if floating[j]:
                    out_norms.add(norms[j])
                if err is None:
                    continue
                if err > worst_err:
                    worst, worst_err = j, err
                w = norms[j]
                if w is not None and w > 0.0 and math.isfinite(err):
                    num += (err * w) ** 2
                    den += w * w
                else:
                    loose = err if loose is None else max(loose, err)
            elif states[j] in _JUDGED_INPUTS:
                in_norms.add(norms[j])
                if err is None:
                    if rows[j].status in _UNKNOWN_STATUS:
                        in_err = None
                    continue
                if in_err is not None:
                    in_err = max(in_err, err)
        out_err: float | None = None
        if den > 0.0:
            out_err = math.sqrt(num / den)
        if loose is not None:
            out_err = loose if out_err is None else max(out_err, loose)
        calls.append(
            CallEvidence(
                api=api,
                order=len(calls),
                first_row=start,
                worst_row=worst,
                input_err=in_err,
                output_err=out_err,
                direction=direction_of(api),
                collectives_before=collectives,
                recorded_input_err=in_err,
                computes=bool(in_norms and out_norms - in_norms - {None, 0.0}),
            )
        )
        if api.startswith(_COLLECTIVE_PREFIX):
            collectives += 1
    return calls


def _quantile(values: list[float], q: float, own: float | None = None) -> float:
    """The ``q`` quantile of ``values`` (sorted), leaving out one sample equal to ``own`` when given: a call
    must never set the yardstick it is judged by. NaN when nothing is left."""
    n = len(values) - (1 if own is not None else 0)
    if n <= 0:
        return math.nan
    k = min(n - 1, max(0, math.ceil(q * n) - 1))
    if own is not None and bisect.bisect_left(values, own) <= k:
        k += 1  # the k-th of the others sits one further on in the full list
    return values[k]


def _module_path(api: str) -> str | None:
    """``Module.ff.1.GELU.forward.0`` → ``ff.1``; None for an API entry."""
    tokens = api.split(".")
    return ".".join(tokens[1:-3]) if api.startswith(_MODULE_PREFIX) and len(tokens) >= 4 else None


def _samplers(calls: list[CallEvidence]) -> set[str]:
    """The calls whose errors may be noise samples: API calls, or, in a dump of modules alone, the leaf
    modules. A module repeats the calls inside it (at mix level its APIs, at L0 its child modules), and a
    module wrapping the fault would be the fault's own background."""
    paths = {c.api: p for c in calls if (p := _module_path(c.api)) is not None}
    if len(paths) < len(calls):
        return {c.api for c in calls if c.api not in paths}
    parents: set[str] = set()
    for p in set(paths.values()):
        parts = p.split(".")
        parents.update(".".join(parts[:k]) for k in range(len(parts)))
    return {api for api, p in paths.items() if p not in parents}


def _learn(calls: list[CallEvidence]) -> tuple[list[float], list[float], dict[str, list[float]]]:
    """The noise samples, the gains, and the gains per API kind (each sorted), from calls with finite errors.

    A noise sample is the non-zero output error of a call whose inputs are identical (``_samplers``): what a
    call adds on its own in this run pair; a backward's inputs include what its forward saved. Two devices'
    kernels give a few (every call fed by the data or the weights alone); an exact pair gives none but the
    fault itself. (Calls whose outputs agree exactly are no sample: gathers, views, integer and constant ops
    agree on any kernel, noise or not.)
    Two independent faults at calls with identical inputs would each be the other's background: the
    limit of learning the floor from the pair itself. A gain is
    ``output_err / input_err`` of a call whose inputs differ: how much calls of a kind amplify what reaches
    them.
    """
    clean: list[float] = []
    gains: list[float] = []
    per_kind: dict[str, list[float]] = {}
    samplers = _samplers(calls)
    for c in calls:
        i, o = c.input_err, c.output_err
        if o is None or not math.isfinite(o) or o == 0.0:
            continue
        if i == 0.0 and c.api in samplers:
            clean.append(o)
        if i is None or not math.isfinite(i) or i == 0.0:
            continue
        if i > 0.0:
            g = o / i
            gains.append(g)
            per_kind.setdefault(api_kind(c.api), []).append(g)
    for kind_gains in per_kind.values():
        kind_gains.sort()
    return sorted(clean), sorted(gains), per_kind


def _floor(clean: list[float], own: float | None) -> float:
    """The median noise sample but the call's own; MIN_FLOOR when no other call with identical inputs has
    outputs that differ."""
    value = _quantile(clean, FLOOR_QUANTILE, own)
    return MIN_FLOOR if math.isnan(value) else max(MIN_FLOOR, value)


def _gain(kind_gains: list[float], gains: list[float], own: float | None) -> float:
    """The gain a call is allowed: the median of its kind's other calls when there are MIN_KIND_CALLS of
    them, else the upper gain (GAIN_QUANTILE) of all other calls; never below 1."""
    if len(kind_gains) - (1 if own is not None else 0) >= MIN_KIND_CALLS:
        value = _quantile(kind_gains, 0.5, own)
    else:
        value = _quantile(gains, GAIN_QUANTILE, own)
    return 1.0 if math.isnan(value) else max(1.0, value)


def localize(rows: Sequence[CompareRow], states: Sequence[str], header: Sequence[str], mode: CompareMode,
             *, errors: Sequence[float | None] | None = None) -> Localization:  # fmt: skip
    """Judge every call of a finished table (rows in execution order; see the module docstring)."""
    errs = list(errors) if errors is not None else row_errors(rows, header, mode)
    calls = _group_calls(rows, states, errs, row_norms(rows, header), row_floating(rows, header))
    _read_saved_tensors(calls)
    clean, gains, per_kind = _learn(calls) if mode is not CompareMode.MD5 else ([], [], {})
    samplers = _samplers(calls)
    exact = _exact_pair(calls, samplers)
    floor = _floor(clean, None)
    for c in calls:
        i, o = c.input_err, c.output_err
        if i is None or o is None or o == 0.0 or math.isinf(i):
            continue
        if math.isinf(o):
            c.expected = floor
            if i == 0.0 or mode is not CompareMode.MD5:
                c.score = INFINITE_SCORE
            continue
        own = o / i if i > 0.0 else None
        c.gain = _gain(per_kind.get(api_kind(c.api), []), gains, own)
        own_sample = i == 0.0 and c.api in samplers
        call_floor = _floor(clean, o if own_sample else None)
        if own_sample and len(clean) == 1 and not exact:
            call_floor = _downstream_floor(calls, c)
        # Independent errors add in quadrature: what the inputs carry through and what the call adds.
        c.expected = math.hypot(c.gain * i, call_floor)
        c.score = math.log10(o / c.expected)
    suspects = [c for c in calls if c.is_suspect]
    first = _first_divergence(calls, suspects)
    if mode is CompareMode.MD5:
        suspects.sort(key=lambda c: c.order)
    else:
        suspects.sort(key=lambda c: (-c.score, c.order))
    return Localization(
        mode=mode, calls=calls, floor=floor, errors=errs, suspects=suspects, first_divergence=first
    )


def _exact_pair(calls: list[CallEvidence], samplers: set[str]) -> bool:
    """Whether the pair shows it computes exactly where its data agree: a call computing a floating output
    from identical recorded inputs gives an identical one (a backward counts too, whatever its forward saved:
    an identical result is exact whatever else it read)."""
    return any(c.recorded_input_err == 0.0 and c.output_err == 0.0 and c.computes and c.api in samplers
               for c in calls)  # fmt: skip


def _downstream_floor(calls: list[CallEvidence], call: CallEvidence) -> float:
    """The floor of the one call whose inputs are identical and outputs differ, in a pair with no exact
    call to show there is no background: the DOWNSTREAM_QUANTILE of the output errors of the calls after it.

    Its own error is no yardstick for itself, and nothing else has identical inputs. But background noise
    is fresh at every call, so nearly every later call's output carries at least the background; the error
    of a fault at this call reaches later calls only through their gains, and the loss, reductions and the
    optimizer's updates damp it far below its size. (On the suite's runs the 10% quantile is 0.9 to 1.2x
    the first call's error under noise alone, 0.02 to 0.2x under a fault at the first call.)
    """
    later = sorted(o for c in calls[call.order + 1 :]
                   if (o := c.output_err) is not None and 0.0 < o < math.inf)  # fmt: skip
    if len(later) < MIN_DOWNSTREAM_CALLS:
        return MIN_FLOOR
    return max(MIN_FLOOR, later[min(len(later) - 1, int(DOWNSTREAM_QUANTILE * len(later)))])


def _read_saved_tensors(calls: list[CallEvidence]) -> None:
    """A backward call reads what its forward saved (inputs, and outputs for softmax, tanh, ...) as well as
    the gradient it receives: its input error is the largest of the three. A selecting op's backward
    (``_SELECTING_OPS``) whose forward inputs already differ is not judged."""
    forwards = {c.api: c for c in calls if c.direction == "forward"}
    for c in calls:
        if c.direction != "backward" or c.input_err is None:
            continue
        fwd = forwards.get(forward_of(c.api))
        if fwd is None:
            continue
        if fwd.input_err is None or fwd.output_err is None:
            c.input_err = None
            continue
        if fwd.input_err > 0.0 and _selecting(c.api):
            c.input_err = None
            continue
        c.input_err = max(c.input_err, fwd.input_err, fwd.output_err)


def _first_divergence(calls: list[CallEvidence], suspects: list[CallEvidence]) -> CallEvidence | None:
    """The earliest suspect whose error reaches a later call's inputs; the earliest suspect if none does
    (the last call of a run has no later call)."""
    for s in suspects:
        assert s.output_err is not None
        need = CARRY_SHARE * s.output_err
        for later in calls[s.order + 1 :]:
            if later.input_err is not None and later.input_err >= need and later.input_err > 0.0:
                return s
    return suspects[0] if suspects else None


# ------------------------------------------------------------------------------------------------------
# stacks and ranks

_TOOL_PATH = re.compile(
    r"(site-packages|dist-packages|/torch/|/parity/|/msprobe/|/lib/python3\.\d+/|<frozen |<string>)"
)
_FRAME_FILE = re.compile(r"File (.+?), line \d+")


def user_frame(frames: Sequence[str] | None) -> str | None:
    """The innermost frame in the user's code: outside torch, Parity, msprobe, site-packages and the
    standard library (stack.json lists frames innermost first); None when every frame is tooling."""
    if not frames:
        return None
    for frame in frames:
        match = _FRAME_FILE.search(frame)
        path = match.group(1) if match else frame
        if not _TOOL_PATH.search(path.replace("\\", "/")):
            return frame
    return None


@dataclass(frozen=True, slots=True)
class RankDivergence:
    """Which rank diverged first, judged around the collectives every rank runs in the same order."""

    rank: int | None
    api: str
    collectives_before: int
    at_collective: bool  # the first divergence is a collective's output (data received from elsewhere)

    def as_dict(self) -> dict[str, object]:
        return {"rank": self.rank, "api": self.api, "collectives_before": self.collectives_before,
                "at_collective": self.at_collective}  # fmt: skip


def first_diverged_rank(firsts: Mapping[int | None, Suspect | None]) -> RankDivergence | None:
    """The rank whose first divergence came first, from each rank's first divergence.

    Ranks meet at every collective, so a rank's own clock is the number of collectives it has run: fewer
    collectives before its first divergence means earlier. Within one stretch between two collectives, a
    divergence inside a rank's own computation comes before one that arrived through the collective ending
    the stretch (that rank received it from another); then the lower rank number.
    """
    best: tuple[tuple[int, int, int], RankDivergence] | None = None
    for rank, first in firsts.items():
        if first is None:
            continue
        at_collective = first.api.startswith(_COLLECTIVE_PREFIX)
        key = (first.collectives_before, 1 if at_collective else 0, -1 if rank is None else rank)
        if best is None or key < best[0]:
            best = (key, RankDivergence(rank, first.api, first.collectives_before, at_collective))
    return best[1] if best else None
