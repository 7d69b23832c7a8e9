"""From a dump's leaves to the two row lists the engine pairs (compare.md §2).

The reader already produced one leaf per tensor/argument in msprobe's row order; here each leaf gets its row
name (the recursion name, or in tensor mode the ``data_name`` minus its extension) and the dump entry it
belongs to. The lists are parallel, not objects per row, because the engine touches ~120k of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parity.shared.dump.reader import Dump, Leaf

#: the Data_name cell of a leaf that has no tensor file (msprobe's marker)
NO_DATA_FILE = "-1"


@dataclass(slots=True)
class SideRows:
    """The rows of one side (NPU or bench), in dump order: ``names[i]`` is the row of ``leaves[i]``."""

    names: list[str] = field(default_factory=list)
    leaves: list[Leaf] = field(default_factory=list)
    apis: list[str] = field(default_factory=list)  # the dump entry of each row

    def __len__(self) -> int:
        return len(self.names)


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
    rows = SideRows()
    names, leaves, apis = rows.names, rows.leaves, rows.apis
    for entry in dump.entries:
        entry_leaves = entry.leaves
        leaves.extend(entry_leaves)
        apis.extend([entry.name] * len(entry_leaves))
        if tensor_mode:
            names.extend([_tensor_row_name(leaf) for leaf in entry_leaves])
        else:
            names.extend([leaf.name for leaf in entry_leaves])
    return rows


def _tensor_row_name(leaf: Leaf) -> str:
    data_name = leaf.data_name
    if not data_name:
        return leaf.name
    dot = data_name.rfind(".")
    return data_name[:dot] if dot > 0 else data_name
