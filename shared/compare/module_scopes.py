"""Module scopes for the alignment (issue 24): which calls of the two runs may pair, from construct.json.

At mix (and L0) construct.json maps each call to the innermost module active when it ran, and each module
call to the one around it. A module exists on both sides when the two runs are the same model, so its
calls are a unit: a call inside ``Module.blocks.0.attn.Attention.forward.0`` on the target has its partner
inside the same module call on the bench, never in the next block, whatever the call names or shapes say.
Without that fence an extra call at the end of one module and a like call at the start of the next pair
up across the boundary, and every gap around them is wrong.

* Module calls pair by name first (as module rows do), then by their path, direction and counter alone
  (a fused norm module renames the class, not the path: ``Module.ln.FusedLayerNorm.forward.0`` is the
  bench's ``Module.ln.LayerNorm.forward.0``).
* A call's scope is its nearest enclosing module call that has a partner (a module only one side has is
  transparent: its calls belong to the paired module around it), named by the target's node on both sides.
* A call's module path (its innermost module without class and counter) is a hint for the score.

Without a construct.json on both sides, or with one without modules (L1 writes ``{}``), every scope is
None: the alignment is the whole-sequence one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from parity.shared.dump.naming import parse_entry

__all__ = ["CallModules", "Modules", "module_path", "module_scopes", "pair_modules", "split_by_scope"]

#: Each side's construct.json (``{node: parent or None}``), target then bench.
Modules = tuple[Mapping[str, str | None], Mapping[str, str | None]]
#: A stretch of calls without partners: target calls ``[lo, hi)``, bench calls ``[blo, bhi)``.
GapRange = tuple[int, int, int, int]
#: How many modules up a call's scope is looked for (a cycle in a malformed construct.json ends there).
MAX_DEPTH = 64


def _module_key(node: str) -> tuple[str, str, str] | None:
    """``Module.{path}.{Class}.{direction}.{n}`` as ``(path, direction, n)``: what identifies a module
    call whatever its class is called; None for a node that is no module call (``optimizer``)."""
    parsed = parse_entry(node)
    if parsed is None or parsed.kind != "module" or parsed.direction is None:
        return None
    return parsed.name, parsed.direction, str(parsed.index)


def module_path(node: str) -> str:
    """The module's path, without its class and counter (``Module.blocks.0.attn.Attention.forward.1`` is
    ``blocks.0.attn.forward``): the same place in the model on both sides, though the class be renamed."""
    key = _module_key(node)
    return f"{key[0]}.{key[1]}" if key is not None else node


def _nodes(construct: Mapping[str, str | None]) -> list[str]:
    """The module nodes of one construct.json: every parent, and every key that is a module call."""
    found = dict.fromkeys(p for p in construct.values() if p is not None)
    found.update(dict.fromkeys(k for k in construct if k.startswith("Module.")))
    return list(found)


def pair_modules(target: Mapping[str, str | None], bench: Mapping[str, str | None]) -> dict[str, str]:
    """Target module node -> bench module node: by name, then by path, direction and counter where that
    names one node on each side (a renamed class)."""
    t_nodes, b_nodes = _nodes(target), _nodes(bench)
    b_set = set(b_nodes)
    pairs = {node: node for node in t_nodes if node in b_set}
    paired_b = set(pairs.values())

    def by_key(nodes: Sequence[str], taken: Mapping[str, str] | set[str]) -> dict[tuple[str, str, str], str]:
        out: dict[tuple[str, str, str], str] = {}
        twice: set[tuple[str, str, str]] = set()
        for node in nodes:
            key = _module_key(node)
            if key is None or node in taken:
                continue
            if key in out:
                twice.add(key)
            out[key] = node
        return {k: v for k, v in out.items() if k not in twice}

    t_keys, b_keys = by_key(t_nodes, pairs), by_key(b_nodes, paired_b)
    pairs.update((node, b_keys[key]) for key, node in t_keys.items() if key in b_keys)
    return pairs


@dataclass(slots=True)
class CallModules:
    """One side's calls' scopes (the target's node of the nearest paired module around each; None: none)
    and module paths (their innermost module's; None: not in construct.json)."""

    scopes: list[str | None]
    paths: list[str | None]


def _side_modules(names: Sequence[str], construct: Mapping[str, str | None],
                  scope_of_node: Mapping[str, str]) -> CallModules:  # fmt: skip
    """Each call's scope and module path; ``scope_of_node`` maps this side's paired module nodes to their
    scope name."""
    memo: dict[str, str | None] = {}

    def scope(node: str | None) -> str | None:
        chain: list[str] = []
        found: str | None = None
        while node is not None and len(chain) < MAX_DEPTH:
            if node in memo:
                found = memo[node]
                break
            if node in scope_of_node:
                found = scope_of_node[node]
                break
            chain.append(node)
            node = construct.get(node)
        memo.update(dict.fromkeys(chain, found))
        return found

    parents = [construct.get(name) for name in names]
    return CallModules([scope(p) for p in parents], [module_path(p) if p else None for p in parents])


def module_scopes(t_names: Sequence[str], b_names: Sequence[str],
                  modules: Modules | None) -> tuple[CallModules, CallModules] | None:  # fmt: skip
    """Both sides' call scopes and module paths; None when either side has no modules (L1, or no
    construct.json): the alignment then runs over the whole sequences."""
    if modules is None or not _nodes(modules[0]) or not _nodes(modules[1]):
        return None
    pairs = pair_modules(*modules)
    if not pairs:
        return None
    by_bench = {b: t for t, b in pairs.items()}
    return (_side_modules(t_names, modules[0], {t: t for t in pairs}),
            _side_modules(b_names, modules[1], by_bench))  # fmt: skip


def _runs(scopes: Sequence[str | None], lo: int, hi: int) -> list[tuple[str | None, int, int]]:
    """Calls ``[lo, hi)`` as maximal runs of one scope: ``(scope, start, stop)``."""
    runs: list[tuple[str | None, int, int]] = []
    for k in range(lo, hi):
        if runs and runs[-1][0] == scopes[k]:
            runs[-1] = (scopes[k], runs[-1][1], k + 1)
        else:
            runs.append((scopes[k], k, k + 1))
    return runs


def split_by_scope(gap: GapRange, t_scopes: Sequence[str | None],
                   b_scopes: Sequence[str | None]) -> list[GapRange]:  # fmt: skip
    """Cut a gap where its calls' scope changes, so that no gap spans two modules: a run of target calls
    and a run of bench calls of one scope make one gap, a run whose scope the other side's gap lacks is a
    gap of one side. The order of the calls on each side is kept. Without modules (every scope None) the
    gap is whole."""
    lo, hi, blo, bhi = gap
    ts, bs = _runs(t_scopes, lo, hi), _runs(b_scopes, blo, bhi)
    if len(ts) <= 1 and len(bs) <= 1 and (not ts or not bs or ts[0][0] == bs[0][0]):
        return [gap]
    out: list[GapRange] = []
    # where each scope's last bench run is: "the target's scope comes later on the bench" in O(1), not a
    # scan of the bench's runs left (quadratic with alternating scopes, issue 37)
    last_bench = {run[0]: k for k, run in enumerate(bs)}
    u = v = 0
    while u < len(ts) or v < len(bs):
        i = ts[u][1] if u < len(ts) else hi
        j = bs[v][1] if v < len(bs) else bhi
        if u < len(ts) and v < len(bs) and ts[u][0] == bs[v][0]:
            out.append((i, ts[u][2], j, bs[v][2]))
            u, v = u + 1, v + 1
        elif v < len(bs) and (u == len(ts) or last_bench.get(ts[u][0], -1) > v):
            out.append((i, i, j, bs[v][2]))  # the bench's run comes first: the target's scope is later
            v += 1
        else:
            out.append((i, ts[u][2], j, j))
            u += 1
    return out
