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
    from parity.shared.compare.engine import compare_ranks
    from parity.shared.compare.options import CompareOptions
    from parity.shared.report.advisor import write_advisor
    from parity.shared.report.xlsx import write_xlsx

    engine_options = CompareOptions(
        fuzzy_match=bool(options.get("fuzzy_match", False)),
        stack_mode=bool(options.get("stack_mode", False)),
        workers=1,
    )
    ranked = compare_ranks(npu_step_dir, bench_step_dir, engine_options, progress=progress)
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


def write_step_summary(outputs: list[RankOutput], out_dir: Path) -> Path:
    """``out_dir/summary.json``: the summary document ``parity compare`` writes for a step directory (every
    rank's status counts, verdict and suspects), naming each rank's reports by their keys under the
    comparison (``rank0/report.xlsx``), for ``GET /comparisons/{id}/summary.json``."""
    from parity.shared.report.summary import multi_rank_summary, write_summary

    ranks = [(out.result, {"xlsx": f"rank{out.rank}/report.xlsx", "advisor": f"rank{out.rank}/advisor.txt"})
             for out in outputs]  # fmt: skip
    return write_summary(multi_rank_summary(ranks), out_dir / "summary.json")
