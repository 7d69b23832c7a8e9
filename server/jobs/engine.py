"""The worker's only contact with the compare engine and the report writers in ``parity.shared``.

Kept apart so the runner (claiming, staging, storing) does not change when the engine's surface does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.shared.compare.result import CompareResult

logger = logging.getLogger(__name__)


@dataclass
class RankOutput:
    rank: int
    result: CompareResult
    xlsx: Path
    advisor: Path


def compare_step(
    npu_step_dir: Path,
    bench_step_dir: Path,
    options: Mapping[str, Any],
    out_dir: Path,
    progress: Callable[..., None] | None = None,
    check: Callable[[], None] | None = None,
) -> list[RankOutput]:
    """Compare every rank present in ``npu_step_dir`` (``rank*/dump.json``) with ``bench_step_dir`` and write
    one xlsx and one advisor per rank under ``out_dir``.

    One metric process per job (``workers=1``): the pool already runs ``PARITY_WORKERS`` jobs side by side.
    ``check`` is called between tensor pairs and may raise to stop the job (deleted, out of time).
    """
    from parity.shared.compare.engine import compare_ranks
    from parity.shared.compare.options import CompareOptions
    from parity.shared.report.advisor import write_advisor
    from parity.shared.report.xlsx import write_xlsx

    engine_options = CompareOptions(
        fuzzy_match=bool(options.get("fuzzy_match", False)),
        stack_mode=bool(options.get("stack_mode", False)),
        workers=1,
    )
    unit = (lambda _done, _total: check()) if check is not None else None
    ranked = compare_ranks(
        npu_step_dir, bench_step_dir, engine_options, progress=progress, unit_progress=unit
    )
    outputs: list[RankOutput] = []
    for position, result in enumerate(ranked.results):
        rank = result.rank if result.rank is not None else position
        xlsx = out_dir / f"rank{rank}" / "report.xlsx"
        advisor = out_dir / f"rank{rank}" / "advisor.txt"
        xlsx.parent.mkdir(parents=True, exist_ok=True)
        write_xlsx(result, xlsx)
        write_advisor(result, advisor)
        outputs.append(RankOutput(rank, result, xlsx, advisor))
    if not outputs:
        from parity.shared.errors import CompareInputError

        raise CompareInputError(f"{npu_step_dir.name}: no rank is present in both runs")
    logger.info("compared %d rank(s) of %s", len(outputs), npu_step_dir.name)
    return outputs
