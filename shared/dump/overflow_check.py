"""msprobe 26's ``overflow_check``: the first call whose output turned NaN/Inf, across every rank of one step.

``parity overflow-check -i STEP_DIR [-o OUT]`` reads each rank's dump.json, construct.json and stack.json
(``rank{N}/``, or one ``proc*`` folder) in statistics form (a leaf's ``Max``/``Min`` of ``nan``/``inf``/
``-inf`` is an anomaly) and writes ``anomaly_analyze_{time_ns}.json`` (``{"rank_N": [call, ...]}``, indent
2) as msprobe 26.2.0 does, or nothing when no call overflowed. It searches in msprobe's three phases, which
this module follows step for step (read from 26.2.0's ``msprobe.overflow_check``):

1. **before the first collective**: on each rank, the first call (before that rank's first ``Distributed.*``
   collective) whose inputs are finite and whose outputs are not; every rank's such call is reported;
2. **at the collectives**: each rank's collectives form a chain (``layer`` = its index in the chain), joined
   across ranks by peer (``src``/``dst``, ``group`` ranks, p2p pairs such as send/recv); collectives with no
   NaN/Inf and no anomalous compute call before them are pruned; the groups of joined collectives are walked
   in layer order and the first anomaly (a compute call before a collective whose inputs were NaN/Inf, or a
   collective that made NaN/Inf out of finite inputs) wins, by ``(layer, calls since the last collective)``;
3. **after the last collective**: each rank's first anomalous call after its last collective.

Where msprobe's result depends on directory listing or set iteration order (which rank is searched first,
ties between ranks at the same layer), Parity takes ranks in ascending order and calls in dump order, so the
same dump gives the same answer every time; for a dump without such a tie the two tools agree. What phase
found the call is said on stdout (``before the first collective`` ...), since msprobe's file does not say it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parity.shared.dump.layout import CONSTRUCT_JSON, DUMP_JSON, STACK_JSON
from parity.shared.dump.reader import read_json
from parity.shared.errors import DumpError
from parity.shared.report import write_text_atomically

logger = logging.getLogger(__name__)

__all__ = ["Anomaly", "OverflowResult", "find_overflow", "write_anomaly_analyze"]

#: msprobe's ``COMMUNICATION_KEYWORDS``: a ``Distributed.*`` entry naming one of these is a collective
COMMUNICATION_KEYWORDS = (
    "send", "recv", "broadcast", "all_reduce", "reduce", "all_gather", "gather", "isend", "irecv", "scatter",
    "reduce_scatter", "_reduce_scatter_base", "_all_gather_base", "all_to_all_single", "all_to_all",
    "all_gather_into_tensor", "reduce_scatter_tensor", "send_object_list", "recv_object_list",
)  # fmt: skip
#: calls whose outputs are uninitialised memory, never an anomaly (msprobe's ``is_ignore_op``)
IGNORED = ("Torch.empty", "Torch.fill")
OVERFLOW_TEXT = frozenset({"nan\t", "inf\t", "-inf\t", "nan", "inf", "-inf"})
P2P_PEER = {"send": "recv", "recv": "send", "isend": "irecv", "irecv": "isend",
            "send_object_list": "recv_object_list", "recv_object_list": "send_object_list"}  # fmt: skip
SRC, DST, LINK = "src", "dst", "link"
DIRECTED = {"send": DST, "recv": SRC, "isend": DST, "irecv": SRC, "broadcast": SRC, "scatter": SRC,
            "gather": DST, "send_object_list": DST, "recv_object_list": SRC}  # fmt: skip
OPPOSITE = {SRC: DST, DST: SRC}

BEFORE = "before the first collective"
AT_COLLECTIVE = "a collective, from finite inputs"
BETWEEN = "between collectives, feeding the next"
AFTER = "after the last collective"


def is_collective(name: str) -> bool:
    return name.startswith("Distributed.") and any(word in name for word in COMMUNICATION_KEYWORDS)


def is_ignored(name: str) -> bool:
    return any(word in name for word in IGNORED)


def has_overflow(items: Any) -> bool:
    """Whether a leaf of a list (or of a dict's values) has a NaN/Inf ``Max`` or ``Min`` (one level deep)."""
    values: Iterable[Any] = (
        items if isinstance(items, list) else items.values() if isinstance(items, dict) else ()
    )
    for item in values:
        if isinstance(item, dict) and (
            str(item.get("Max")).lower() in OVERFLOW_TEXT or str(item.get("Min")).lower() in OVERFLOW_TEXT
        ):
            return True
    return False


@dataclass(eq=False)
class Call:
    """One dump entry: msprobe's ``DataNode``."""

    name: str
    rank: int
    record: Mapping[str, Any]
    sub_layer: int = 0  # non-ignored calls since the rank's last collective: the order within a layer
    layer: int = 0

    def part(self, key: str, empty: Any) -> Any:
        return self.record.get(key, empty)

    def inputs_overflow(self) -> bool:
        return any(has_overflow(self.part(key, [])) for key in ("input", "input_args", "input_kwargs"))

    def is_anomaly(self) -> bool:
        """Finite inputs, NaN/Inf outputs: the call made the overflow."""
        if is_ignored(self.name):
            return False
        return not self.inputs_overflow() and has_overflow(self.part("output", {}))


@dataclass(eq=False)
class Collective:
    """One collective call on one rank and its joins to the other ranks': msprobe's ``CommunicationNode``."""

    node_id: str
    call: Call
    compute: list[Call]  # anomalous calls since the rank's previous collective
    layer: int = 0
    prev: Collective | None = None
    nexts: dict[str, Collective] = field(default_factory=dict)
    links: dict[str, Collective] = field(default_factory=dict)
    dsts: dict[str, Collective] = field(default_factory=dict)
    srcs: dict[str, Collective] = field(default_factory=dict)
    connected: bool = False
    _peers: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        parts = self.call.name.split(".")
        if len(parts) < 4:
            raise DumpError(
                None, "not a dump entry name (API.name.N.direction)", where=f"entry {self.call.name!r}"
            )
        self.api, self.call_count = parts[1], parts[2]
        self.kind = self._kind()

    @property
    def rank(self) -> int:
        return self.call.rank

    @property
    def kwargs(self) -> Mapping[str, Any]:
        value = self.call.part("input_kwargs", {})
        return value if isinstance(value, Mapping) else {}

    @property
    def args(self) -> list[Any]:
        value = self.call.part("input_args", [])
        return value if isinstance(value, list) else []

    def _rank_arg(self, names: tuple[str, str]) -> tuple[bool, Any]:
        for name in names:
            if name in self.kwargs and self.kwargs[name]:
                return True, _value(self.kwargs[name])
        return False, None

    def _kind(self) -> str:
        found, value = self._rank_arg(("src", "src_group"))
        if found:
            return SRC if value == self.rank else DST
        found, value = self._rank_arg(("dst", "dst_group"))
        if found:
            return DST if value == self.rank else SRC
        if self.api in DIRECTED:
            for item in self.args:
                if isinstance(item, Mapping) and item.get("type") == "int":
                    kind = DIRECTED[self.api]
                    return kind if item.get("value") == self.rank else OPPOSITE[kind]
        return LINK

    def peers(self) -> dict[str, Any]:
        """The api, ranks and kind of the collectives this one joins (cached: msprobe widens an empty set of
        ranks to every rank on the cached value itself)."""
        if self._peers is not None:
            return self._peers
        ranks: set[Any] = set()
        for names in (("dst", "dst_group"), ("src", "src_group")):
            for name in names:
                if name in self.kwargs:
                    if self.kwargs[name]:
                        ranks.add(_value(self.kwargs[name]))
                    break
        if not ranks:
            ranks.update(item.get("value") for item in self.args
                         if isinstance(item, Mapping) and item.get("type") == "int")  # fmt: skip
        group = self.kwargs.get("group")
        if group:
            group_ranks = group.get("group_ranks") if isinstance(group, Mapping) else None
            if not isinstance(group_ranks, list):
                where = f"rank {self.rank} entry {self.call.name!r} input_kwargs.group"
                raise DumpError(None, "field 'group_ranks' must be a list of ranks", where=where)
            ranks.update(group_ranks)
        self._peers = {
            "ranks": ranks,
            "api": P2P_PEER.get(self.api, self.api),
            "kind": OPPOSITE.get(self.kind, LINK),
        }
        return self._peers

    def overflows(self) -> bool:
        return self.inputs_overflow() or has_overflow(self.call.part("output", {}))

    def inputs_overflow(self) -> bool:
        return has_overflow(self.call.part("input_args", [])) or has_overflow(
            self.call.part("input_kwargs", {})
        )

    def add_next(self, node: Collective) -> None:
        self.nexts[node.node_id] = node
        node.prev = self
        node.layer = self.layer + 1

    def add_link(self, node: Collective) -> None:
        self.links[node.node_id] = node
        node.links[self.node_id] = self
        node.layer = self.layer
        self.connected = node.connected = True

    def add_dst(self, node: Collective) -> None:
        self.dsts[node.node_id] = node
        node.srcs[self.node_id] = self
        node.layer = self.layer
        self.connected = node.connected = True

    def delete(self) -> None:
        for node in self.nexts.values():
            node.prev = None
        for node in self.dsts.values():
            node.srcs.pop(self.node_id, None)
        for node in self.srcs.values():
            node.dsts.pop(self.node_id, None)
        for node in self.links.values():
            node.links.pop(self.node_id, None)
        if self.prev is not None:
            self.prev.nexts.pop(self.node_id, None)

    def relatives(self) -> set[str]:
        return {self.node_id, *self.links, *self.srcs, *self.dsts}


def _value(arg: Any) -> Any:
    return arg.get("value") if isinstance(arg, Mapping) else None


@dataclass(frozen=True)
class RankFiles:
    rank: int
    folder: Path

    @property
    def dump(self) -> Path:
        return self.folder / DUMP_JSON


@dataclass(frozen=True)
class Anomaly:
    """The call found, with the phase that found it."""

    call: Call
    phase: str


@dataclass(frozen=True)
class OverflowResult:
    ranks: list[RankFiles]
    anomalies: list[Anomaly]


def rank_folders(step_dir: Path) -> list[RankFiles]:
    """A step folder's ranks as msprobe finds them: ``rank{N}`` (``rank`` alone is 0), or one ``proc*``."""
    if not step_dir.is_dir():
        raise DumpError(step_dir, "not a directory (expected a step folder holding rank{N}/dump.json)")
    contents = sorted(p.name for p in step_dir.iterdir())
    found: dict[int, RankFiles] = {}
    for name in contents:
        if len(contents) == 1 and name.startswith("proc"):
            rank = 0
        elif not name.startswith("rank"):
            continue
        elif not name[4:]:
            rank = 0
        elif not name[4:].isdigit():
            continue
        else:
            rank = int(name[4:])
        folder = step_dir / name
        for needed in (DUMP_JSON, CONSTRUCT_JSON, STACK_JSON):
            if not (folder / needed).is_file():
                problem = "not found (overflow-check reads dump.json, construct.json and stack.json)"
                raise DumpError(folder / needed, problem)
        found[rank] = RankFiles(rank, folder)
    if not found:
        raise DumpError(
            step_dir, "no rank{N} folder with a dump.json (give the step folder, e.g. dump/step0)"
        )
    return [found[rank] for rank in sorted(found)]


def _dump_data(files: RankFiles) -> tuple[str | None, dict[str, Any]]:
    doc = read_json(files.dump, "dump.json")
    if not isinstance(doc, dict):
        raise DumpError(files.dump, "must hold a JSON object")
    data = doc.get("data")
    if data is not None and not isinstance(data, dict):
        raise DumpError(files.dump, "must be an object of entries", where="field 'data'")
    for name, record in (data or {}).items():
        if not isinstance(record, dict):
            raise DumpError(files.dump, "must be an object", where=f"entry {name!r}")
    return doc.get("framework"), data or {}


def find_overflow(step_dir: str | Path) -> OverflowResult:
    """Search one step folder; the result's ``anomalies`` is empty when no call overflowed."""
    ranks = rank_folders(Path(step_dir))
    search = _Search()
    for index, files in enumerate(ranks):
        framework, data = _dump_data(files)
        if index == 0 and framework != "pytorch":
            raise DumpError(
                files.dump, f"framework is {framework!r}: overflow-check reads PyTorch dumps only"
            )
        search.scan(files.rank, data)  # one rank's entries in memory at a time: the search keeps few
    return OverflowResult(ranks, search.run())


class _Search:
    """The three phases over what one pass per rank keeps: the first anomaly before its first collective,
    its collectives, and the anomalous calls between and after them (never the whole dump)."""

    def __init__(self) -> None:
        self.before: list[Call] = []
        self.after: dict[int, list[Call]] = {}
        self.chains: dict[int, dict[str, Collective]] = {}

    def scan(self, rank: int, data: Mapping[str, Any]) -> None:
        first = self._before(rank, data)
        self.chains[rank] = self._chain(rank, data, first) if first is not None else {}

    def run(self) -> list[Anomaly]:
        if self.before:
            return [Anomaly(call, BEFORE) for call in self.before]
        found = self._at()
        if found:
            return [Anomaly(call, AT_COLLECTIVE if is_collective(call.name) else BETWEEN) for call in found]
        return [Anomaly(calls[0], AFTER) for calls in self.after.values() if calls]

    def _before(self, rank: int, data: Mapping[str, Any]) -> str | None:
        """Record the rank's first anomaly before its first collective; that collective's name, if reached."""
        if not data:
            logger.warning("rank %d has no dump data", rank)
            return None
        for name, record in data.items():
            if is_collective(name):
                return name
            call = Call(name, rank, record)
            if call.is_anomaly():
                self.before.append(call)
                return None
        return None

    def _at(self) -> list[Call]:
        self._join()
        self._prune()
        return self._first()

    def _chain(self, rank: int, data: Mapping[str, Any], first: str) -> dict[str, Collective]:
        nodes: dict[str, Collective] = {}
        last: Collective | None = None
        compute: list[Call] = []
        sub_layer = 0
        started = False
        for name, record in data.items():
            started = started or name == first
            if not started:
                continue
            if is_collective(name):
                node = Collective(f"{rank}.{name}", Call(name, rank, record, sub_layer), compute)
                if last is not None:
                    last.add_next(node)
                nodes[node.node_id] = node
                last, compute, sub_layer = node, [], 0
            elif not is_ignored(name):
                call = Call(name, rank, record, sub_layer)
                if call.is_anomaly():
                    compute.append(call)
                sub_layer += 1
        if compute:
            self.after[rank] = compute
        return nodes

    def _join(self) -> None:
        index: dict[str, dict[int, dict[str, Collective]]] = {}
        for rank, nodes in self.chains.items():
            for node in nodes.values():
                index.setdefault(node.api, {}).setdefault(rank, {})[node.call_count] = node
        searched: set[int] = set()
        for rank, nodes in list(self.chains.items())[:-1]:
            searched.add(rank)
            seen: set[str] = set()
            for node in nodes.values():
                peers = node.peers()
                if not peers["ranks"]:
                    peers["ranks"] = list(self.chains)
                if not self._connect(node, peers, searched, seen, index):
                    logger.info("no collective on another rank joins %s", node.node_id)

    @staticmethod
    def _connect(node: Collective, peers: dict[str, Any], searched: set[int], seen: set[str],
                 index: dict[str, dict[int, dict[str, Collective]]]) -> bool:  # fmt: skip
        found = node.connected
        by_rank = index.get(peers["api"], {})
        for peer_rank in peers["ranks"]:
            if peer_rank in searched or peer_rank not in by_rank:
                continue
            for other in by_rank[peer_rank].values():
                if other.node_id in seen or other.kind != peers["kind"]:
                    continue
                other_ranks = other.peers()["ranks"]
                if (not other_ranks and other.api not in DIRECTED) or node.rank in other_ranks:
                    seen.add(other.node_id)
                    if other.kind == DST:
                        node.add_dst(other)
                    elif other.kind == SRC:
                        other.layer = node.layer
                        other.add_dst(node)
                    else:
                        node.add_link(other)
                    found = True
                    break
        return found

    def _prune(self) -> None:
        for nodes in self.chains.values():
            for node_id in list(nodes):
                node = nodes[node_id]
                if not node.overflows() and not node.compute:
                    node.delete()
                    del nodes[node_id]

    def _node(self, node_id: str) -> Collective | None:
        rank, _, _ = node_id.partition(".")
        return self.chains.get(int(rank), {}).get(node_id)

    def _members(self, node: Collective) -> set[str]:
        ids = node.relatives()
        queue = [i for n_id in sorted(ids, key=self._order) for i in self._relatives(n_id) - ids]
        while queue:
            new = queue.pop(0)
            ids.add(new)
            queue.extend(sorted(self._relatives(new) - ids, key=self._order))
        return ids

    def _relatives(self, node_id: str) -> set[str]:
        node = self._node(node_id)
        return node.relatives() if node is not None else set()

    def _order(self, node_id: str) -> tuple[int, int]:
        """Rank, then the collective's place in its rank's dump: the order Parity takes a group in."""
        rank, _, name = node_id.partition(".")
        chain = list(self.chains.get(int(rank), {}))
        return int(rank), chain.index(node_id) if node_id in chain else len(chain)

    def _first(self) -> list[Call]:
        queues = [sorted(nodes.values(), key=lambda n: n.layer) for nodes in self.chains.values()]
        seen: set[str] = set()

        def next_node(queue: list[Collective]) -> Collective | None:
            while queue:
                node = queue.pop(0)
                if node.node_id not in seen:
                    return node
            return None

        while any(queues):
            groups: list[set[str]] = []
            grouped: set[str] = set()
            for queue in queues:
                node = next_node(queue)
                if node is None:
                    continue
                # msprobe's rule, kept as it is: a rank's next collective starts a group only when it is the
                # first taken this round or already belongs to one
                if not groups or node.node_id in grouped:
                    members = self._members(node)
                    groups.append(members)
                    grouped.update(members)
            found: list[Call] = []
            for members in groups:
                seen.update(members)
                nodes = [
                    n for n in (self._node(i) for i in sorted(members, key=self._order)) if n is not None
                ]
                found.extend(_group_anomalies(nodes))
            if found:
                return [min(found, key=lambda call: (call.layer, call.sub_layer))]
        return []


def _group_anomalies(nodes: list[Collective]) -> list[Call]:
    """msprobe's ``analyze_anomaly_in_group``: the compute calls before a src/link collective fed NaN/Inf,
    then the collectives that made NaN/Inf from finite inputs."""
    found: list[Call] = []
    for node in nodes:
        if node.kind in (SRC, LINK) and node.inputs_overflow():
            for call in node.compute:
                call.layer = node.layer
                found.append(call)
    for node in nodes:
        if node.call.is_anomaly():
            node.call.layer = node.layer
            found.append(node.call)
    return found


def _construct_chain(construct: Mapping[str, Any], name: str) -> list[str]:
    """The call and the modules around it, outermost first (msprobe's ``find_complete_construct``)."""
    chain = [name]
    seen = set(name)  # msprobe seeds this with the name's characters; kept so both tools give one chain
    while True:
        parent = construct.get(name)
        if isinstance(parent, list):
            parent = parent[0] if parent else None
        if not parent or not isinstance(parent, str) or parent in seen:
            return chain
        chain.insert(0, parent)
        seen.add(parent)
        name = parent


def _stack_of(stack: Mapping[str, Any], name: str, path: Path) -> Any:
    for key, item in stack.items():
        if not isinstance(item, list):
            raise DumpError(path, f"must be a list, got {type(item).__name__}", where=f"entry {key!r}")
        if len(item) >= 2 and isinstance(item[0], (list, str)) and name in item[0]:
            return item[1]
    return {}


def call_info(call: Call, folder: Path) -> dict[str, Any]:
    """One call as msprobe's ``anomaly_analyze`` file lists it."""
    construct = read_json(folder / CONSTRUCT_JSON, "construct.json")
    stack = read_json(folder / STACK_JSON, "stack.json")
    for path, doc in ((folder / CONSTRUCT_JSON, construct), (folder / STACK_JSON, stack)):
        if not isinstance(doc, dict):
            raise DumpError(path, "must hold a JSON object")
    if "forward" in call.name:
        data_info = {"input_args": call.part("input_args", []), "input_kwargs": call.part("input_kwargs", {}),
                     "output": call.part("output", {})}  # fmt: skip
    else:
        data_info = {"input": call.part("input", []), "output": call.part("output", {})}
    chain = _construct_chain(construct, call.name)
    return {"op_name": call.name, "data_info": data_info, "construct_info": chain,
            "stack_info": _stack_of(stack, call.name, folder / STACK_JSON)}  # fmt: skip


def anomaly_document(result: OverflowResult) -> dict[str, list[dict[str, Any]]]:
    folders = {files.rank: files.folder for files in result.ranks}
    doc: dict[str, list[dict[str, Any]]] = {}
    for anomaly in result.anomalies:
        doc.setdefault(f"rank_{anomaly.call.rank}", []).append(
            call_info(anomaly.call, folders[anomaly.call.rank])
        )
    return doc


def write_anomaly_analyze(result: OverflowResult, out_dir: Path) -> Path:
    """Write ``anomaly_analyze_{time_ns}.json`` into ``out_dir`` (created), as msprobe 26 writes it."""
    path = Path(out_dir) / f"anomaly_analyze_{time.time_ns()}.json"
    write_text_atomically(path, json.dumps(anomaly_document(result), indent=2))
    return path
