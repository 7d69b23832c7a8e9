"""The advisor file: msprobe v1's three lines, then Parity's ranked list of suspects (compare.md §7.3).

The first three lines are exactly what msprobe writes to ``advisor_{ts}.txt`` (``Line``, ``Suspect Nodes``,
``Expert Advice``, with ``NA`` when every row passed), so scripts that read msprobe's file keep working. What
follows is what msprobe lacks: the first divergence (the earliest call, in execution order, that stands out
and whose effect carries on) and the ranked suspects (calls whose output error stands 2.5x (0.4 decades;
5.6x in statistics mode) or more above what their inputs, their own expected rounding and the run pair's
backgrounds explain), each with its evidence in numbers, its row as Excel numbers it and the innermost frame
in the user's own code. The three lines come from the same judgement (``parity.shared.compare.localization``):
"Suspect Nodes" is the top suspect, and a systematic finding (every matmul-class call differing by TF32's
rounding) is said in the advice, so they never give the all-clear above a suspect.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from parity.shared.replay.text import replay_lines
from parity.shared.report import write_text_atomically

if TYPE_CHECKING:  # the formatter is also the light client's (``parity compare-runs``), which has no msgspec
    from parity.shared.compare.result import CompareResult

logger = logging.getLogger(__name__)

NO_ERROR = "NA"
NO_ERROR_ADVICE = "All data in comparison result meets the accuracy requirements."


def one_line(text: str) -> str:
    """``text`` on one line: the reasons join highlight messages with newlines and stack frames hold one."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def advisor_lines(result: CompareResult) -> list[str]:
    """msprobe's three advisor lines for ``result``; ``Line`` is the Excel row of the row it names."""
    advice = result.advice
    if advice.line is None:
        return [f"Line: {NO_ERROR}", f"Suspect Nodes: {advice.suspect_node or NO_ERROR}",
                f"Expert Advice: {advice.text or NO_ERROR_ADVICE}"]  # fmt: skip
    # The row as Excel numbers it (the header is row 1), the one row number the suspects, the page and the
    # workbook use; msprobe writes its table's 0-based index here (README: "Where Parity differs").
    return [f"Line: {advice.line + 2}", f"Suspect Nodes: {advice.suspect_node or NO_ERROR}",
            f"Expert Advice: {advice.text}"]  # fmt: skip


class RankedSuspect(Protocol):
    """What the formatter reads of a suspect: the engine's ``Suspect`` and the REST contract's
    ``SuspectPublic`` both have it."""

    @property
    def position(self) -> int: ...
    @property
    def api(self) -> str: ...
    @property
    def direction(self) -> str: ...
    @property
    def row_index(self) -> int: ...
    @property
    def reason(self) -> str: ...
    @property
    def stack(self) -> str | None: ...
    @property
    def score(self) -> float: ...
    @property
    def excel_row(self) -> int | None: ...


S = TypeVar("S", bound=RankedSuspect)


def named(suspect: RankedSuspect) -> str:
    """A suspect's name: its call, or for a gap (calls without a partner, judged as one) its two sides."""
    gap = getattr(suspect, "gap", None)
    return f"gap {gap}" if gap else suspect.api


def excel_where(suspect: RankedSuspect) -> str:
    """Where a suspect's row is in its rank's report, as Excel numbers it (the header is row 1)."""
    row = suspect.excel_row if suspect.excel_row is not None else suspect.row_index + 2
    return f"Excel row {row}"


NO_SUSPECT_LINE = ("Top suspects: none (no API call's outputs stand out from what its inputs and the run "
                   "pair's background explain).")


def suspect_lines(
    suspects: Sequence[S],
    first_divergence: S | None,
    *,
    limit: int | None = None,
    where: Callable[[S], str] = excel_where,
    systematic: Sequence[str] = (),
) -> list[str]:
    """The systematic findings (``systematic``, in words), the first divergence, then the ranked suspects,
    one numbered entry each, each with its evidence in numbers, its row as Excel numbers it (``where``: a
    multi-rank list names the rank too), and the innermost frame in the user's code when stack.json has one.
    The one formatter of the advisor file, ``parity compare`` and ``parity compare-runs``."""
    total = len(suspects)
    suspects = suspects if limit is None else suspects[:limit]
    found = [f"Systematic: {text}." for text in systematic]
    if not suspects:
        return [*found, NO_SUSPECT_LINE]
    lines: list[str] = [*found]
    first = first_divergence
    if first is not None:
        lines.append(f"First divergence: [{first.direction}] {named(first)} ({where(first)})")
        if first.stack:
            lines.append(f"   at {one_line(first.stack)}")
        lines.append("")
    lines.append("Top suspects, by how far they stand above the background (score: decades above):")
    for suspect in suspects:
        reason = one_line(suspect.reason)
        lines.append(f"{suspect.position}. [{suspect.direction}] {named(suspect)} "
                     f"(score {suspect.score:.1f}, {where(suspect)}): {reason}")  # fmt: skip
        if suspect.stack:
            lines.append(f"   at {one_line(suspect.stack)}")
    if total > len(suspects):
        lines.append(f"... and {total - len(suspects)} more (see the advisor file)")
    return lines


def advisor_text(result: CompareResult) -> str:
    """The whole advisor file: msprobe's three lines, a blank line, the suspects."""
    lines = suspect_lines(result.suspects, result.first_divergence)
    replay = replay_lines(result.replay)  # the float64 replay's verdicts (parity.shared.replay)
    return "\n".join([*advisor_lines(result), "", *lines, *([""] + replay if replay else [])]) + "\n"


def write_advisor(result: CompareResult, path: Path) -> Path:
    """Write the advisor file for ``result`` at ``path`` (atomically) and log the three lines, as msprobe."""
    write_text_atomically(Path(path), advisor_text(result))
    rank = f" (rank {result.rank})" if result.rank is not None else ""
    logger.info("The summary of the expert advice is as follows%s:", rank)
    for line in advisor_lines(result):
        logger.info("%s", line)
    return Path(path)
