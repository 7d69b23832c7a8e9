"""Pair two call sequences by aligning them, not by their counters (issue 24).

Rows are named after their call, and a call's name carries a per-API counter (``Tensor.transpose.3``): one
extra or missing call on one side shifts every later counter of that API, and a join on names pairs calls
with the wrong partners without a word. Here the calls of the two runs, in execution (dump) order, are
aligned instead:

* each call gets a key: its API without the counter, the shapes and dtype families of its tensors
  (``Tensor.transpose.forward`` taking ``[4, 8, 2, 16]`` is not the one taking ``[4, 2, 8, 16]``) and, where
  both sides have a construct.json with modules (mix), its module scope (``module_scopes``): a call inside
  module M pairs only with a call inside M's partner, so no window pairs across a module boundary;
* runs of equal keys pair in order; where the keys part, the nearest point from which RESYNC keys agree
  again closes the difference (looked up in an index of the bench's key runs, so the walk stays linear in
  the calls: near first, then far, then on the API alone; two calls of one API whose shapes differ all
  along pair where they stand); the calls in between are aligned by dynamic programming over a score from
  the API's op, its full name, its shapes and dtypes, its call site (stack.json) and its output values;
* calls left without a partner on either side, between two paired calls, form one ``Gap``: the target's
  fused ``scaled_dot_product_attention`` against the bench's ``transpose, matmul, div, masked_fill,
  softmax, matmul``. A gap is judged as one call: its boundary inputs and outputs (the tensors crossing
  it: inputs not produced inside it, outputs not consumed inside it) are paired with the bench's, first
  by provenance (the target tensor equals, value for value, a paired tensor outside the gap, whose bench
  partner the bench's gap reads or writes), else by shape and values. Its other rows are internal. A gap
  never spans two module scopes: one that would is cut where the scope changes. A gap of
  more than MAX_GAP_CALLS calls on a side is where the traces parted: its rows stay unmatched.

The fast path: two traces whose calls have the same names pair by name (``pairing.pair_exact``) as
before, with no cost beyond comparing the two name lists.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from parity.shared.compare.foreach import CallList, pair_foreach
from parity.shared.compare.mapping import BASIS_MAPPED, RowMapping
from parity.shared.compare.module_scopes import CallModules, GapRange, Modules, module_scopes, split_by_scope
from parity.shared.compare.pairing import FLOAT_FAMILY, Pairing, fuzzy_entry_name, pair_exact, pair_fuzzy
from parity.shared.compare.rows import SideRows
from parity.shared.dump.columns import STATE_INPUT, STATE_OUTPUT, STATE_PARAMETERS
from parity.shared.dump.naming import FORWARD, parse_entry

__all__ = [
    "BASIS_ALIGNED",
    "BASIS_FOREACH",
    "BASIS_GAP",
    "BASIS_MAPPED",
    "BASIS_NAME",
    "STATE_GAP",
    "Gap",
    "Modules",
    "align_rows",
    "pair_calls",
    "gap_label",
]

BASIS_NAME = "name"  # paired with the bench row of the same name
BASIS_ALIGNED = "aligned"  # paired by the alignment with a bench row of another name
BASIS_FOREACH = "foreach"  # an element of a foreach call, paired with the per-parameter call it stands for
BASIS_GAP = "gap"  # a row of a gap: a boundary tensor paired across it, or one of its internal rows
#: The state of a gap's internal rows (neither an input nor an output of the gap): not judged.
STATE_GAP = "gap"
#: Keys that must agree in a row for the two sequences to be back in step after a difference.
RESYNC = 3
#: How far (calls on both sides together) a resync on the fine keys is looked for before two calls of one
#: API with other shapes pair where they stand (the shapes differ all along: another batch size) ...
NEAR_SHIFT = 64
#: ... and how far the fine, then the coarse keys are looked for before nothing is (every call of the
#: target looked at: a trace with nothing in common costs one pass).
MAX_SHIFT = 800
#: The largest window (target calls x bench calls) aligned by dynamic programming; a larger one is a gap.
WINDOW_CELLS = 200_000
#: A gap with more calls than this on a side is not judged as one call (its rows stay unmatched and
#: bench-only, labelled with the gap): no fused op spans so many, and the traces have parted there.
MAX_GAP_CALLS = 200
_INPUTS = frozenset({STATE_INPUT, STATE_PARAMETERS, "kwargs", "input_kwargs"})


@dataclass(frozen=True, slots=True)
class Gap:
    """Calls without a partner between two paired calls: ``target`` and ``bench`` entry names (either may
    be empty); ``api`` the entry it is judged as (the target's first call; None when the target has none)."""

    target: tuple[str, ...]
    bench: tuple[str, ...]

    @property
    def api(self) -> str | None:
        return self.target[0] if self.target else None

    @property
    def label(self) -> str:
        return gap_label(self.target, self.bench)


def _span(names: Sequence[str]) -> str:
    if not names:
        return "(no call)"
    return names[0] if len(names) == 1 else f"{names[0]} ... {names[-1]}"


def gap_label(target: Sequence[str], bench: Sequence[str]) -> str:
    """``target A ~ bench B ... C``: a gap's two sides, by their first and last calls."""
    return f"target {_span(target)} ~ bench {_span(bench)}"


# ------------------------------------------------------------------------------------------------------
# calls and their keys


@dataclass(slots=True)
class _Calls:
    """One side's calls: entry names and row ranges, in execution order."""

    names: list[str]
    starts: list[int]
    stops: list[int]


def _calls(rows: SideRows) -> _Calls:
    apis = rows.apis
    starts = [i for i in range(len(apis)) if i == 0 or apis[i] != apis[i - 1]]
    return _Calls([apis[i] for i in starts], starts, [*starts[1:], len(apis)] if starts else [])


def _family(dtype: str | None) -> str:
    if dtype is None:
        return "-"
    if dtype in FLOAT_FAMILY or "float" in dtype:
        return "f"
    if "int" in dtype:
        return "i"
    return "b" if "bool" in dtype else dtype


def _op(entry: str) -> str:
    """The op of an entry, whatever its prefix: ``Tensor.__matmul__.1.forward`` and ``Torch.matmul.0
    .forward`` are both ``matmul.forward``; a module's is its class."""
    parsed = parse_entry(entry)
    if parsed is None:
        return f"{entry}.forward"
    direction = parsed.direction or FORWARD
    return f"Module.{parsed.op}.{direction}" if parsed.kind != "api" else f"{parsed.op}.{direction}"


def _keys(rows: SideRows, calls: _Calls,
          scopes: Sequence[str | None]) -> tuple[list[tuple[Any, ...]], list[str], list[str]]:  # fmt: skip
    """Each call's fine key (API without counter, tensor shapes and dtype families, module scope), kind
    and op."""
    cols = rows.columns
    fine: list[tuple[Any, ...]] = []
    kinds = [fuzzy_entry_name(name) for name in calls.names]
    canonical: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # one tuple per distinct key: calls repeat
    for kind, start, stop, scope in zip(kinds, calls.starts, calls.stops, scopes, strict=True):
        sig = tuple((cols.states[r][:1], cols.shapes[r], _family(cols.dtypes[r]))
                    for r in range(start, stop) if cols.is_tensor[r])  # fmt: skip
        key = (kind, sig, scope)
        fine.append(canonical.setdefault(key, key))
    return fine, kinds, [_op(name) for name in calls.names]


def _codes(a: Sequence[Any], b: Sequence[Any]) -> tuple[list[int], list[int]]:
    ids: dict[Any, int] = {}
    return ([ids.setdefault(k, len(ids)) for k in a], [ids.setdefault(k, len(ids)) for k in b])


# ------------------------------------------------------------------------------------------------------
# the walk


class _Index:
    """Positions of each run of RESYNC codes on one side, for the nearest resync point."""

    def __init__(self, codes: Sequence[int]) -> None:
        self.codes = codes
        self.at: dict[tuple[int, ...], list[int]] = {}
        for p in range(len(codes) - RESYNC + 1):
            self.at.setdefault(tuple(codes[p : p + RESYNC]), []).append(p)

    def first(self, run: tuple[int, ...], start: int) -> int:
        found = self.at.get(run)
        if not found:
            return -1
        k = bisect.bisect_left(found, start)
        return found[k] if k < len(found) else -1


def _resync(a: Sequence[int], b_index: _Index, i: int, j: int, a_stop: int, b_stop: int,
            horizon: int) -> tuple[int, int]:  # fmt: skip
    """The nearest ``(i2, j2)`` (least ``i2 - i + j2 - j``, at most ``horizon``) from which RESYNC codes
    agree; (-1, -1) if none."""
    best = (-1, -1)
    best_cost = horizon + 1
    for di in range(min(a_stop - i - RESYNC + 1, horizon + 1)):
        if di >= best_cost:
            break
        p = b_index.first(tuple(a[i + di : i + di + RESYNC]), j)
        if p >= 0 and p + RESYNC <= b_stop and di + p - j < best_cost:
            best, best_cost = (i + di, p), di + p - j
    return best


class _Scorer:
    """The score of pairing target call ``x`` with bench call ``y`` inside a window (0: never)."""

    def __init__(self, t: _Side, b: _Side) -> None:
        self.t, self.b = t, b

    def __call__(self, x: int, y: int) -> float:
        t, b = self.t, self.b
        if t.ops[x] != b.ops[y] or t.modules.scopes[x] != b.modules.scopes[y]:
            return 0.0  # another op, or a call in another module: never partners
        score = 1.0
        if t.kinds[x] == b.kinds[y]:
            score += 2.0
        if t.fine[x] == b.fine[y]:
            score += 2.0
        if t.modules.paths[x] is not None and t.modules.paths[x] == b.modules.paths[y]:
            score += 1.0  # the same place in the model (a module only one side has is in no scope)
        if t.sites and b.sites and t.sites.get(t.calls.names[x]) == b.sites.get(b.calls.names[y]) is not None:
            score += 1.0
        vx, vy = t.out_norm(x), b.out_norm(y)
        if vx is not None and vy is not None and abs(vx - vy) <= 1e-2 * max(abs(vx), abs(vy), 1e-12):
            score += 1.0
        return score


def _window(score: _Scorer, xs: range, ys: range) -> list[tuple[int, int]]:
    """The pairs of the best-scoring order-keeping alignment of target calls ``xs`` with bench calls
    ``ys`` (a weighted longest common subsequence); none when the window is too large."""
    p, q = len(xs), len(ys)
    if p == 0 or q == 0 or p * q > WINDOW_CELLS:
        return []
    s = [[score(x, y) for y in ys] for x in xs]
    if not any(any(row) for row in s):
        return []
    table = [[0.0] * (q + 1) for _ in range(p + 1)]
    for u in range(1, p + 1):
        prev, cur, su = table[u - 1], table[u], s[u - 1]
        for v in range(1, q + 1):
            best = prev[v] if prev[v] >= cur[v - 1] else cur[v - 1]
            w = su[v - 1]
            if w and prev[v - 1] + w > best:
                best = prev[v - 1] + w
            cur[v] = best
    out: list[tuple[int, int]] = []
    u, v = p, q
    while u and v:
        w = s[u - 1][v - 1]
        if w and table[u][v] == table[u - 1][v - 1] + w:
            out.append((xs[u - 1], ys[v - 1]))
            u, v = u - 1, v - 1
        elif table[u][v] == table[u - 1][v]:
            u -= 1
        else:
            v -= 1
    out.reverse()
    return out


@dataclass(slots=True)
class _Side:
    rows: SideRows
    calls: _Calls
    fine: list[tuple[Any, ...]]
    kinds: list[str]
    ops: list[str]
    sites: Mapping[str, str] | None
    modules: CallModules

    def out_norm(self, k: int) -> float | None:
        cols = self.rows.columns
        for r in range(self.calls.starts[k], self.calls.stops[k]):
            if cols.states[r] == STATE_OUTPUT and cols.is_tensor[r]:
                norm = cols.stats_of(r)[3]
                return float(norm) if isinstance(norm, float) and math.isfinite(norm) else None
        return None


def _sides(npu: SideRows, bench: SideRows, sites: Sites | None,
           modules: Modules | None) -> tuple[_Side, _Side]:  # fmt: skip
    """Both sides' calls and keys; each call's module scope and path where both sides have modules, else
    none (the whole-sequence alignment)."""
    t_calls, b_calls = _calls(npu), _calls(bench)
    scoped = module_scopes(t_calls.names, b_calls.names, modules)
    if scoped is None:
        scoped = (CallModules([None] * len(t_calls.names), [None] * len(t_calls.names)),
                  CallModules([None] * len(b_calls.names), [None] * len(b_calls.names)))  # fmt: skip
    out = []
    for rows, calls, side_sites, side_modules in zip((npu, bench), (t_calls, b_calls),
                                                     sites or (None, None), scoped, strict=True):  # fmt: skip
        fine, kinds, ops = _keys(rows, calls, side_modules.scopes)
        out.append(_Side(rows, calls, fine, kinds, ops, side_sites, side_modules))
    return out[0], out[1]


def align_calls(t: _Side, b: _Side) -> list[tuple[int, int]]:
    """Paired call indexes ``(target, bench)``, increasing on both sides."""
    a_fine, b_fine = _codes(t.fine, b.fine)
    a_kind, b_kind = _codes(list(zip(t.kinds, t.modules.scopes, strict=True)),
                            list(zip(b.kinds, b.modules.scopes, strict=True)))
    n, m = len(a_fine), len(b_fine)
    head = 0
    while head < min(n, m) and a_fine[head] == b_fine[head]:
        head += 1
    tail = 0
    while tail < min(n, m) - head and a_fine[n - 1 - tail] == b_fine[m - 1 - tail]:
        tail += 1
    pairs = [(k, k) for k in range(head)]
    a_stop, b_stop = n - tail, m - tail
    fine_index, kind_index = _Index(b_fine), _Index(b_kind)
    score = _Scorer(t, b)
    i = j = head
    while i < a_stop and j < b_stop:
        if a_fine[i] == b_fine[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
            continue
        i2, j2 = _resync(a_fine, fine_index, i, j, a_stop, b_stop, NEAR_SHIFT)
        if i2 < 0 and a_kind[i] == b_kind[j]:
            i2, j2 = i, j  # one API with other shapes, no resync near: they pair where they stand
        for codes, index, horizon in ((a_fine, fine_index, MAX_SHIFT), (a_kind, kind_index, MAX_SHIFT),
                                      (a_fine, fine_index, a_stop), (a_kind, kind_index, a_stop)):
            if i2 >= 0:
                break
            i2, j2 = _resync(codes, index, i, j, a_stop, b_stop, horizon)
        if i2 < 0:
            break
        pairs += _window(score, range(i, i2), range(j, j2))
        i, j = i2, j2
        if a_fine[i] != b_fine[j]:  # resynced on the coarse keys: the calls pair by kind
            pairs.append((i, j))
            i, j = i + 1, j + 1
    pairs += _window(score, range(i, a_stop), range(j, b_stop))
    pairs += [(n - tail + k, m - tail + k) for k in range(tail)]
    return pairs


# ------------------------------------------------------------------------------------------------------
# rows


def _vkey(rows: SideRows, r: int) -> tuple[Any, ...] | None:
    """What identifies a tensor's value within one run: shape, dtype and statistics (and checksum)."""
    cols = rows.columns
    if not cols.is_tensor[r]:
        return None
    stats = cols.stats_of(r)
    high, low, mean, norm = stats  # x != x: NaN only (None, ints and text equal themselves); no generators
    unknown = high != high or low != low or mean != mean or norm != norm  # noqa: PLR0124 - the NaN test
    if unknown or (high is None and low is None and mean is None and norm is None):
        if cols.md5s[r] is None:
            return None
    return (cols.shapes[r], cols.dtypes[r], stats, cols.md5s[r])


class _Values:
    """Each tensor row of one side by its value key, for provenance look-ups."""

    def __init__(self, rows: SideRows) -> None:
        self.rows = rows
        self.keys: list[tuple[Any, ...] | None] = [_vkey(rows, r) for r in range(len(rows))]
        self.where: dict[tuple[Any, ...], list[int]] = {}
        canonical: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # one tuple per value: rows repeat values
        for r, key in enumerate(self.keys):
            if key is not None:
                self.keys[r] = key = canonical.setdefault(key, key)
                self.where.setdefault(key, []).append(r)


def _paired_rows(t: _Side, b: _Side, x: int, y: int, index: list[int], basis: list[str]) -> None:
    """Pair the rows of target call ``x`` with those of bench call ``y`` by their names after the entry."""
    tn, bn = t.calls.names[x], b.calls.names[y]
    b_rows = {b.rows.names[r][len(bn) :] if b.rows.names[r].startswith(bn) else b.rows.names[r]: r
              for r in range(b.calls.starts[y], b.calls.stops[y])}  # fmt: skip
    same = tn == bn
    for r in range(t.calls.starts[x], t.calls.stops[x]):
        name = t.rows.names[r]
        found = b_rows.get(name[len(tn) :] if name.startswith(tn) else name)
        if found is not None:
            index[r] = found
            basis[r] = BASIS_NAME if same else BASIS_ALIGNED


@dataclass(slots=True)
class Aligned:
    """What the alignment adds to a ``Pairing``: each NPU row's basis, the gaps, and, for the rows of the
    gaps, their gap, the state the localization reads (internal rows) and the call they are judged in."""

    basis: list[str]
    gaps: list[Gap]
    row_gap: dict[int, int]
    bench_row_gap: dict[int, int]
    states: dict[int, str]
    apis: dict[int, str]


def _boundary(side: _Side, values: _Values, lo: int, hi: int) -> tuple[list[int], list[int], list[int]]:
    """The boundary inputs, boundary outputs and internal rows of calls ``[lo, hi)`` of one side."""
    cols, keys = side.rows.columns, values.keys
    inputs: list[int] = []
    outputs: list[int] = []
    internal: list[int] = []
    produced: set[Any] = set()
    for k in range(lo, hi):
        span = range(side.calls.starts[k], side.calls.stops[k])
        for r in span:
            if cols.states[r] in _INPUTS:
                key = keys[r]
                (internal if key is None or key in produced else inputs).append(r)
        produced.update(keys[r] for r in span if cols.states[r] == STATE_OUTPUT and keys[r] is not None)
    consumed: set[Any] = set()
    for k in range(hi - 1, lo - 1, -1):
        span = range(side.calls.starts[k], side.calls.stops[k])
        for r in span:
            state = cols.states[r]
            if state == STATE_OUTPUT:
                key = keys[r]
                (internal if key is None or key in consumed else outputs).append(r)
            elif state not in _INPUTS:
                internal.append(r)
        consumed.update(keys[r] for r in span if cols.states[r] in _INPUTS and keys[r] is not None)
    return inputs, outputs, internal


class _Provenance:
    """The bench partner of the nearest paired target row outside a gap holding a row's value: before the
    gap for an input, after it for an output; -1 if none.

    Walking a value's rows one by one was quadratic where many rows share a value (issue 37: 102 s of CPU
    at 12,240 calls a side). Exact for the order :func:`align_rows` asks in, gaps left to right: the rows
    before a gap are final by then, so a value's cursor moves forward once over them (amortised O(1)); the
    rows after it hold only the pairs made before any gap, found by bisection in the list of those."""

    def __init__(self, values: _Values, index: Sequence[int]) -> None:
        self.values, self.index = values, index
        self._cursor: dict[Any, tuple[int, int]] = {}  # key -> (positions scanned, last partner among them)
        self._paired: dict[Any, list[int]] = {}  # key -> positions in where[key] paired when first asked

    def partner(self, r: int, lo_row: int, hi_row: int, before: bool) -> int:
        key = self.values.keys[r]
        where = self.values.where.get(key) if key is not None else None
        if not where:
            return -1
        index = self.index
        if before:
            stop = bisect.bisect_left(where, lo_row)
            pos, last = self._cursor.get(key, (0, -1))
            for k in range(pos, stop):
                if index[where[k]] >= 0:
                    last = index[where[k]]
            if stop > pos:
                self._cursor[key] = (stop, last)
            return last if stop >= pos else self._walk_back(where, stop)
        paired = self._paired.get(key)
        if paired is None:
            paired = self._paired[key] = [k for k, row in enumerate(where) if index[row] >= 0]
        k = bisect.bisect_left(paired, bisect.bisect_left(where, hi_row))
        return index[where[paired[k]]] if k < len(paired) else -1

    def _walk_back(self, where: Sequence[int], stop: int) -> int:
        """Asked out of order (before a row the cursor passed): the walk itself."""
        for k in range(stop - 1, -1, -1):
            if self.index[where[k]] >= 0:
                return self.index[where[k]]
        return -1


class _PairedRows:
    """The bench rows of calls both sides make (``rows``), and by value the sorted ones holding it, each
    list filtered once (issue 37: filtering it per look-up was quadratic where many rows share a value)."""

    def __init__(self, values: _Values, rows: Set[int]) -> None:
        self.values, self.rows = values, rows
        self._where: dict[tuple[Any, ...], list[int]] = {}

    def where(self, key: tuple[Any, ...]) -> list[int]:
        found = self._where.get(key)
        if found is None:
            found = self._where[key] = [r for r in self.values.where.get(key, ()) if r in self.rows]
        return found


def _same_value_near(key: tuple[Any, ...] | None, at: int, paired: _PairedRows) -> int:
    """The paired bench row holding the value ``key`` nearest to row ``at``, after it first (the call that
    reads it there: a parameter the target's gap casts before its first use); -1 if none. Only rows of calls
    both sides make count: a tensor only the bench's own gap reads says nothing of where the target's went."""
    where = paired.where(key) if key is not None else []
    if not where:
        return -1
    k = bisect.bisect_left(where, at)
    return where[k] if k < len(where) else where[-1]


#: At most this many bench candidates of one shape are weighed for one boundary tensor without provenance.
MAX_CANDIDATES = 64


def _closest(t_rows: SideRows, r: int, b_rows: SideRows, buckets: dict[tuple[Any, str], list[int]]) -> int:
    """The unused bench candidate of ``r``'s shape and dtype family (``buckets``) with the closest
    statistics, taken out of its bucket; -1 if none."""
    tc, bc = t_rows.columns, b_rows.columns
    bucket = buckets.get((tc.shapes[r], _family(tc.dtypes[r])))
    if not bucket:
        return -1
    best, best_d = -1, math.inf
    ts = tc.stats_of(r)
    for c in bucket[:MAX_CANDIDATES]:
        bs = bc.stats_of(c)
        d = 0.0
        for u, v in zip(ts, bs, strict=True):
            if isinstance(u, float) and isinstance(v, float) and math.isfinite(u) and math.isfinite(v):
                d += abs(u - v) / max(abs(u), abs(v), 1e-12)
            elif u != v:
                d += 1.0
        if d < best_d:
            best, best_d = c, d
    if best >= 0:
        bucket.remove(best)
    return best


def _pair_gap(t: _Side, b: _Side, tv: _Values, bv: _Values, provenance: _Provenance, gap: GapRange,
              index: list[int], aligned: Aligned, number: int, paired: _PairedRows) -> None:  # fmt: skip
    """Pair the boundary tensors of one gap, mark its internal rows, and its rows' gap and call."""
    lo, hi, blo, bhi = gap
    t_in, t_out, t_internal = _boundary(t, tv, lo, hi)
    b_in, b_out, _ = _boundary(b, bv, blo, bhi) if bhi > blo else ([], [], [])
    lo_row, hi_row = t.calls.starts[lo], t.calls.stops[hi - 1]
    api = t.calls.names[lo]
    for r in range(lo_row, hi_row):
        aligned.row_gap[r] = number
        aligned.basis[r] = BASIS_GAP
        if t.rows.apis[r] != api:
            aligned.apis[r] = api
    for k in range(blo, bhi):
        for r in range(b.calls.starts[k], b.calls.stops[k]):
            aligned.bench_row_gap[r] = number
    for r in t_internal:
        aligned.states[r] = STATE_GAP
    two_sided = bhi > blo
    bc = b.rows.columns
    for rows_t, rows_b, before in ((t_in, b_in, True), (t_out, b_out, False)):
        own = {bv.keys[c]: c for c in reversed(rows_b)}
        used: set[int] = set()
        unpaired = []
        for r in rows_t:  # provenance first: the same tensor as a paired one outside the gap
            partner = provenance.partner(r, lo_row, hi_row, before)
            if partner >= 0:
                partner = own.get(bv.keys[partner], partner)
                index[r] = partner
                used.add(partner)
            else:
                unpaired.append(r)
        if two_sided and unpaired:  # then by shape and values, among the bench's boundary tensors left
            buckets: dict[tuple[Any, str], list[int]] = {}
            for c in rows_b:
                if c not in used:
                    buckets.setdefault((bc.shapes[c], _family(bc.dtypes[c])), []).append(c)
            rest = []
            for r in unpaired:
                partner = _closest(t.rows, r, b.rows, buckets)
                if partner >= 0:
                    index[r] = partner
                else:
                    rest.append(r)
            unpaired = rest
        if not two_sided and before and unpaired:  # a tensor the target casts first, read as it is there
            at = b.calls.starts[blo] if blo < len(b.calls.starts) else len(b.rows)
            rest = []
            for r in unpaired:
                partner = _same_value_near(tv.keys[r], at, paired)
                if partner >= 0:
                    index[r] = partner
                else:
                    rest.append(r)
            unpaired = rest
        for r in unpaired:
            # an unpaired floating input leaves the gap unjudged (the loss may come from it); the rest of
            # what has no partner (an index, a mask, an output nobody reads) is internal
            if not (before and _family(t.rows.columns.dtypes[r]) == "f"):
                aligned.states[r] = STATE_GAP


def _gaps(pairs: Sequence[tuple[int, int]], n: int, m: int) -> list[tuple[int, int, int, int]]:
    out = []
    prev_i = prev_j = -1
    for i, j in [*pairs, (n, m)]:
        if i > prev_i + 1 or j > prev_j + 1:
            out.append((prev_i + 1, i, prev_j + 1, j))
        prev_i, prev_j = i, j
    return out


def align_rows(npu: SideRows, bench: SideRows, *, sites: Sites | None = None,
               modules: Modules | None = None) -> tuple[Pairing, Aligned]:  # fmt: skip
    """Pair the rows of two sides whose calls differ (see the module docstring). ``sites``: each side's
    call site per entry (from stack.json), where known; ``modules``: each side's construct.json, where
    known."""
    t, b = _sides(npu, bench, sites, modules)
    pairs = align_calls(t, b)
    index = [-1] * len(npu)
    aligned = Aligned([""] * len(npu), [], {}, {}, {}, {})
    for x, y in pairs:
        _paired_rows(t, b, x, y, index, aligned.basis)
    gaps = [part for gap in _gaps(pairs, len(t.calls.names), len(b.calls.names))
            for part in split_by_scope(gap, t.modules.scopes, b.modules.scopes)]
    gaps = _pair_foreach_gaps(t, b, gaps, index, aligned.basis)
    if gaps:
        tv, bv = _Values(npu), _Values(bench)
        provenance = _Provenance(tv, index)
        paired = _PairedRows(bv, {j for j in index if j >= 0})  # the bench rows of calls both sides make
        for number, gap in enumerate(gaps):
            lo, hi, blo, bhi = gap
            aligned.gaps.append(Gap(tuple(t.calls.names[lo:hi]), tuple(b.calls.names[blo:bhi])))
            if hi > lo and max(hi - lo, bhi - blo) <= MAX_GAP_CALLS:
                _pair_gap(t, b, tv, bv, provenance, gap, index, aligned, number, paired)
                continue
            for k in range(lo, hi):
                for r in range(t.calls.starts[k], t.calls.stops[k]):
                    aligned.row_gap[r], aligned.basis[r] = number, BASIS_GAP
            for k in range(blo, bhi):
                for r in range(b.calls.starts[k], b.calls.stops[k]):
                    aligned.bench_row_gap[r] = number
    used = set(index)
    bench_only = [j for j in range(len(bench)) if j not in used]
    return Pairing(index, bench_only), aligned


def _pair_foreach_gaps(t: _Side, b: _Side, gaps: list[GapRange], index: list[int],
                       basis: list[str]) -> list[GapRange]:  # fmt: skip
    """Pair the rows of each gap that is an optimizer's foreach calls against its per-parameter calls
    (``foreach``), in place; the gaps that remain."""
    t_calls = CallList(t.calls.names, t.calls.starts, t.calls.stops, t.rows.columns.is_tensor)
    b_calls = CallList(b.calls.names, b.calls.starts, b.calls.stops, b.rows.columns.is_tensor)
    out: list[GapRange] = []
    for gap in gaps:
        found = pair_foreach(t_calls, b_calls, t.rows.names, b.rows.names, gap)
        if found is None:
            out.append(gap)
            continue
        for r, j in found.rows:
            index[r], basis[r] = j, BASIS_FOREACH
        out.extend(found.rest)
    return out


def _basis_fast(index: Sequence[int]) -> list[str]:
    return [BASIS_NAME if j >= 0 else "" for j in index]


Sites = tuple[Mapping[str, str], Mapping[str, str]]


def pair_calls(npu: SideRows, bench: SideRows, *, fuzzy: bool = False, mapping: RowMapping | None = None,
               sites: Callable[[], Sites | None] | None = None,
               modules: Callable[[], Modules | None] | None = None,
               ) -> tuple[Pairing, Aligned | None]:  # fmt: skip
    """The engine's pairing: msprobe's fuzzy scan with ``fuzzy``; by name when both runs called the same
    calls (the fast path); else by alignment. ``mapping`` (``-dm``) then overrides the pairs it names.
    ``sites`` gives each side's call site per entry (stack.json), ``modules`` each side's construct.json,
    both read only when the calls are aligned (the fast path reads neither).
    The ``Aligned`` facts are None on the fast path without a mapping (every paired row pairs by name)."""
    aligned: Aligned | None = None
    if fuzzy:
        pairing = pair_fuzzy(npu, bench)
    elif _entries(npu.apis) == _entries(bench.apis):
        pairing = pair_exact(npu, bench)
    else:
        pairing, aligned = align_rows(npu, bench, sites=sites() if sites is not None else None,
                                      modules=modules() if modules is not None else None)
    if mapping is not None:
        if aligned is None:
            aligned = Aligned(_basis_fast(pairing.bench_index), [], {}, {}, {}, {})
        pairing = mapping.apply(npu, bench, pairing, aligned.basis)
    return pairing, aligned


def _entries(apis: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(apis))
