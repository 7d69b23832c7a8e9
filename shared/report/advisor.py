"""The advisor file: msprobe v1's three lines, then Parity's ranked list of suspects (compare.md §7.3).

The first three lines are exactly what msprobe writes to ``advisor_{ts}.txt`` (``Line``, ``Suspect Nodes``,
``Expert Advice``, with ``NA`` when every row passed), so scripts that read msprobe's file keep working. What
follows is what msprobe lacks: the first divergence (the earliest call, in execution order, that stands out
and whose effect carries on) and the ranked suspects (calls whose output error stands 3.2x (0.5 decades;
5.6x in statistics mode) or more above what their inputs and the run pair's background explain), each with
its evidence in numbers, its row as Excel numbers it and the innermost frame in the user's own code. The
three lines come from the same judgement (``parity.shared.compare.localization``), so they never give the
all-clear above a suspect.
"""

from __future__ import annotations

import logging
from pathlib import Path

from parity.shared.compare.result import CompareResult, Suspect
from parity.shared.report import write_text_atomically

logger = logging.getLogger(__name__)

NO_ERROR = "NA"
NO_ERROR_ADVICE = "All data in comparison result meets the accuracy requirements."


def one_line(text: str) -> str:
    """``text`` on one line: the reasons join highlight messages with newlines and stack frames hold one."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def advisor_lines(result: CompareResult) -> list[str]:
    """msprobe's three advisor lines for ``result``."""
    advice = result.advice
    if advice.line is None:
        return [f"Line: {NO_ERROR}", f"Suspect Nodes: {advice.suspect_node or NO_ERROR}",
                f"Expert Advice: {advice.text or NO_ERROR_ADVICE}"]  # fmt: skip
    return [f"Line: {advice.line}", f"Suspect Nodes: {advice.suspect_node or NO_ERROR}",
            f"Expert Advice: {advice.text}"]  # fmt: skip


def _where(suspect: Suspect) -> str:
    row = suspect.excel_row if suspect.excel_row is not None else suspect.row_index + 2
    return f"Excel row {row}"


def suspect_lines(result: CompareResult, *, limit: int | None = None) -> list[str]:
    """The first divergence, then the ranked suspects, one numbered entry each, each with its evidence in
    numbers, its row as Excel numbers it, and the innermost frame in the user's code when stack.json has
    one."""
    suspects = result.suspects if limit is None else result.suspects[:limit]
    if not suspects:
        return ["Top suspects: none (no API call's outputs stand out from what its inputs and the run pair's "
                "background explain)."]  # fmt: skip
    lines: list[str] = []
    first = result.first_divergence
    if first is not None:
        lines.append(f"First divergence: [{first.direction}] {first.api} ({_where(first)})")
        if first.stack:
            lines.append(f"   at {one_line(first.stack)}")
        lines.append("")
    lines.append("Top suspects, by how far they stand above the background (score: decades above):")
    for suspect in suspects:
        reason = one_line(suspect.reason)
        lines.append(f"{suspect.rank}. [{suspect.direction}] {suspect.api} (score {suspect.score:.1f}, "
                     f"{_where(suspect)}): {reason}")  # fmt: skip
        if suspect.stack:
            lines.append(f"   at {one_line(suspect.stack)}")
    if limit is not None and len(result.suspects) > limit:
        lines.append(f"... and {len(result.suspects) - limit} more (see the advisor file)")
    return lines


def advisor_text(result: CompareResult) -> str:
    """The whole advisor file: msprobe's three lines, a blank line, the suspects."""
    return "\n".join([*advisor_lines(result), "", *suspect_lines(result)]) + "\n"


def write_advisor(result: CompareResult, path: Path) -> Path:
    """Write the advisor file for ``result`` at ``path`` (atomically) and log the three lines, as msprobe."""
    write_text_atomically(Path(path), advisor_text(result))
    rank = f" (rank {result.rank})" if result.rank is not None else ""
    logger.info("The summary of the expert advice is as follows%s:", rank)
    for line in advisor_lines(result):
        logger.info("%s", line)
    return Path(path)
