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
) -> list[RankOutput]:
    """Compare every rank present in ``npu_step_dir`` (``rank*/dump.json``) with ``bench_step_dir`` and write
    one xlsx and one advisor per rank under ``out_dir``.

    One metric process per job (``workers=1``): the pool already runs ``PARITY_WORKERS`` jobs side by side.
    """
    from parity.shared.compare.job import compare_rank, plan_ranks
    from parity.shared.compare.options import CompareOptions

    engine_options = CompareOptions(
        fuzzy_match=bool(options.get("fuzzy_match", False)),
        stack_mode=bool(options.get("stack_mode", False)),
        workers=1,
    )
    plan = plan_ranks(npu_step_dir, bench_step_dir)
    outputs: list[RankOutput] = []
    for position, pair in enumerate(plan.pairs):
        rank = pair.rank if pair.rank is not None else position
        xlsx = out_dir / f"rank{rank}" / "report.xlsx"
        advisor = out_dir / f"rank{rank}" / "advisor.txt"
        report = compare_rank(pair, engine_options, xlsx_path=xlsx, advisor_path=advisor)
        outputs.append(RankOutput(rank, report.result, xlsx, advisor))
        if progress is not None:
            progress(position + 1, len(plan.pairs))
    if not outputs:
        from parity.shared.errors import CompareInputError

        raise CompareInputError(f"{npu_step_dir.name}: no rank is present in both runs")
    logger.info("compared %d rank(s) of %s", len(outputs), npu_step_dir.name)
    return outputs
