"""Pair NPU rows with bench rows (compare.md §3): exact names with backward renumbering, or fuzzy.

The engine pairs through ``alignment.pair_calls``: the exact join here is its path for two runs that called
the same calls, the fuzzy scan its ``-f``; runs whose calls differ are aligned there.

Everything is a dict lookup or a pointer walk, so pairing is linear in the number of rows, deterministic and
independent of any library's join order. Differences from msprobe, on purpose:

- the key is the row name only (v2), a shape difference is judged later as ``shape unmatched``;
- backward entries are renumbered by occurrence per op (v2, §3.1), so recomputed layers still pair;
- fuzzy pairing works on names, so it runs in every mode (msprobe crashes outside tensor mode), and its name
  normalisation removes the call counter by position instead of splitting on the substring ``forward``
  (which mangles module paths such as ``feedforward``);
- bench rows nobody paired with are returned, so they can be reported instead of dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat

from parity.shared.compare.rows import SideRows
from parity.shared.dump.naming import BACKWARD, parse_entry, uncounted

#: dtypes msprobe treats as interchangeable for pairing (§3.2), in torch and MindSpore spelling
FLOAT_FAMILY = frozenset({
    "torch.float16", "torch.float32", "torch.bfloat16",
    "float16", "float32", "bfloat16", "Float16", "Float32", "BFloat16",
})  # fmt: skip


@dataclass(slots=True)
class Pairing:
    """``bench_index[i]``: the bench row paired with NPU row ``i`` (-1: none); ``bench_only``: the rest."""

    bench_index: list[int]
    bench_only: list[int] = field(default_factory=list)


def dtypes_compatible(npu_dtype: str | None, bench_dtype: str | None) -> bool:
    """The dtype gate of §3.2: equal dtypes, or both in {float16, float32, bfloat16}."""
    return npu_dtype == bench_dtype or (npu_dtype in FLOAT_FAMILY and bench_dtype in FLOAT_FAMILY)


def renumber_backward(entry_names: Iterable[str]) -> dict[str, str]:
    """v2's backward renumbering (§3.1): the call number of each backward entry becomes the number of backward
    entries of the same op seen before it in this dump. Returns only the names that change.

    ``Functional.linear.1.backward`` (shifted by a recomputed forward) becomes
    ``Functional.linear.0.backward`` when it is the first linear backward of the dump; module backwards
    (``Module.fc.Linear.backward.3``) are counted the same way. Forward names never change.
    """
    seen: dict[tuple[str, str], int] = {}
    renamed: dict[str, str] = {}
    for name in entry_names:
        if not name.endswith("backward") and ".backward." not in name:
            continue
        parsed = parse_entry(name)
        if parsed is None or parsed.direction != BACKWARD:
            continue
        op_key = (parsed.kind, parsed.uncounted)
        k = seen.get(op_key, 0)
        seen[op_key] = k + 1
        new = parsed.with_index(k)
        if new != name:
            renamed[name] = new
    return renamed


def fuzzy_entry_name(name: str) -> str:
    """An entry name without its call counter (§3.4): ``Torch.add.3.forward`` → ``Torch.add.forward``,
    ``Module.fc.Linear.forward.2`` → ``Module.fc.Linear.forward``,
    ``...parameters_grad.1`` → ``...parameters_grad``.
    """
    return uncounted(name)


def row_keys(rows: SideRows, entry_map: dict[str, str]) -> list[str]:
    """Each row's pairing key: its name with the entry prefix replaced through ``entry_map`` where mapped."""
    if not entry_map:
        return rows.names
    keys: list[str] = []
    append = keys.append
    for name, api in zip(rows.names, rows.apis, strict=True):
        new_api = entry_map.get(api)
        if new_api is not None and name.startswith(api):
            append(new_api + name[len(api) :])
        else:
            append(name)
    return keys


def _unique_entries(apis: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(apis))


def parameters_grad_keys(entry_names: Iterable[str]) -> dict[str, str]:
    """The older layout's first parameter-gradient entry under msprobe 8.3.3's name, for pairing only.

    msprobe 8.3.3 names the entry ``Module.fc.Linear.parameters_grad``; older msprobe and Parity's own older
    dumps name it ``Module.fc.Linear.parameters_grad.0``. Keyed the same way, a dump of either generation
    pairs with one of the other; each row still shows the name its own dump gives it.
    """
    return {name: name[:-2] for name in entry_names if name.endswith(".parameters_grad.0")}


def pair_exact(npu: SideRows, bench: SideRows) -> Pairing:
    """Join on the row name after backward renumbering on each side; the first bench row of a key wins."""
    npu_entries, bench_entries = _unique_entries(npu.apis), _unique_entries(bench.apis)
    npu_keys = row_keys(npu, renumber_backward(npu_entries) | parameters_grad_keys(npu_entries))
    bench_keys = row_keys(bench, renumber_backward(bench_entries) | parameters_grad_keys(bench_entries))
    # Built back to front, so the first bench row of a key is the one that stays.
    bench_pos = dict(zip(reversed(bench_keys), range(len(bench_keys) - 1, -1, -1), strict=True))
    index = list(map(bench_pos.get, npu_keys, repeat(-1)))
    used = set(index)
    used.discard(-1)
    if len(used) == len(bench_keys):
        return Pairing(index, [])
    return Pairing(index, [j for j in range(len(bench_keys)) if j not in used])


class _Occurrences:
    """Positions of each key in one row list, consumed front to back (queue starts only move forward)."""

    __slots__ = ("lists", "heads")

    def __init__(self, keys: Sequence[str]) -> None:
        self.lists: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            self.lists.setdefault(key, []).append(i)
        self.heads: dict[str, int] = {}

    def first_in(self, key: str, start: int, stop: int) -> int:
        """The first position of ``key`` in ``[start, stop)``, or -1."""
        positions = self.lists.get(key)
        if positions is None:
            return -1
        head = self.heads.get(key, 0)
        while head < len(positions) and positions[head] < start:
            head += 1
        self.heads[key] = head
        if head < len(positions) and positions[head] < stop:
            return positions[head]
        return -1


def pair_fuzzy(npu: SideRows, bench: SideRows) -> Pairing:
    """msprobe's greedy two-queue scan (§3.4) over counter-free names, in linear time.

    At step ``i`` row ``i`` of each side joins its queue; the newest NPU row is tried against the older bench
    rows, then newest against newest, then the older NPU rows against the newest bench row. The first hit
    pairs, every NPU row queued before it is unmatched, and both queues drop everything up to the hit. When
    one side runs out, the other keeps joining and matching against what is still queued. Since
    the queues only ever lose a prefix they are index ranges, and each lookup is a dict of positions.
    """
    npu_keys = row_keys(npu, {a: fuzzy_entry_name(a) for a in _unique_entries(npu.apis)})
    bench_keys = row_keys(bench, {a: fuzzy_entry_name(a) for a in _unique_entries(bench.apis)})
    n_total, b_total = len(npu_keys), len(bench_keys)
    npu_occ, bench_occ = _Occurrences(npu_keys), _Occurrences(bench_keys)
    index = [-1] * n_total
    used: set[int] = set()
    n_start = b_start = 0  # queue = [start, end)
    n_end = b_end = 0
    while n_end < n_total or b_end < b_total:
        grew = False
        if n_end < n_total:
            n_end += 1
            grew = True
        if b_end < b_total:
            b_end += 1
            grew = True
        if not grew or n_start >= n_end or b_start >= b_end:
            continue
        n_new, b_new = n_end - 1, b_end - 1
        hit_n = hit_b = -1
        j = bench_occ.first_in(npu_keys[n_new], b_start, b_new)
        if j >= 0:
            hit_n, hit_b = n_new, j
        elif npu_keys[n_new] == bench_keys[b_new]:
            hit_n, hit_b = n_new, b_new
        else:
            i = npu_occ.first_in(bench_keys[b_new], n_start, n_new)
            if i >= 0:
                hit_n, hit_b = i, b_new
        if hit_n < 0:
            continue
        index[hit_n] = hit_b
        used.add(hit_b)
        n_start, b_start = hit_n + 1, hit_b + 1
    bench_only = [j for j in range(b_total) if j not in used]
    return Pairing(index, bench_only)


def pair_rows(npu: SideRows, bench: SideRows, *, fuzzy: bool) -> Pairing:
    """Pair the rows of two sides: exact (with backward renumbering) or fuzzy."""
    return pair_fuzzy(npu, bench) if fuzzy else pair_exact(npu, bench)
