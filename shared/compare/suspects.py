"""Ranked suspects: the localization's verdict (``localization.py``) as the ``Suspect`` records reports show.

Each suspect carries its score (decades above what its inputs and the run pair's noise explain), the
evidence in numbers, the row the advisor points at (0-based, and as Excel numbers it: the header is row 1),
and the innermost stack frame in the user's own code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from parity.shared.compare.localization import CallEvidence, Localization, user_frame
from parity.shared.compare.result import CompareRow, Suspect
from parity.shared.dump.naming import direction_of, forward_of

__all__ = ["MAX_SUSPECTS", "direction_of", "excel_row", "forward_of", "suspects_of"]

MAX_SUSPECTS = 10


def excel_row(row_index: int) -> int:
    """The row number Excel shows for table row ``row_index`` (0-based; the header is row 1)."""
    return row_index + 2


def _suspect(call: CallEvidence, rank: int, rows: Sequence[CompareRow], reason_of: Callable[[int], str],
             stacks: Mapping[str, list[str]] | None, gaps: Mapping[str, str]) -> Suspect:  # fmt: skip
    frames = stacks.get(call.api) or stacks.get(forward_of(call.api)) if stacks else None
    row = call.worst_row if call.worst_row >= 0 else call.first_row
    gap = gaps.get(call.api)
    judged = "calls without a partner, judged as one on the tensors crossing them: " if gap else ""
    return Suspect(
        rank=rank, api=call.api, direction=call.direction or "forward", row_index=row,
        reason=f"{judged}{call.evidence()}. {reason_of(row)}",
        stack=user_frame(frames) or (frames[0] if frames else None),
        score=round(call.rank_score, 3), excel_row=excel_row(row), collectives_before=call.collectives_before,
        gap=gap,
    )  # fmt: skip


def suspects_of(
    localization: Localization,
    rows: Sequence[CompareRow],
    reason_of: Callable[[int], str],
    stacks: Mapping[str, list[str]] | None = None,
    *,
    limit: int = MAX_SUSPECTS,
    gaps: Mapping[str, str] | None = None,
) -> tuple[list[Suspect], Suspect | None]:
    """The ranked suspects (highest score first, at most ``limit``) and the first divergence; ``gaps``:
    the calls that stand for a gap (``alignment``), with the gap's label."""
    gaps = gaps or {}
    ranked = localization.suspects[:limit]
    suspects = [_suspect(c, k, rows, reason_of, stacks, gaps) for k, c in enumerate(ranked, 1)]
    first = localization.first_divergence
    if first is None:
        return suspects, None
    same = next((s for s in suspects if s.api == first.api), None)
    rank = 1 + localization.suspects.index(first)
    return suspects, same or _suspect(first, rank, rows, reason_of, stacks, gaps)
