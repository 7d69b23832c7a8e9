"""What a comparison produces: the table, its verdicts, the suspects and the advice.

This is the contract between the engine (which fills it), the report writers (xlsx, advisor, JSON summary),
the CLI and the server (which stores the rows for its REST API). It holds plain Python values only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import msgspec
from parity.shared.compare.headers import CompareMode, full_header

if TYPE_CHECKING:
    from parity.shared.compare.facts import RowFacts

#: A table cell: msprobe writes numbers as numbers and every sentinel (``N/A``, ``unsupported``, ``Nan``,
#: ``shape unmatched``, ``12.5%``) as a string; ``None`` is an empty cell.
Cell = str | float | int | bool | None


def non_finite_text(value: float) -> str:
    """The one spelling of a NaN or infinite float cell wherever a number cannot hold it (xlsx, JSON):
    ``nan``, ``inf``, ``-inf``. (msprobe's own ``Nan`` text cells are strings and stay as they are.)"""
    return "nan" if value != value else ("inf" if value > 0 else "-inf")


def json_cells(cells: list[Cell]) -> list[Cell]:
    """``cells`` with every NaN or infinite float as its text: JSON (the rows API, the summary) has none."""
    if all(type(c) is not float or c - c == 0.0 for c in cells):  # nan - nan and inf - inf are nan
        return cells
    return [non_finite_text(c) if type(c) is float and c - c != 0.0 else c for c in cells]


class Highlight(str, Enum):
    """Row fill of msprobe v1's ``-hl`` colouring (compare.md §7.2); red wins over yellow."""

    RED = "red"
    YELLOW = "yellow"


class RowStatus(str, Enum):
    """Parity's typed status of a row (the ``Parity Status`` column), richer than msprobe's verdict."""

    PASS = "pass"
    WARNING = "warning"  # highlighted yellow, or a diagnostic that does not fail the row
    FAIL = "fail"  # the verdict failed (Accuracy No / Warning / Different) or highlighted red
    UNMATCHED = "unmatched"  # NPU row with no bench row: never passes
    BENCH_ONLY = "bench-only"  # bench row with no NPU row: reported, not dropped
    UNCOMPARABLE = "uncomparable"  # matched, but no metric could be computed (no file, empty, shape)


#: Rows that count as failing (the summary's failing rows and APIs, the server's ``failing=`` filter).
FAILING_STATUSES = frozenset({RowStatus.FAIL, RowStatus.UNMATCHED})


class CompareRow(msgspec.Struct, gc=False):
    """One leaf of one API or module entry, with its cells in ``CompareResult.header`` order.

    A msgspec struct rather than a dataclass: a compare makes one per row (~60k), and a struct is built in C
    and never tracked by the cyclic collector (it cannot be part of a cycle), so the collection that follows
    a compare has half as many objects to scan.
    """

    cells: list[Cell]
    api: str  # the dump entry the row belongs to, e.g. ``Functional.linear.0.forward``
    status: RowStatus
    highlight: Highlight | None = None


@dataclass(frozen=True, slots=True)
class Suspect:
    """An API (or module) whose inputs agree but whose outputs do not: where precision is first lost."""

    rank: int  # 1 = the first suspect
    api: str
    direction: str  # "forward" or "backward"
    row_index: int  # 0-based index into ``CompareResult.rows`` of the first failing output row
    reason: str
    stack: str | None = None  # the innermost frame in the user's code from stack.json, when one is present
    score: float = 0.0  # decades above what the call's inputs and the run pair's noise explain
    excel_row: int | None = None  # the row as Excel numbers it (``row_index`` + 2: the header is row 1)
    collectives_before: int = 0  # collective calls the rank ran before this one (multi-rank: who went first)
    #: a gap judged as one call (``api``: its target's first call): its two sides, ``target A ~ bench B ...``
    gap: str | None = None

    @property
    def position(self) -> int:
        """Its place in the list (1 = the first suspect): the summary's ``position``, never a process rank."""
        return self.rank


@dataclass(frozen=True, slots=True)
class SystematicFinding:
    """One API class that differs by about the same amount in (nearly) every call, from its first call on
    identical inputs on: the target computes that class another way (TF32, a lower-precision accumulation),
    one finding for the pair rather than a fault of its first call."""

    api_class: str  # "matmul", "norm", "softmax", "reduce", "loss"
    level: float  # the typical normwise relative error of the class's calls
    calls: int  # the class's judged calls
    differing: int  # those that differ beyond their expected rounding
    first: str  # the class's first call: where it shows on identical inputs
    text: str  # the finding in words ("every matmul-class call differs by ~1e-3: TF32 or ...")

    def as_dict(self) -> dict[str, object]:
        return {"api_class": self.api_class, "level": self.level, "calls": self.calls,
                "differing": self.differing, "first": self.first, "text": self.text}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Advice:
    """msprobe's three-line advisor result (compare.md §7.3); ``line`` is None when every row passed."""

    line: int | None
    suspect_node: str | None
    text: str


@dataclass(slots=True)
class CompareResult:
    """The whole comparison of one NPU dump against one bench dump (one rank of one step)."""

    mode: CompareMode
    stack_mode: bool
    rows: list[CompareRow]
    advice: Advice
    suspects: list[Suspect] = field(default_factory=list)  # ranked, highest score first
    first_divergence: Suspect | None = None  # the earliest call that stands out and whose effect carries on
    row_scores: list[float | None] | None = None  # each row's call score (None: identical or not judged)
    rank: int | None = None  # set in multi-rank compares
    npu_path: str | None = None
    bench_path: str | None = None
    #: tensor files a row needed but that were missing or unreadable (each row says so), in row order
    missing_tensor_files: list[str] = field(default_factory=list)
    #: the float64 replay of the top suspects (``parity.shared.replay.compare``): verdicts, or a note why none
    replay: dict[str, object] | None = None
    #: API classes that differ systematically (another kernel or precision on the target), not suspects
    systematic: list[SystematicFinding] = field(default_factory=list)
    #: the rows' typed facts (``facts.RowFacts``), in row order: what the judgement read
    facts: RowFacts | None = None
    #: each row's state (input, output, parameters, ..., ``gap`` for a gap's boundary rows), in row order
    states: list[str] | None = None

    @classmethod
    def table_only(cls, mode: CompareMode, stack_mode: bool, rows: list[CompareRow]) -> CompareResult:
        """The rows alone, before the judgement: all a table writer reads, so the table can be written
        while the judgement (and its float64 replay) still runs."""
        return cls(mode=mode, stack_mode=stack_mode, rows=rows, advice=Advice(None, None, ""))

    @property
    def header(self) -> list[str]:
        """The exact column list of ``rows[i].cells``: msprobe v1's header, then Parity's extras."""
        return full_header(self.mode, stack=self.stack_mode)

    def failing_apis(self) -> list[str]:
        """Entries with at least one failing or unmatched row, in table order, each once."""
        seen: dict[str, None] = {}
        for row in self.rows:
            if row.status in FAILING_STATUSES:
                seen.setdefault(row.api)
        return list(seen)

    def summary(self) -> dict[str, object]:
        """The machine-readable summary written beside the reports and served by the server."""
        counts: dict[str, int] = {status.value: 0 for status in RowStatus}
        for row in self.rows:
            counts[row.status.value] += 1
        return {
            "mode": self.mode.value,
            "rank": self.rank,
            "npu_path": self.npu_path,
            "bench_path": self.bench_path,
            "rows": len(self.rows),
            "status_counts": counts,
            "failing_apis": self.failing_apis(),
            "missing_tensor_files": {
                "count": len(self.missing_tensor_files),
                "first": self.missing_tensor_files[0] if self.missing_tensor_files else None,
            },
            "advice": {
                "line": self.advice.line,
                "suspect_node": self.advice.suspect_node,
                "text": self.advice.text,
            },  # fmt: skip
            "suspects": [suspect_dict(s) for s in self.suspects],
            "first_divergence": suspect_dict(self.first_divergence) if self.first_divergence else None,
            "replay": self.replay,
            "systematic": [f.as_dict() for f in self.systematic],
        }


def suspect_dict(s: Suspect) -> dict[str, object]:
    """A suspect as plain JSON values (the summary file and the server's summary). Its place in the list is
    ``position``: ``rank`` in a summary means a process rank (``ranks[].rank``, ``compare_rank``)."""
    return {
        "position": s.rank, "api": s.api, "direction": s.direction, "row_index": s.row_index,
        "excel_row": s.excel_row, "score": s.score, "reason": s.reason, "stack": s.stack,
        "collectives_before": s.collectives_before, "gap": s.gap,
    }  # fmt: skip


def suspect_from_dict(doc: Mapping[str, Any]) -> Suspect:
    """A suspect from :func:`suspect_dict`'s document, or from one written before ``position`` was named so
    (``rank``); keys it does not know (``compare_rank``) are ignored."""
    known = {f for f in Suspect.__dataclass_fields__ if f != "rank"}
    fields = {k: v for k, v in doc.items() if k in known}
    return Suspect(rank=int(doc.get("position", doc.get("rank", 0))), **fields)
