"""Optimizer traces pair across devices: a ``_foreach_*`` call against the per-parameter calls it stands for.

``torch.optim.AdamW`` takes its ``foreach`` path on an accelerator and its per-parameter loop on the CPU: the
device's trace has nine ``Torch._foreach_*`` calls, each over a list of K tensors (``input.0.k``,
``output.k``), where the CPU's has K blocks of nine calls (``Tensor.__iadd__``, ``Tensor.mul_``,
``Tensor.lerp_``, ...), one block per parameter. The alignment sees one gap of 9 calls against 9K. Here such a
gap is paired element by element: foreach call ``f``'s element ``k`` is call ``f`` of block ``k`` on the other
side, when the other side holds a run of K blocks whose ops are the foreach calls' ops in order
(``_foreach_add_`` is ``add_`` or ``+=``, ``_foreach_div_`` is ``/``, ``_foreach_norm`` is ``vector_norm``).
Row by row: ``input.j.k`` (a list argument's element) pairs with ``input.j``, ``output.k`` with
``output.0``, and an argument shared by every element (``input.j``, a keyword) with the first block's.
Either side may be the foreach one. What is left of the gap on either side of the run stays a gap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parity.shared.dump.naming import FORWARD, parse_entry

__all__ = ["ForeachPairs", "pair_foreach"]

_FOREACH = "foreach_"
#: per-parameter ops under another name than their foreach op (``EntryName.op``: underscores stripped)
_SAME_OP = {"iadd": "add", "isub": "sub", "imul": "mul", "itruediv": "div", "truediv": "div",
            "vector_norm": "norm"}  # fmt: skip
#: a foreach op's positional argument that the per-parameter call passes by keyword (``addcmul_``'s value)
_KEYWORD = {("addcmul", "input.3"): "input.value", ("addcdiv", "input.3"): "input.value"}


@dataclass(slots=True)
class ForeachPairs:
    """A gap's foreach pairing: ``rows`` are ``(target row, bench row)``; ``rest`` the call ranges of the
    gap left unpaired, ``(lo, hi, blo, bhi)`` as the alignment's gaps (either side may be empty)."""

    rows: list[tuple[int, int]]
    rest: list[tuple[int, int, int, int]]


@dataclass(frozen=True, slots=True)
class CallList:
    """One side's calls: names, and each call's first row and one past its last; and which of the side's
    rows are tensors (a tensor pairs only with a tensor)."""

    names: Sequence[str]
    starts: Sequence[int]
    stops: Sequence[int]
    tensor: Sequence[int] | bytes


def _op(name: str) -> tuple[str, bool]:
    """A forward call's op as the per-parameter loop spells it, and whether it is a foreach call."""
    parsed = parse_entry(name)
    if parsed is None or parsed.direction != FORWARD or parsed.kind != "api":
        return "", False
    op = parsed.op
    foreach = op.startswith(_FOREACH)
    op = op.removeprefix(_FOREACH)
    return _SAME_OP.get(op, op), foreach


def pair_foreach(t_calls: CallList, b_calls: CallList, t_rows: Sequence[str], b_rows: Sequence[str],
                 gap: tuple[int, int, int, int]) -> ForeachPairs | None:  # fmt: skip
    """The pairing of gap ``(lo, hi, blo, bhi)`` (call indexes) when one side's part of it holds a run of
    foreach calls and the other side's the per-parameter blocks they stand for (module docstring); None
    otherwise. ``t_rows``/``b_rows``: each side's row names."""
    lo, hi, blo, bhi = gap
    for foreach_side in (0, 1):
        calls = (t_calls, b_calls)[foreach_side]
        loop_calls = (b_calls, t_calls)[foreach_side]
        rows, loop_rows = (t_rows, b_rows) if foreach_side == 0 else (b_rows, t_rows)
        f_lo, f_hi = (lo, hi) if foreach_side == 0 else (blo, bhi)
        l_lo, l_hi = (blo, bhi) if foreach_side == 0 else (lo, hi)
        run = _foreach_run(calls, rows, f_lo, f_hi)
        if run is None:
            continue
        r_lo, r_hi, ops, width = run
        found = _blocks(loop_calls, l_lo, l_hi, ops, width)
        if found is None:
            continue
        pairs = _row_pairs(calls, loop_calls, rows, loop_rows, r_lo, r_hi, found, width, foreach_side == 0)
        if foreach_side == 0:
            before, after = (lo, r_lo, blo, found), (r_hi, hi, found + width * len(ops), bhi)
        else:
            pairs = [(t, f) for f, t in pairs]
            before, after = (lo, found, blo, r_lo), (found + width * len(ops), hi, r_hi, bhi)
        rest = [g for g in (before, after) if g[1] > g[0] or g[3] > g[2]]
        return ForeachPairs(pairs, rest)
    return None


Run = tuple[int, int, list[str], int]


def _foreach_run(calls: CallList, rows: Sequence[str], lo: int, hi: int) -> Run | None:
    """The longest run of foreach calls in ``[lo, hi)`` whose lists have one length: its range, ops and
    list length (the number of parameters)."""
    best: Run | None = None
    k = lo
    while k < hi:
        op, foreach = _op(calls.names[k])
        if not foreach:
            k += 1
            continue
        width = _width(calls, rows, k)
        start, ops = k, []
        while k < hi:
            op, foreach = _op(calls.names[k])
            if not foreach or _width(calls, rows, k) != width:
                break
            ops.append(op)
            k += 1
        if width > 0 and (best is None or len(ops) > len(best[2])):
            best = (start, k, ops, width)
    return best


def _width(calls: CallList, rows: Sequence[str], k: int) -> int:
    """How many elements a foreach call's first list argument has (its ``input.0.N`` rows)."""
    head = calls.names[k] + ".input.0."
    return sum(1 for r in range(calls.starts[k], calls.stops[k])
               if rows[r].startswith(head) and rows[r][len(head):].isdigit())  # fmt: skip


def _blocks(calls: CallList, lo: int, hi: int, ops: list[str], width: int) -> int | None:
    """Where in ``[lo, hi)`` a run of ``width`` blocks of ``ops`` (in order) starts, or None."""
    size = len(ops) * width
    have = [op if not foreach else "" for op, foreach in map(_op, calls.names[lo:hi])]
    want = ops * width
    for start in range(hi - lo - size + 1):  # a mismatch ends each try early: linear in practice
        if have[start] == want[0] and have[start : start + size] == want:
            return lo + start
    return None


def _row_pairs(calls: CallList, loop_calls: CallList, rows: Sequence[str], loop_rows: Sequence[str],
               r_lo: int, r_hi: int, found: int, width: int,
               target_is_foreach: bool) -> list[tuple[int, int]]:  # fmt: skip
    """``(foreach row, loop row)`` for every row of the run that has a partner in its block."""
    out: list[tuple[int, int]] = []
    m = r_hi - r_lo
    for f in range(m):
        k_call = r_lo + f
        op = _op(calls.names[k_call])[0]
        prefix = len(calls.names[k_call]) + 1
        for element in range(width):
            c = found + element * m + f
            loop_prefix = len(loop_calls.names[c]) + 1
            by_place = {loop_rows[r][loop_prefix:]: r
                        for r in range(loop_calls.starts[c], loop_calls.stops[c])}  # fmt: skip
            shared = element == 0 or not target_is_foreach
            for r in range(calls.starts[k_call], calls.stops[k_call]):
                place = _element_place(rows[r][prefix:], element, shared=shared)
                if place is None:
                    continue
                j = by_place.get(place, by_place.get(_KEYWORD.get((op, place), "")))
                if j is not None and bool(calls.tensor[r]) == bool(loop_calls.tensor[j]):
                    out.append((r, j))
    return out


def _element_place(place: str, element: int, *, shared: bool) -> str | None:
    """The loop call's row that a foreach row's ``place`` (``input.0.3``, ``output.3``, ``input.alpha``)
    stands for in element ``element``; None where it is another element's. ``shared``: an argument common
    to every element pairs here too."""
    parts = place.split(".")
    if len(parts) == 2 and parts[0] == "output" and parts[1].isdigit():
        return "output.0" if int(parts[1]) == element else None
    if len(parts) == 3 and parts[2].isdigit():  # a list argument's element (tensors, or scalars)
        return f"{parts[0]}.{parts[1]}" if int(parts[2]) == element else None
    if len(parts) == 2:
        return place if shared else None
    return None
