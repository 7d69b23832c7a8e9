"""Which calls of a dump fed a call and which ones it fed, read from the dump itself.

A dump.json records no tensor identities, but it records each tensor's statistics (dtype, shape, max, min,
mean, norm) at the moment it was passed or returned. The same tensor read twice gives the same numbers bit
for bit (one computation on one device; an xor dump's checksum, where it has no statistics), so an input
whose statistics equal an earlier call's output was, with near certainty, that output: the latest such call
in dump order (the execution order, forward and backward interleaved) produced it. Constant tensors (max ==
min: zeros, ones, masks) are left out, since many calls make them and their statistics say nothing about who
did. Where a call has tensors on a side and none of them matched (an in-place update, a tensor the dump never
saw produced), the call next to it in execution order stands in: the only data flow the dump still has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from parity.shared.dump.columns import STATE_INPUT, STATE_OUTPUT, STATE_PARAMETERS, DumpColumns

__all__ = ["DataFlow"]

#: The keys of an entry that hold what a call read; everything else except ``output`` it wrote. Backward
#: entries read the gradients of their forward's outputs (``input``) and write those of its inputs.
_READ_KEYS = ("input_args", "input_kwargs", "parameters", "input")
_WRITE_KEYS = ("output",)
#: the same split of a dump's parsed rows, by their state
_READ_STATES = frozenset({STATE_INPUT, STATE_PARAMETERS})

_Fingerprint = tuple[Any, ...]


def _fingerprints(value: Any, out: list[_Fingerprint]) -> list[_Fingerprint]:
    """The fingerprint of every non-constant tensor leaf in ``value`` (nested lists and dicts walked)."""
    if isinstance(value, dict):
        if "Max" in value and "shape" in value:
            high, low = value.get("Max"), value.get("Min")
            if isinstance(high, (int, float)) and high != low:
                out.append((value.get("dtype"), tuple(value.get("shape") or ()), high, low,
                            value.get("Mean"), value.get("Norm")))  # fmt: skip
            return out
        if "Max" not in value and isinstance(value.get("md5"), str) and "shape" in value:
            # an xor dump (msprobe 26) has no statistics: its checksum tells the same tensor apart as well;
            # an all-zero tensor's is zero (a constant, left out as above)
            if value["md5"].strip("0x"):
                out.append((value.get("dtype"), tuple(value.get("shape") or ()), value["md5"]))
            return out
        for item in value.values():
            _fingerprints(item, out)
    elif isinstance(value, list):
        for item in value:
            _fingerprints(item, out)
    return out


class DataFlow:
    """Producers and consumers of every call entry of one dump, from its statistics (module docstring)."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        names = [name for name, entry in data.items() if isinstance(entry, dict)]
        self._link(names, [(_fingerprints([data[name].get(k) for k in _READ_KEYS], []),
                            _fingerprints([data[name].get(k) for k in _WRITE_KEYS], [])) for name in names])

    @classmethod
    def from_columns(cls, columns: DumpColumns) -> DataFlow:
        """The same flow from a dump's parsed columns (the server's sidecar), never its dump.json text: the
        fingerprints of each entry's non-constant tensors, read (inputs, parameters) or written (outputs)."""
        flow = cls.__new__(cls)
        sides: list[tuple[list[_Fingerprint], list[_Fingerprint]]] = [([], []) for _ in columns.entry_names]
        for i in range(len(columns)):
            state = columns.states[i]
            if not columns.is_tensor[i] or state not in _READ_STATES and state != STATE_OUTPUT:
                continue
            high, low, mean, norm = columns.stats_of(i)
            if isinstance(high, (int, float)) and high != low:
                reads, writes = sides[columns.entry_of[i]]
                shape = columns.dims_of(i) or ()
                fingerprint = (columns.dtypes[i], shape, high, low, mean, norm)
                (writes if state == STATE_OUTPUT else reads).append(fingerprint)
        flow._link(list(columns.entry_names), sides)
        return flow

    def _link(self, names: list[str], sides: Sequence[tuple[list[_Fingerprint], list[_Fingerprint]]]) -> None:
        """Producers and consumers from each entry's (read, written) fingerprints, in dump order."""
        self.names = names
        self.position = {name: i for i, name in enumerate(self.names)}
        self.producers: list[set[int]] = [set() for _ in self.names]
        self.consumers: list[set[int]] = [set() for _ in self.names]
        last_writer: dict[_Fingerprint, int] = {}
        reads_any: list[bool] = []
        writes_any: list[bool] = []
        for i, (reads, writes) in enumerate(sides):
            for fp in reads:
                j = last_writer.get(fp)
                if j is not None and j != i:
                    self.producers[i].add(j)
                    self.consumers[j].add(i)
            for fp in writes:
                last_writer[fp] = i
            reads_any.append(bool(reads))
            writes_any.append(bool(writes))
        last = len(self.names) - 1
        for i in range(len(self.names)):  # the call-order stand-in where the statistics matched nothing
            if reads_any[i] and not self.producers[i] and i > 0:
                self.producers[i].add(i - 1)
            if writes_any[i] and not self.consumers[i] and i < last:
                self.consumers[i].add(i + 1)

    def neighbours(self, seeds: Iterable[str], hops: int) -> list[str]:
        """The entries within ``hops`` producer or consumer steps of ``seeds`` (seeds not in the dump are
        skipped), the seeds themselves left out, in dump order."""
        start = {self.position[s] for s in seeds if s in self.position}
        seen, frontier = set(start), set(start)
        for _ in range(max(hops, 0)):
            nxt: set[int] = set()
            for i in frontier:
                nxt |= self.producers[i] | self.consumers[i]
            frontier = nxt - seen
            seen |= frontier
        return [self.names[i] for i in sorted(seen - start)]


def order_of(names: Sequence[str], flow: DataFlow | None) -> list[str]:
    """``names`` in dump order where the dump knows them, the others after, in their given order."""
    if flow is None:
        return list(names)
    known = sorted((n for n in names if n in flow.position), key=flow.position.__getitem__)
    return known + [n for n in names if n not in flow.position]
