"""What each side asked a call to do: its precision and its arguments (precision choices are causes).

A port's most common bug is a choice, not a broken kernel: a cast to bfloat16 where the model upcasts to
float32 (RMSNorm's variance), a softmax in float16, GELU with ``approximate="tanh"``, another ``eps``. Judged
by its own side's dtype, such a call is "within bfloat16's rounding"; judged by its own arguments, a tanh
GELU "replays right". So every paired call's two requests are compared here, from the rows' facts:

* **precision**: the coarsest floating format each side's call wrote (its outputs' unit roundoff) against
  the coarsest it read. A call whose target writes a coarser format than the bench, from inputs that were
  not already that coarse, *chose* the lower precision (a cast, a ``dtype=``, an autocast region): it is
  judged by the bench's precision, so the rounding it added is found;
* **arguments**: every non-tensor argument (``approximate``, ``eps``, ``dim``, ``dtype``, ...) with another
  value on the target, or that only the target passed. Such rows are no input error of the call (a choice is
  not a propagated difference) and never leave it unjudged; they name what it asked for.

When (nearly) every call of an API class makes the same implicit choice (no cast asked for: bfloat16
autocast, a global low-precision mode), that is one systematic finding for the pair, as TF32 is for the
matmul class: those calls keep their own precision as their yardstick, and only a call beyond it is named.
An explicit cast (``to``, ``type``, ``half``, ``bfloat16``, a ``dtype`` argument) is a choice made in the
code, and is named each time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from parity.shared.compare.call_errors import JUDGED_INPUTS, CallColumns
from parity.shared.compare.expected_error import api_class, op_of
from parity.shared.compare.facts import RowFacts
from parity.shared.compare.result import SystematicFinding
from parity.shared.dump.columns import STATE_OUTPUT
from parity.shared.dump.naming import direction_of

__all__ = [
    "CAST_OPS",
    "PRECISION_MIN_CALLS",
    "PRECISION_SHARE",
    "Choices",
    "argument_difference",
    "argument_rows",
    "call_choices",
    "rewired_rows",
]

#: Ops that exist to change a tensor's dtype: a cast in the code.
CAST_OPS = frozenset({"to", "type", "type_as", "half", "bfloat16", "float", "double", "_to_copy", "to_dtype",
                      "_autocast_to_reduced_precision", "_autocast_to_full_precision"})  # fmt: skip
#: A systematic precision choice needs at least this many calls of the class making it ...
PRECISION_MIN_CALLS = 2
#: ... and this share of the class's calls that write floating data.
PRECISION_SHARE = 0.8
#: Two numbers closer than this (relative) are one value computed twice (a Python scalar taken from a
#: tensor, ``x.size(-1) ** -0.5``), not two requests: such an argument is data, its difference an input error.
DATA_LIKE = 1e-3
_DTYPE_TYPE = "torch.dtype"
_MISSING = object()


def argument_rows(facts: RowFacts, states: Sequence[str]) -> np.ndarray:
    """The rows that are a call's non-tensor input arguments, a request rather than data: every one but a
    number that both sides passed, within ``DATA_LIKE`` of each other."""
    npu, bench = facts.npu, facts.bench
    rows = np.zeros(len(facts), dtype=bool)
    present = bench.present_array()
    for j, value in npu.values.items():
        if states[j] not in JUDGED_INPUTS or npu.tensor[j] or (present[j] and bench.tensor[j]):
            continue
        other = bench.values.get(j, _MISSING) if present[j] else _MISSING
        rows[j] = not _data_like(value, other)
    return rows


def rewired_rows(facts: RowFacts, states: Sequence[str], errors: np.ndarray) -> dict[int, tuple[int, int]]:
    """The input rows where the target reads another tensor than the bench: row -> (the output row the
    target's value comes from, the one the bench's comes from). Each side's tensor is traced to the latest
    earlier output holding exactly its value (its statistics and dimensions); the target's producer agrees
    with the bench (error 0) and the two producers are different rows: the inputs differ because the
    call was wired to another tensor (``rotate_half`` negating the other half), not because a value drifted
    on the way. Constant and empty tensors say nothing of where they come from and are left out."""
    n = len(facts)
    out: dict[int, tuple[int, int]] = {}
    if n == 0:
        return out
    sides = (facts.npu, facts.bench)
    stats = [side.stats_array() for side in sides]
    informative = [side.tensor_array() & side.numeric_array().all(axis=1) & side.present_array()
                   & (st[:, 0] != st[:, 1]) & (st[:, 3] != 0.0) & np.isfinite(st).all(axis=1)
                   for side, st in zip(sides, stats, strict=True)]  # fmt: skip
    is_out = np.fromiter(map(STATE_OUTPUT.__eq__, states), dtype=bool, count=n)
    is_in = np.fromiter(map(JUDGED_INPUTS.__contains__, states), dtype=bool, count=n)
    with np.errstate(invalid="ignore"):
        differs = is_in & informative[0] & informative[1] & (errors > 0.0) & np.isfinite(errors)
    if not differs.any():
        return out
    latest: list[dict[tuple[Any, ...], int]] = [{}, {}]
    rows_t, rows_b = stats[0].tolist(), stats[1].tolist()
    dims_t, dims_b = sides[0].dims, sides[1].dims
    for r in range(n):
        if differs[r]:
            pt = latest[0].get((dims_t[r], *rows_t[r]))
            pb = latest[1].get((dims_b[r], *rows_b[r]))
            if pt is not None and pb is not None and pt != pb and errors[pt] == 0.0:
                out[r] = (pt, pb)
        if is_out[r]:
            if informative[0][r]:
                latest[0][(dims_t[r], *rows_t[r])] = r
            if informative[1][r]:
                latest[1][(dims_b[r], *rows_b[r])] = r
    return out


def _data_like(a: Any, b: Any) -> bool:
    numbers = (int, float)
    if not (isinstance(a, numbers) and isinstance(b, numbers)) or isinstance(a, bool) or isinstance(b, bool):
        return False
    if a == b or not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= DATA_LIKE * max(abs(a), abs(b))


@dataclass(slots=True)
class Choices:
    """Each call's two requests, one array element per call (see the module docstring)."""

    #: the unit roundoff of the coarsest format each side's call wrote, and read (0: no floating data)
    target_out: np.ndarray
    bench_out: np.ndarray
    target_in: np.ndarray
    #: the largest unit roundoff of any of the call's rows on the bench side (its own precision)
    bench_unit: np.ndarray
    #: the target chose a coarser format than the bench (see the module docstring)
    lower: np.ndarray
    #: ... by a cast in the code (a cast op, or a ``dtype`` argument)
    explicit: np.ndarray
    #: ... as one systematic choice of its class (``findings``): judged by its own precision then
    systematic: np.ndarray
    #: the dtypes of the coarsest output on each side, for the words
    target_dtype: list[str | None]
    bench_dtype: list[str | None]
    #: call -> its arguments that differ, in words (``approximate: 'tanh' vs 'none'``)
    arguments: dict[int, list[str]] = field(default_factory=dict)
    #: call -> the arguments as ``{place: (target value, bench value)}`` (the replay's seam)
    argument_values: dict[int, dict[str, tuple[Any, Any]]] = field(default_factory=dict)
    findings: list[SystematicFinding] = field(default_factory=list)

    def asked(self) -> np.ndarray:
        """The calls whose target asked for other arguments than the bench."""
        out = np.zeros(self.lower.size, dtype=bool)
        out[list(self.arguments)] = True
        return out

    def chosen(self) -> np.ndarray:
        """The calls judged by the bench's precision: a lower precision the class does not share."""
        return self.lower & ~self.systematic

    def text(self, k: int) -> str | None:
        """Call ``k``'s choices in words, or None when it asked for what the bench asked."""
        parts = []
        if self.lower[k] and not self.systematic[k]:
            parts.append(f"the target rounds to {_name(self.target_dtype[k])} where the bench stays in "
                         f"{_name(self.bench_dtype[k])}")  # fmt: skip
        parts.extend(self.arguments.get(k, ()))
        return "; ".join(parts) if parts else None


def _name(dtype: str | None) -> str:
    return dtype.rsplit(".", 1)[-1] if dtype else "another format"


def argument_difference(name: str, api: str, target: Any = _MISSING, bench: Any = _MISSING) -> str | None:
    """What an argument row of call ``api`` asks for on each side, in words (``approximate: 'tanh' vs
    'none'``; a side that did not pass it: ``not passed``), or None where both sides asked for the same."""
    if target is not _MISSING and bench is not _MISSING and _same(target, bench):
        return None
    return f"{_place_of(name, api).removeprefix('input.')}: {_value_text(target)} vs {_value_text(bench)}"


def _value_text(value: Any) -> str:
    if value is _MISSING:
        return "not passed"
    return repr(value) if isinstance(value, str) and not value.startswith("torch.") else str(value)


def _same(a: Any, b: Any) -> bool:
    """Two recorded argument values are the same request (NaN equal to NaN; ``1`` and ``1.0`` equal,
    ``True`` and ``1`` not)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and bool(a == b)


def _reduce_max(values: np.ndarray, mask: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.maximum.reduceat(np.where(mask, values, 0.0), starts) if starts.size else np.zeros(0)


def call_choices(facts: RowFacts, states: Sequence[str], cols: CallColumns, arguments: np.ndarray,
                 rewired: dict[int, tuple[int, int]] | None = None) -> Choices:  # fmt: skip
    """Each call's precision and argument choices (``arguments``: the rows that are requests,
    ``argument_rows``; ``rewired``: the inputs it reads from another tensor, ``rewired_rows``), and the
    classes that make a precision choice systematically."""
    n = len(cols.apis)
    starts = cols.first_row
    t_units, b_units = facts.npu.units(), facts.bench.units()
    b_present = facts.bench.present_array()
    tensor = facts.npu.tensor_array() | facts.bench.tensor_array()
    is_out = np.fromiter(map(STATE_OUTPUT.__eq__, states), dtype=bool, count=len(states)) & tensor
    is_in = np.fromiter(map(JUDGED_INPUTS.__contains__, states), dtype=bool, count=len(states)) & tensor
    target_out = _reduce_max(t_units, is_out, starts)
    bench_out = _reduce_max(b_units, is_out & b_present, starts)
    target_in = _reduce_max(t_units, is_in, starts)
    bench_unit = _reduce_max(b_units, b_present, starts)
    lower = (bench_out > 0.0) & (target_out > bench_out) & (target_out > target_in)
    target_dtype, bench_dtype = _coarsest_dtypes(facts, is_out, cols, lower)
    words, values, dtype_asked = _arguments(facts, cols, arguments)
    for r, (pt, pb) in sorted((rewired or {}).items()):
        k = int(np.searchsorted(cols.first_row, r, side="right")) - 1
        if 0 <= k < n and r < int(cols.stop_row[k]):
            words.setdefault(k, []).append(
                f"{_place(facts, r, cols.apis[k])} is {facts.names[pt]} where the bench reads "
                f"{facts.names[pb]}")  # fmt: skip
    explicit = np.fromiter((op_of(api) in CAST_OPS for api in cols.apis), dtype=bool, count=n) | dtype_asked
    choices = Choices(target_out, bench_out, target_in, bench_unit, lower, explicit & lower,
                      np.zeros(n, dtype=bool), target_dtype, bench_dtype, words, values)  # fmt: skip
    _systematic_choices(choices, cols, target_out)
    return choices


def _coarsest_dtypes(facts: RowFacts, is_out: np.ndarray, cols: CallColumns,
                     lower: np.ndarray) -> tuple[list[str | None], list[str | None]]:  # fmt: skip
    """The dtype of each lower-precision call's coarsest output on each side (None for the others)."""
    n = len(cols.apis)
    target: list[str | None] = [None] * n
    bench: list[str | None] = [None] * n
    t_units, b_units = facts.npu.units(), facts.bench.units()
    for k in np.flatnonzero(lower).tolist():
        rows = [j for j in range(int(cols.first_row[k]), int(cols.stop_row[k])) if is_out[j]]
        if rows:
            target[k] = facts.npu.dtype[max(rows, key=lambda j: t_units[j])]
            bench[k] = facts.bench.dtype[max(rows, key=lambda j: b_units[j])]
    return target, bench


Arguments = tuple[dict[int, list[str]], dict[int, dict[str, tuple[Any, Any]]], np.ndarray]


def _arguments(facts: RowFacts, cols: CallColumns, arguments: np.ndarray) -> Arguments:
    """Each call's argument rows that differ between the sides (or that the target alone passed), and which
    calls' target passed a ``torch.dtype``."""
    n = len(cols.apis)
    words: dict[int, list[str]] = {}
    values: dict[int, dict[str, tuple[Any, Any]]] = {}
    dtype_asked = np.zeros(n, dtype=bool)
    npu, bench = facts.npu, facts.bench
    rows = np.flatnonzero(arguments).tolist()
    if not rows:
        return words, values, dtype_asked
    owners = np.searchsorted(cols.first_row, rows, side="right") - 1
    present = bench.present_array()
    for j, k in zip(rows, owners.tolist(), strict=True):
        if k < 0 or j >= int(cols.stop_row[k]):
            continue
        api = cols.apis[k]
        if npu.arg_types.get(j) == _DTYPE_TYPE:
            dtype_asked[k] = True
        target = npu.values[j]
        other = bench.values.get(j, _MISSING) if present[j] else _MISSING
        text = argument_difference(facts.names[j], api, target, other)
        if text is None:
            continue
        words.setdefault(k, []).append(text)
        values.setdefault(k, {})[_place(facts, j, api)] = (target, None if other is _MISSING else other)
    return words, values, dtype_asked


def _place(facts: RowFacts, r: int, api: str) -> str:
    return _place_of(facts.names[r], api)


def _place_of(name: str, api: str) -> str:
    """A row's place in its call (``input.approximate``), from its name."""
    return name[len(api) + 1 :] if name.startswith(api + ".") else name


def _systematic_choices(choices: Choices, cols: CallColumns, target_out: np.ndarray) -> None:
    """The API classes whose calls (nearly) all make one implicit lower-precision choice, in one direction
    (autocast lowers a forward; its backward hands the parameters' gradients back in their own format):
    one finding each, and those calls marked ``systematic`` (in place)."""
    groups = [(api_class(op_of(api)), direction_of(api)) for api in cols.apis]
    implicit = choices.lower & ~choices.explicit
    floating = target_out > 0.0
    for group in dict.fromkeys(g for g, hit in zip(groups, implicit.tolist(), strict=True) if hit):
        members = np.fromiter((g == group for g in groups), dtype=bool, count=len(groups)) & floating
        by_format: dict[tuple[str | None, str | None], list[int]] = {}
        for k in np.flatnonzero(members & implicit).tolist():
            by_format.setdefault((choices.target_dtype[k], choices.bench_dtype[k]), []).append(k)
        for (low, high), calls in by_format.items():
            unit = float(np.max(target_out[calls]))
            # autocast lowers the calls that read finer inputs; the rest read its lower format already:
            # the class computes in ``low`` when (nearly) all of its calls write it where the bench does not
            writing = int((members & (target_out == unit) & (choices.bench_out < unit)).sum())
            could = int(members.sum())
            if writing < PRECISION_MIN_CALLS or writing < PRECISION_SHARE * could:
                continue
            choices.systematic[calls] = True
            cls, first = group[0], cols.apis[calls[0]]
            text = (f"the target computes under {_name(low)} autocast (or a {_name(low)} mode): every "
                    f"{cls}-class call writes {_name(low)} where the bench writes {_name(high)} "
                    f"({writing} of {could} calls, from {first}); no single call stands out beyond "
                    f"{_name(low)}'s rounding")  # fmt: skip
            choices.findings.append(SystematicFinding(cls, unit, could, writing, first, text))
