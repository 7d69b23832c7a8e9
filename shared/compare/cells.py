"""The cells every mode's row starts with, and the diagnostics of a pair (compare.md §2, §3.2, §7).

One place for what a row pair says before any metric: the eight basic columns (names, dtypes, shapes,
requires_grad), the eight dumped statistics, and the messages and status that the pair itself earns (fuzzy
match, dtype mismatch, requires_grad inconsistency, a changed scalar argument). The row-at-a-time builder
(tensor and md5 modes) and the column-wise statistics builder both call it, so a rule lives once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from parity.shared.compare import verdicts as v
from parity.shared.compare.facts import RowFacts
from parity.shared.compare.pairing import FLOAT_FAMILY
from parity.shared.compare.result import Cell, CompareRow, RowStatus
from parity.shared.compare.statistics import stat_cells
from parity.shared.dump.columns import STATE_INPUT, Leaf

NA = "N/A"
#: msprobe's text for a missing dtype, shape or statistic (a ``null`` leaf, an empty tensor's statistics)
NONE_TEXT = "None"
_NA4: list[Cell] = [NA] * 4


def text_or_none(value: str | None) -> str:
    """A dtype or shape cell: ``None`` spelled out, as msprobe writes it."""
    return NONE_TEXT if value is None else value


def requires_grad_cell(value: str | None) -> str:
    """A Requires_grad cell: ``True``/``False`` as dumped, ``N/A`` where the leaf has none (as msprobe)."""
    return NA if value is None else value


def _same_scalar(a: Any, b: Any) -> bool:
    return a == b or (a != a and b != b)  # NaN equals NaN here


class PairFacts:
    """What one NPU row and its bench row (or none) say before metrics: cells, messages, status."""

    __slots__ = ("prefix", "stats", "messages", "status", "compatible", "rg_consistent")

    def __init__(self, name: str, n: Leaf, b_name: str | None, b: Leaf | None, fuzzy: bool) -> None:
        self.messages: list[str] = []
        self.status = RowStatus.PASS
        nd = n.dtype
        n_rg = requires_grad_cell(n.requires_grad)
        if b is None:
            self.prefix: list[Cell] = [name, NA, text_or_none(nd), NA, text_or_none(n.shape), NA, n_rg, NA]
            self.stats = [*stat_cells(n.max, n.min, n.mean, n.norm), *_NA4]
            # msprobe compares the NPU's "True"/"False" with the bench's "N/A": only an NPU "N/A" agrees
            self.rg_consistent = n_rg == NA
            if not self.rg_consistent:
                self.messages.append(v.MSG_REQUIRES_GRAD)
            self.compatible = False
            self.status = RowStatus.UNMATCHED
            return
        bd = b.dtype
        self.rg_consistent = n.requires_grad == b.requires_grad
        self.compatible = nd == bd or (nd in FLOAT_FAMILY and bd in FLOAT_FAMILY)
        msgs = self.messages
        if fuzzy and b_name != name:
            msgs.append(v.MSG_FUZZY)
        if not self.compatible:
            msgs.append(v.MSG_DTYPE_MISMATCH)
            self.status = RowStatus.FAIL
        if not self.rg_consistent:
            msgs.append(v.MSG_REQUIRES_GRAD)
        if (not n.is_tensor and not b.is_tensor and n.state == STATE_INPUT and nd is not None
                and nd.startswith("<class") and not _same_scalar(n.max, b.max)):  # fmt: skip
            msgs.append(v.MSG_SCALAR_MISMATCH)  # v2's "Parameters" rule: a changed scalar argument
            self.status = RowStatus.FAIL
        self.prefix = [name, b_name, text_or_none(nd), text_or_none(bd), text_or_none(n.shape),
                       text_or_none(b.shape), n_rg, requires_grad_cell(b.requires_grad)]  # fmt: skip
        self.stats = [*stat_cells(n.max, n.min, n.mean, n.norm), *stat_cells(b.max, b.min, b.mean, b.norm)]


def stack_cells(apis: Sequence[str], stack_lookup: Mapping[str, list[str]] | None) -> list[Cell]:
    """The NPU_Stack_Info column: an entry's frames on its first row, ``N/A`` on the others (as msprobe)."""
    out: list[Cell] = [NA] * len(apis)
    previous = None
    for i, api in enumerate(apis):
        if api != previous:
            frames = stack_lookup.get(api) if stack_lookup is not None else None
            if frames is not None:
                out[i] = repr(frames)
            previous = api
    return out


class Table:
    """The rows being built, with the per-row facts later passes need but the table does not show."""

    __slots__ = ("rows", "states", "messages", "jobs", "highlight_ranges", "facts")

    def __init__(self) -> None:
        self.rows: list[CompareRow] = []
        self.states: list[str] = []
        self.messages: list[list[str]] = []
        self.jobs: list[tuple[int, Leaf, Leaf]] = []  # tensor mode: (row, npu leaf, bench leaf)
        #: the ``(start, stop)`` row ranges the highlight rules must visit; None: every row
        self.highlight_ranges: list[tuple[int, int]] | None = None
        #: the rows' typed facts (``facts.RowFacts``), in row order; set by the engine once rows are paired
        self.facts: RowFacts | None = None
