"""From a dump's leaves to the two row lists the engine pairs (compare.md §2).

The reader already produced one leaf per tensor/argument in msprobe's row order; here each leaf gets its row
name (the recursion name, or in tensor mode the ``data_name`` minus its extension) and the dump entry it
belongs to. The lists are parallel, not objects per row, because the engine touches ~120k of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parity.shared.dump.columns import DumpColumns, Leaf
from parity.shared.dump.reader import Dump

#: the Data_name cell of a leaf that has no tensor file (msprobe's marker)
NO_DATA_FILE = "-1"


@dataclass(slots=True)
class SideRows:
    """The rows of one side (NPU or bench), in dump order: ``names[i]`` is the row name of leaf ``i`` of
    ``columns`` and ``apis[i]`` its dump entry."""

    names: list[str] = field(default_factory=list)
    apis: list[str] = field(default_factory=list)
    columns: DumpColumns = field(default_factory=DumpColumns)

    def __len__(self) -> int:
        return len(self.names)

    @property
    def leaves(self) -> list[Leaf]:
        """Every row as a ``Leaf`` object (built on each call: the row-at-a-time modes want them)."""
        leaf = self.columns.leaf
        return [leaf(i) for i in range(len(self.names))]


def data_file(leaf: Leaf) -> str:
    """The Data_name cell: the tensor file name, or ``'-1'`` when the leaf has none."""
    return leaf.data_name or NO_DATA_FILE


def side_rows(dump: Dump, *, tensor_mode: bool) -> SideRows:
    """One row per leaf, APIs in dump order, inputs → parameters → outputs inside each (the reader's order).

    In tensor mode a row is named after its tensor file (``Functional.linear.0.forward.input.0.pt`` →
    ``Functional.linear.0.forward.input.0``), as msprobe does; leaves without a file keep the recursion name.
    Strings that start with ``+ - = % @`` are kept as they are: msprobe aborts on them, the report writer
    escapes them instead.
    """
    cols = dump.columns
    names = cols.names
    if tensor_mode:
        names = [_tensor_row_name(name, data_name)
                 for name, data_name in zip(names, cols.data_names, strict=True)]  # fmt: skip
    return SideRows(names, cols.apis, cols)


def _tensor_row_name(name: str, data_name: str | None) -> str:
    if not data_name:
        return name
    dot = data_name.rfind(".")
    return data_name[:dot] if dot > 0 else data_name
