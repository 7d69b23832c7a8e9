"""One whole compare run, from a checked compare.json to the files on disk: what the CLI and the server's
workers both call.

Files, with ``{ts}`` the local start time as ``YYYYmmddHHMMSS`` (msprobe's names, compare.md §8.2):

* single rank: ``compare_result_{ts}.xlsx``, ``advisor_{ts}.txt`` (unless the advisor is off, ``-c``);
* step directories: ``compare_result_rank{N}_{ts}.xlsx`` and ``advisor_rank{N}_{ts}.txt`` per paired rank;
* always ``compare_summary_{ts}.json``, listing the files and, for step directories, the ranks found on one
  side only.

Each file is written under a temporary name and renamed into place, so the output directory never holds half
a report; a same-named file from an earlier run is replaced. The summary is written last: once it is there,
every file it names is complete.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parity.shared.compare.headers import CompareMode
from parity.shared.compare.localization import RankDivergence, first_diverged_rank
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import CompareResult, Suspect
from parity.shared.compare.spec import CompareSpec
from parity.shared.errors import CompareInputError
from parity.shared.report.advisor import write_advisor
from parity.shared.report.summary import multi_rank_summary, single_rank_summary, write_summary
from parity.shared.report.xlsx import write_xlsx

logger = logging.getLogger(__name__)

#: ``progress(done, total)``: called by the engine as rows (or bytes) are compared.
ProgressCallback = Callable[[int, int], None]

_ROW_LOG_COLUMNS = ("Cosine", "MaxAbsErr", "MaxRelativeErr", "Accuracy Reached or Not", "Err_message")


@dataclass(slots=True)
class CompareOutputs:
    """What a run produced: every result (one per rank) and every file written, in writing order."""

    out_dir: Path
    timestamp: str
    results: list[CompareResult]
    xlsx: list[Path] = field(default_factory=list)
    advisors: list[Path] = field(default_factory=list)
    summary: Path | None = None
    npu_only_ranks: list[int | None] = field(default_factory=list)
    bench_only_ranks: list[int | None] = field(default_factory=list)
    skipped_ranks: list[int | None] = field(default_factory=list)  # on both sides, but a dump.json is missing
    first_diverged: RankDivergence | None = None  # multi-rank: the rank whose precision went first

    @property
    def files(self) -> list[Path]:
        """Every file written: the reports, then the advisor files, then the summary."""
        return [*self.xlsx, *self.advisors, *([self.summary] if self.summary else [])]

    def top_suspects(self, limit: int = 5) -> list[tuple[int | None, Suspect]]:
        """The first ``limit`` suspects of every rank, as ``(rank, suspect)``, ranks in order."""
        return [(result.rank, suspect) for result in self.results for suspect in result.suspects[:limit]]


def run_compare(
    spec: CompareSpec,
    out_dir: Path,
    options: CompareOptions,
    progress: ProgressCallback | None = None,
    *,
    advisor: bool = True,
    highlight: bool = True,
    timestamp: str | None = None,
) -> CompareOutputs:
    """Compare what ``spec`` names and write the reports into ``out_dir`` (created when missing).

    ``advisor=False`` is ``-c`` (no advisor file); ``timestamp`` overrides the ``{ts}`` of the file names.
    Raises ``CompareInputError``/``DumpError`` for bad inputs, ``ReportError`` when a file cannot be written.
    """
    from parity.shared.compare import engine  # imported here: the engine pulls in numba, the spec need not

    out_dir = _prepare_out_dir(Path(out_dir))
    ts = timestamp or time.strftime("%Y%m%d%H%M%S", time.localtime())
    outputs = CompareOutputs(out_dir=out_dir, timestamp=ts, results=[])
    started = time.perf_counter()
    if spec.multi_rank:
        ranks = engine.compare_ranks(spec.npu_path, spec.bench_path, options, progress=progress)
        outputs.results = list(ranks.results)
        # The engine logs the one-sided and skipped ranks; they are kept here for the summary and the CLI.
        outputs.npu_only_ranks = sorted(ranks.npu_only_ranks, key=_rank_order)
        outputs.bench_only_ranks = sorted(ranks.bench_only_ranks, key=_rank_order)
        outputs.skipped_ranks = sorted(getattr(ranks, "skipped_ranks", []), key=_rank_order)
        outputs.first_diverged = first_diverged_rank({r.rank: r.first_divergence for r in outputs.results})
        if outputs.first_diverged is not None:
            d = outputs.first_diverged
            logger.info("rank %s diverged first: %s, after %d collectives", d.rank, d.api,
                        d.collectives_before)  # fmt: skip
    else:
        result = engine.compare_dumps(
            spec.npu_path, spec.bench_path, options, stack_path=spec.stack_path, progress=progress
        )
        outputs.results = [result]
    logger.info(
        "compared %d rows in %.2f s", sum(len(r.rows) for r in outputs.results), time.perf_counter() - started
    )

    per_rank_files: list[dict[str, str | None]] = []
    for result in outputs.results:
        if spec.is_print_compare_log:
            _log_rows(result)
        suffix = f"_rank{'' if result.rank is None else result.rank}" if spec.multi_rank else ""
        xlsx_path = out_dir / f"compare_result{suffix}_{ts}.xlsx"
        write_xlsx(result, xlsx_path, highlight=highlight)
        outputs.xlsx.append(xlsx_path)
        files: dict[str, str | None] = {"xlsx": xlsx_path.name, "advisor": None}
        if advisor:
            advisor_path = write_advisor(result, out_dir / f"advisor{suffix}_{ts}.txt")
            outputs.advisors.append(advisor_path)
            files["advisor"] = advisor_path.name
        per_rank_files.append(files)

    summary: dict[str, Any]
    if spec.multi_rank:
        summary = multi_rank_summary(
            list(zip(outputs.results, per_rank_files, strict=True)),
            npu_only_ranks=outputs.npu_only_ranks,
            bench_only_ranks=outputs.bench_only_ranks,
            skipped_ranks=outputs.skipped_ranks,
            first_diverged=outputs.first_diverged.as_dict() if outputs.first_diverged else None,
            npu_path=str(spec.npu_path),
            bench_path=str(spec.bench_path),
        )
    else:
        summary = single_rank_summary(outputs.results[0], per_rank_files[0])
    summary["timestamp"] = ts
    outputs.summary = write_summary(summary, out_dir / f"compare_summary_{ts}.json")
    return outputs


def _rank_order(rank: int | None) -> int:
    return -1 if rank is None else rank  # a bare ``rank`` directory (single process) sorts first


def _prepare_out_dir(out_dir: Path) -> Path:
    if out_dir.exists() and not out_dir.is_dir():
        raise CompareInputError(f"{out_dir}: output path is a file, expected a directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CompareInputError(
            f"{out_dir}: cannot create the output directory: {exc.strerror or exc}"
        ) from None
    return out_dir


def _log_rows(result: CompareResult) -> None:
    """msprobe's per-row INFO log (``is_print_compare_log``), tensor mode only; cheap when INFO is off."""
    if result.mode is not CompareMode.TENSOR or not logger.isEnabledFor(logging.INFO):
        return
    header = result.header
    name_col = header.index("NPU Name")
    cols = [(name, header.index(name)) for name in _ROW_LOG_COLUMNS if name in header]
    for row in result.rows:
        details = ", ".join(f"{name}: {row.cells[i]}" for name, i in cols if row.cells[i] not in (None, ""))
        logger.info("[%s] %s", row.cells[name_col], details)
