"""The leaves of one dump.json held column-wise: what the reader produces and the compare engine consumes.

A statistics compare touches ~60k leaves a side. Held as objects they cost a Python object each to build,
to ship between processes and to free; held as columns (one list per field, the four statistics in one
float64 buffer) they are built by appends, cross a pipe as a few ``marshal`` blobs, and feed NumPy directly.
``leaf(i)`` and ``entries()`` give the object view where a caller wants one row at a time (tensor and md5
modes, tests).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import sub
from typing import Any

import numpy as np

STATE_INPUT = "input"
STATE_PARAMETERS = "parameters"
STATE_OUTPUT = "output"
STATE_PARAMETERS_GRAD = "parameters_grad"

#: the statistics slot of a leaf whose four statistics are not all floats (its real values are in ``odd``)
NAN4 = (float("nan"),) * 4


class Leaf:
    """One leaf of one dump entry: the raw material of one compare row (compare.md §2).

    ``name`` is the recursion name (``Functional.linear.0.forward.input.0``); the tensor-mode row name comes
    from ``data_name`` instead (see ``parity.shared.compare.rows``). Statistics are kept as dumped (float,
    int, bool, str or None); ``shape`` is already the string msprobe shows (``[2, 4]``) and ``requires_grad``
    the string ``"True"``/``"False"`` or None.
    """

    __slots__ = ("name", "state", "dtype", "shape", "requires_grad", "max", "min", "mean", "norm", "md5",
                 "data_name", "is_tensor", "p2p")  # fmt: skip

    def __init__(
        self,
        name: str,
        state: str,
        dtype: str | None,
        shape: str | None,
        requires_grad: str | None,
        stats: tuple[Any, Any, Any, Any],
        md5: str | None,
        data_name: str | None,
        is_tensor: bool,
        p2p: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.state = state
        self.dtype = dtype
        self.shape = shape
        self.requires_grad = requires_grad
        self.max, self.min, self.mean, self.norm = stats
        self.md5 = md5
        self.data_name = data_name
        self.is_tensor = is_tensor
        self.p2p = p2p

    def __repr__(self) -> str:
        return f"Leaf({self.name!r}, dtype={self.dtype!r}, shape={self.shape!r})"


@dataclass(slots=True)
class DumpEntry:
    """One API or module call of the dump (``Functional.linear.0.forward``) and its leaves in row order."""

    name: str
    leaves: list[Leaf]


@dataclass(slots=True)
class DumpColumns:
    """Every leaf of a dump in row order (compare.md §2): row ``i`` is ``names[i]``, ``dtypes[i]``, ...

    ``stats`` holds Max, Min, Mean, Norm of row ``i`` at ``4*i .. 4*i+3`` when all four are floats (NaN and
    infinities included), and ``plain[i]`` is 1; otherwise ``plain[i]`` is 0, the slot holds NaNs and
    ``odd[i]`` the four values as dumped (int, bool, str, None). ``entry_names`` lists the entries in file
    order, empty ones included; ``entry_of[i]`` is the position of row ``i``'s entry there, ``apis[i]`` its
    name. ``shapes`` are msprobe's cells (``"[2, 4]"``); ``dims`` maps each tensor shape's cell to the
    dimensions it was made from (the reader formats each distinct shape once and keeps both), so no one
    parses a cell back; ``arg_types`` holds the dump's ``type`` of each non-tensor leaf (``torch.dtype``,
    ``str``, ``int``), by row.
    """

    entry_names: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    apis: list[str] = field(default_factory=list)
    entry_of: array = field(default_factory=lambda: array("i"))  # type: ignore[type-arg]
    states: list[str] = field(default_factory=list)
    dtypes: list[str | None] = field(default_factory=list)
    shapes: list[str | None] = field(default_factory=list)
    requires_grads: list[str | None] = field(default_factory=list)
    stats: array = field(default_factory=lambda: array("d"))  # type: ignore[type-arg]
    plain: bytearray = field(default_factory=bytearray)
    odd: dict[int, tuple[Any, Any, Any, Any]] = field(default_factory=dict)
    md5s: list[str | None] = field(default_factory=list)
    data_names: list[str | None] = field(default_factory=list)
    is_tensor: bytearray = field(default_factory=bytearray)
    p2p: dict[int, dict[str, Any]] = field(default_factory=dict)
    dims: dict[str, tuple[int, ...]] = field(default_factory=dict)
    arg_types: dict[int, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.names)

    def dims_of(self, i: int) -> tuple[int, ...] | None:
        """Row ``i``'s tensor dimensions; None for a non-tensor leaf (or a shape that is no list of ints)."""
        shape = self.shapes[i]
        return self.dims.get(shape) if shape is not None and self.is_tensor[i] else None

    def stats_of(self, i: int) -> tuple[Any, Any, Any, Any]:
        """Row ``i``'s Max, Min, Mean, Norm as dumped."""
        if self.plain[i]:
            s = self.stats
            k = 4 * i
            return s[k], s[k + 1], s[k + 2], s[k + 3]
        return self.odd[i]

    def leaf(self, i: int) -> Leaf:
        """Row ``i`` as one object."""
        return Leaf(self.names[i], self.states[i], self.dtypes[i], self.shapes[i], self.requires_grads[i],
                    self.stats_of(i), self.md5s[i], self.data_names[i], bool(self.is_tensor[i]),
                    self.p2p.get(i))  # fmt: skip

    def entries(self) -> list[DumpEntry]:
        """The object view: every entry in file order with its leaves (entries without leaves included)."""
        out = [DumpEntry(name, []) for name in self.entry_names]
        for i, k in enumerate(self.entry_of):
            out[k].leaves.append(self.leaf(i))
        return out

    def to_wire(self) -> tuple[Any, ...]:
        """The columns as plain values ``marshal`` can carry (see ``from_wire``)."""
        return tuple(self.iter_wire())

    def iter_wire(self) -> Iterator[Any]:
        """``to_wire()``'s values one at a time, each made as it is asked for: a writer that sends them one by
        one never holds the copies of the buffers (``stats`` is 8 bytes a row) all at once."""
        yield from (self.entry_names, self.names, self.apis)
        yield self.entry_of.tobytes()
        yield from (self.states, self.dtypes, self.shapes, self.requires_grads)
        yield self.stats.tobytes()
        yield bytes(self.plain)
        yield from (self.odd, self.md5s, self.data_names)
        yield bytes(self.is_tensor)
        yield self.p2p
        yield self.dims
        yield self.arg_types

    @classmethod
    def from_wire(cls, wire: tuple[Any, ...]) -> DumpColumns:
        """Rebuild the columns ``to_wire`` produced (in another process)."""
        (entry_names, names, apis, entry_of, states, dtypes, shapes, requires_grads, stats, plain, odd, md5s,
         data_names, is_tensor, p2p, dims, arg_types) = wire  # fmt: skip
        entry_array, stats_array = array("i"), array("d")
        entry_array.frombytes(entry_of)
        stats_array.frombytes(stats)
        return cls(entry_names, names, apis, entry_array, states, dtypes, shapes, requires_grads, stats_array,
                   bytearray(plain), odd, md5s, data_names, bytearray(is_tensor), p2p, dims,
                   arg_types)  # fmt: skip


class ColumnsBuilder:
    """Collects the rows of one dump in order, field by field, and turns them into ``DumpColumns``.

    Each field is appended to its own list as the row is read (measured: a third cheaper than one tuple a
    row transposed at the end); each row's entry is known from where each entry started.
    """

    __slots__ = ("entry_names", "entry_starts", "names", "states", "dtypes", "shapes", "requires_grads",
                 "md5s", "data_names", "is_tensor", "stats", "packed", "plain", "odd", "p2p",
                 "arg_types")  # fmt: skip

    def __init__(self) -> None:
        self.entry_names: list[str] = []
        self.entry_starts = array("q")  # 8 bytes an entry, not an int object and its pointer (36)
        self.names: list[str] = []
        self.states: list[str] = []
        self.dtypes: list[str | None] = []
        self.shapes: list[str | None] = []
        self.requires_grads: list[str | None] = []
        self.md5s: list[str | None] = []
        self.data_names: list[str | None] = []
        self.is_tensor = bytearray()
        self.stats: list[float] = []  # a list extends 5x cheaper than an array does; one copy at the end
        self.packed = array("d")  # the statistics ``pack_stats`` moved out of ``stats`` (8 bytes, not 32)
        self.plain = bytearray()
        self.odd: dict[int, tuple[Any, Any, Any, Any]] = {}
        self.p2p: dict[int, dict[str, Any]] = {}
        self.arg_types: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self.names)

    def add_stats(self, stats: tuple[Any, Any, Any, Any]) -> None:
        """The statistics of the row about to be added (``DumpColumns``: floats in ``stats``, or ``odd``)."""
        a, b, c, d = stats
        if type(a) is float and type(b) is float and type(c) is float and type(d) is float:
            self.stats.extend(stats)
            self.plain.append(1)
        else:
            self.stats.extend(NAN4)
            self.plain.append(0)
            self.odd[len(self.names)] = stats

    def add(self, name: str, state: str, dtype: str | None, shape: str | None, requires_grad: str | None,
            stats: tuple[Any, Any, Any, Any], md5: str | None, data_name: str | None, is_tensor: bool,
            ) -> None:  # fmt: skip
        """Append one row to the current entry (the readers' tensor hot paths inline this)."""
        self.add_stats(stats)
        self.add_fields(name, state, dtype, shape, requires_grad, md5, data_name, is_tensor)

    def add_fields(self, name: str, state: str, dtype: str | None, shape: str | None,
                   requires_grad: str | None, md5: str | None, data_name: str | None, is_tensor: bool,
                   ) -> None:  # fmt: skip
        """Append one row's fields but its statistics (``add_stats`` or the caller has added those)."""
        self.names.append(name)
        self.states.append(state)
        self.dtypes.append(dtype)
        self.shapes.append(shape)
        self.requires_grads.append(requires_grad)
        self.md5s.append(md5)
        self.data_names.append(data_name)
        self.is_tensor.append(is_tensor)

    def pack_stats(self) -> None:
        """Move the statistics gathered so far into a packed buffer, where each takes 8 bytes instead of a
        float object and its pointer (32): a reader that keeps its memory small calls it now and then."""
        self.packed.extend(self.stats)
        self.stats.clear()

    def build(self, shape_text: dict[tuple[Any, ...], str] | None = None) -> DumpColumns:
        """The columns; each row's entry (``entry_of``, ``apis``) spread from where each entry started, in C
        (``repeat`` runs and one bytes copy) rather than a Python step per entry. ``shape_text`` is the
        reader's cache of each distinct shape and its cell: turned round, it is ``DumpColumns.dims``."""
        n = len(self.names)
        starts = self.entry_starts
        counts = list(map(sub, [*starts[1:], n], starts))
        entry_of = array("i")
        if n:
            entry_of.frombytes(np.repeat(np.arange(len(starts), dtype=np.intc), counts).tobytes())
        return DumpColumns(
            entry_names=self.entry_names, names=self.names,
            apis=list(chain.from_iterable(map(repeat, self.entry_names, counts))), entry_of=entry_of,
            states=self.states, dtypes=self.dtypes, shapes=self.shapes, requires_grads=self.requires_grads,
            stats=array("d", self.stats) if not self.packed else self._packed_stats(), plain=self.plain,
            odd=self.odd, md5s=self.md5s,
            data_names=self.data_names, is_tensor=self.is_tensor, p2p=self.p2p,
            dims=_dims_of_texts(shape_text or {}), arg_types=self.arg_types,
        )  # fmt: skip

    def _packed_stats(self) -> array:  # type: ignore[type-arg]
        self.pack_stats()
        return self.packed


def _dims_of_texts(shape_text: dict[tuple[Any, ...], str]) -> dict[str, tuple[int, ...]]:
    """Each shape cell and the dimensions it was formatted from (only shapes that are lists of ints)."""
    return {text: dims for dims, text in shape_text.items()
            if all(type(d) is int and d >= 0 for d in dims)}  # fmt: skip
