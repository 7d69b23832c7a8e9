"""One compare, from a checked compare.json to rows, reports and summary: the one pipeline that the CLI and
the server's workers both call.

It comes in three steps, so that a job backend can spread the middle one over many workers:

1. :func:`plan_compare` (or :func:`plan_ranks` for two step directories) says which rank pairs there are to
   compare and which ranks are found on one side only;
2. :func:`compare_rank` compares one rank pair and writes its xlsx and advisor; it returns the result and
   the rank's summary document (plain JSON values), which is all a later merge needs;
3. :func:`merge_summary` builds the summary document from the ranks' documents.

:func:`run_compare` runs the three in turn in this process, which is what ``parity compare`` does.

Files, with ``{ts}`` the local start time as ``YYYYmmddHHMMSS`` (msprobe's names, compare.md §8.2):

* single rank: ``compare_result_{ts}.xlsx``, ``advisor_{ts}.txt`` (unless the advisor is off, ``-c``);
* step directories: ``compare_result_rank{N}_{ts}.xlsx`` and ``advisor_rank{N}_{ts}.txt`` per paired rank;
* always ``compare_summary_{ts}.json``, listing the files and, for step directories, the ranks found on one
  side only.

In msprobe 26's form (``parity compare -tp -gp``, ``form="csv26"``) the tables are ``.csv`` in 26's columns
(``form="xlsx26"``: ``--xlsx``, the same table as a workbook), and ``-da`` adds ``diff_analyze_{ts}.json``
(:mod:`parity.shared.report.msprobe26`).

Each file is written under a temporary name and renamed into place, so the output directory never holds half
a report; a same-named file from an earlier run is replaced. The summary is written last: once it is there,
every file it names is complete.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from parity.shared.compare.headers import CompareMode
from parity.shared.compare.options import REPLAY_TOP, CompareOptions
from parity.shared.compare.result import CompareResult
from parity.shared.compare.slices import CallSlice, TablePart
from parity.shared.compare.spec import CompareSpec
from parity.shared.dump.layout import find_rank_dirs
from parity.shared.errors import CompareInputError
from parity.shared.replay.compare import StageFiles, dump_replayer
from parity.shared.report.advisor import write_advisor
from parity.shared.report.summary import multi_rank_summary, rank_summary, single_rank_summary, write_summary
from parity.shared.report.xlsx import write_xlsx

if TYPE_CHECKING:
    from parity.shared.dump.reader import Dump
    from parity.shared.replay.sandbox import ReplayBudget, WarmChild
    from parity.shared.tensor_io import TensorLimits

logger = logging.getLogger(__name__)

#: ``progress(done, total)``: called by the engine as rows (or bytes) are compared; ``(0, 0)`` between the
#: phases of a rank reports nothing and only lets the caller stop the compare (by raising).
ProgressCallback = Callable[[int, int], None]
#: which table a compare writes: 8.3.3's xlsx (``-i compare.json``), msprobe 26's CSV or ``--xlsx`` workbook
ReportForm = Literal["xlsx", "csv26", "xlsx26"]
_SUFFIX = {"xlsx": ".xlsx", "csv26": ".csv", "xlsx26": ".xlsx"}

_ROW_LOG_COLUMNS = ("Cosine", "MaxAbsErr", "MaxRelativeErr", "Accuracy Reached or Not", "Err_message")


@dataclass(frozen=True, slots=True)
class RankPair:
    """One unit of compare work: a dump.json on each side (``rank`` None for a single-rank compare).

    ``stack_path`` is an explicit stack.json (compare.json's ``stack_path``); without it a stack.json next to
    the NPU dump.json is used when there is one.
    """

    rank: int | None
    npu_dump: Path
    bench_dump: Path
    stack_path: Path | None = None


@dataclass(frozen=True, slots=True)
class RankPlan:
    """Which ranks of two step directories a compare pairs (``plan_rank_sets``), in rank order."""

    compared: list[int | None]
    npu_only: list[int | None]
    bench_only: list[int | None]
    skipped: list[int | None]  # on both sides, but a dump.json is missing


@dataclass(slots=True)
class ComparePlan:
    """What a compare will do: the rank pairs, and the ranks that cannot be compared (for the summary).

    ``npu_path``/``bench_path`` name the two sides in the summary: the CLI's paths, or on the server each
    run's id and step (``{run id}/step{N}``), never a worker's folder.
    """

    multi_rank: bool
    pairs: list[RankPair]
    npu_path: str
    bench_path: str
    npu_only_ranks: list[int | None] = field(default_factory=list)
    bench_only_ranks: list[int | None] = field(default_factory=list)
    skipped_ranks: list[int | None] = field(default_factory=list)  # on both sides, but a dump.json is missing

    @classmethod
    def of_ranks(cls, ranks: RankPlan, npu_path: str, bench_path: str, pairs: Sequence[RankPair] = ()
                 ) -> ComparePlan:  # fmt: skip
        """A step-directory plan from the rank planner's answer (the server's merge has no pairs to run)."""
        return cls(True, list(pairs), npu_path, bench_path, npu_only_ranks=list(ranks.npu_only),
                   bench_only_ranks=list(ranks.bench_only), skipped_ranks=list(ranks.skipped))  # fmt: skip


@dataclass(slots=True)
class RankReport:
    """One compared rank: its result, the files written for it and its summary document."""

    result: CompareResult
    xlsx: Path
    advisor: Path | None
    summary: dict[str, Any]


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
    skipped_ranks: list[int | None] = field(default_factory=list)
    diff_analyze: Path | None = None  # msprobe 26's ``-da`` file

    @property
    def files(self) -> list[Path]:
        """Every file written: the tables, the advisor files, the ``-da`` file, then the summary."""
        extra = [p for p in (self.diff_analyze, self.summary) if p is not None]
        return [*self.xlsx, *self.advisors, *extra]


def plan_compare(spec: CompareSpec) -> ComparePlan:
    """The rank pairs ``spec`` names: one for two dump.json files, one per common rank of step directories."""
    if spec.multi_rank:
        return plan_ranks(spec.npu_path, spec.bench_path)
    pair = RankPair(None, spec.npu_path, spec.bench_path, spec.stack_path)
    return ComparePlan(False, [pair], str(spec.npu_path), str(spec.bench_path))


def plan_ranks(npu_step_dir: Path, bench_step_dir: Path) -> ComparePlan:
    """Pair ``rankN`` with ``rankN`` of two step directories (by number, not by position).

    Ranks found on one side only are listed in the plan; a rank whose dump.json is missing on a side is
    skipped with a warning (as msprobe).
    """
    npu_dirs = {r.rank: r for r in find_rank_dirs(npu_step_dir)}
    bench_dirs = {r.rank: r for r in find_rank_dirs(bench_step_dir)}
    ranks = plan_rank_sets({rank: d.dump_json.is_file() for rank, d in npu_dirs.items()},
                           {rank: d.dump_json.is_file() for rank, d in bench_dirs.items()},
                           npu_side=str(npu_step_dir), bench_side=str(bench_step_dir))  # fmt: skip
    pairs = [RankPair(rank, npu_dirs[rank].dump_json, bench_dirs[rank].dump_json) for rank in ranks.compared]
    return ComparePlan.of_ranks(ranks, str(npu_step_dir), str(bench_step_dir), pairs)


def plan_rank_sets(
    npu: Mapping[int | None, bool],
    bench: Mapping[int | None, bool],
    *,
    npu_side: str = "the NPU dump",
    bench_side: str = "the bench dump",
) -> RankPlan:
    """The one rank planner of a step-directory compare, the CLI's and the server's: each side's ranks, each
    with whether its dump.json is there, in; which ranks to compare, found on one side only, or skipped out.

    Ranks pair by number. A rank on both sides but without a dump.json on one is skipped (as msprobe). The
    sides' names are for the warnings only.
    """
    plan = RankPlan(
        compared=sorted((r for r in npu if r in bench and npu[r] and bench[r]), key=_rank_order),
        npu_only=sorted((r for r in npu if r not in bench), key=_rank_order),
        bench_only=sorted((r for r in bench if r not in npu), key=_rank_order),
        skipped=sorted((r for r in npu if r in bench and not (npu[r] and bench[r])), key=_rank_order),
    )
    for rank in plan.npu_only:
        logger.warning("rank %s is in %s only", rank, npu_side)
    for rank in plan.bench_only:
        logger.warning("rank %s is in %s only", rank, bench_side)
    for rank in plan.skipped:
        missing = [side for side, ranks in ((npu_side, npu), (bench_side, bench)) if not ranks[rank]]
        logger.warning("skipping rank %s: no dump.json in %s", rank, " and ".join(missing))
    return plan


def compare_rank(
    pair: RankPair,
    options: CompareOptions,
    *,
    xlsx_path: Path,
    advisor_path: Path | None,
    highlight: bool = True,
    log_rows: bool = False,
    progress: ProgressCallback | None = None,
    read_dump: Callable[[Path], Dump] | None = None,
    form: ReportForm = "xlsx",
) -> RankReport:
    """Compare one rank pair and write its table (``form``) and advisor (unless ``advisor_path`` is None).

    The returned ``summary`` names the files by their base names, so a folder of reports can be moved or
    served as it is. ``read_dump`` replaces ``load_dump`` for both sides (see ``engine.compare_dumps``).
    Raises ``CompareInputError``/``DumpError`` for bad inputs, ``ReportError`` when a file cannot be written.
    """
    with _WarmStart(options, read_dump) as warm:
        part = compare_slice(pair, options, None, progress=progress, read_dump=warm.read)
        return finish_rank(pair, [part], xlsx_path=xlsx_path, advisor_path=advisor_path, highlight=highlight,
                           log_rows=log_rows, replay_top=options.replay_top, progress=progress,
                           tensor_limits=options.tensor_limits, replay_budget=options.replay_budget,
                           form=form, warm=warm.child)  # fmt: skip


class _WarmStart:
    """Starts the replay's child process (``sandbox.WarmChild``) as soon as both dumps are read and are
    tensor dumps, so that torch's import runs beside the tensor compare; a statistics or md5 compare, or
    one without the replay or its sandbox, never starts it. The child is killed on exit unless used."""

    def __init__(self, options: CompareOptions, read_dump: Callable[[Path], Dump] | None) -> None:
        self._wanted = options.replay_top > 0 and options.replay_budget is not None
        self._read = read_dump
        self._tasks: list[str] = []
        self.child: WarmChild | None = None

    def read(self, path: Path) -> Dump:
        if self._read is None:
            from parity.shared.dump.reader import load_dump

            self._read = load_dump
        dump = self._read(path)
        self._tasks.append(dump.task)
        if self._wanted and self.child is None and self._tasks == ["tensor", "tensor"]:
            from parity.shared.replay.sandbox import WarmChild

            self.child = WarmChild()
        return dump

    def __enter__(self) -> _WarmStart:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.child is not None:
            self.child.close()


def compare_slice(
    pair: RankPair,
    options: CompareOptions,
    part: CallSlice | None,
    *,
    progress: ProgressCallback | None = None,
    read_dump: Callable[[Path], Dump] | None = None,
) -> TablePart:
    """The rows of one slice of a rank's calls (``None``: all of them), for ``finish_rank`` to join.

    A rank too large for one task is compared as slices on several workers, each storing its part.
    """
    from parity.shared.compare import engine  # imported here: the plan needs none of the engine

    started = time.perf_counter()
    extra = {"read_dump": read_dump} if read_dump is not None else {}
    table = engine.compare_part(pair.npu_dump, pair.bench_dump, options, part=part,
                                stack_path=pair.stack_path, progress=progress, **extra)  # fmt: skip
    first, stop, n = table.calls
    logger.info("rank %s: compared %d rows (calls %d-%d of %d) in %.2f s",
                "-" if pair.rank is None else pair.rank, len(table.rows), first, stop, n,
                time.perf_counter() - started)  # fmt: skip
    return table


def slice_tensor_files(
    pair: RankPair,
    options: CompareOptions,
    part: CallSlice,
    *,
    read_dump: Callable[[Path], Dump] | None = None,
) -> tuple[list[str], list[str]]:
    """The tensor files (NPU, bench: names in each ``dump_tensor_data``) that slice ``part`` reads."""
    from parity.shared.compare import engine

    extra = {"read_dump": read_dump} if read_dump is not None else {}
    return engine.part_tensor_files(pair.npu_dump, pair.bench_dump, options, part, **extra)


def finish_rank(
    pair: RankPair,
    parts: Sequence[TablePart],
    *,
    xlsx_path: Path,
    advisor_path: Path | None,
    highlight: bool = True,
    log_rows: bool = False,
    replay_top: int = REPLAY_TOP,
    stage_files: StageFiles | None = None,
    progress: ProgressCallback | None = None,
    tensor_limits: TensorLimits | None = None,
    replay_budget: ReplayBudget | None = None,
    form: ReportForm = "xlsx",
    warm: WarmChild | None = None,
) -> RankReport:
    """Join the parts of every slice of a rank (in call order) into its result; write its xlsx and advisor.

    The same whatever the slicing: the parts hold the rows as the whole compare builds them, and the
    rank-wide steps (localization, the float64 replay of about ``replay_top`` calls in tensor mode, advice,
    suspects) run here over all of them. ``pair`` names the dumps for the stack.json, the replay and the
    result's paths; ``stage_files`` fetches the replay's tensor files first where a worker holds only its
    slice's; ``replay_budget``: the replays run in a child process under it (None: in this process).
    ``progress`` gets ``(0, 0)`` between those steps (each is seconds for a million rows): a point where a
    caller may stop the compare. In tensor mode the table, which reads the rows alone, is written in a
    thread while the judgement and its replay (a child process, ``warm`` when started ahead) run.
    """
    from parity.shared.compare import engine

    def phase_done() -> None:
        if progress is not None:
            progress(0, 0)

    replayer = (dump_replayer(pair.npu_dump, pair.bench_dump, stage=stage_files, limits=tensor_limits,
                              budget=replay_budget, warm=warm) if replay_top > 0 else None)  # fmt: skip
    stacks = engine.stacks_of(pair.npu_dump, pair.stack_path)
    # imported here: importing the engine starts no pool machinery
    from concurrent.futures import Future, ThreadPoolExecutor

    written: Future[None] | None = None
    with ThreadPoolExecutor(1, thread_name_prefix="parity-table") as pool:
        if replayer is not None and parts and parts[0].mode == CompareMode.TENSOR.value:
            rows = [row for p in parts for row in p.rows]
            table = CompareResult.table_only(CompareMode.TENSOR, parts[0].stack_mode, rows)
            written = pool.submit(write_table, table, xlsx_path, form, highlight=highlight)
        try:
            result = engine.conclude(parts, stacks, replayer=replayer, replay_top=replay_top)
        except BaseException:
            if written is not None and written.exception() is None:
                xlsx_path.unlink(missing_ok=True)  # no table without its rank's judgement
            raise
    result.rank = pair.rank
    result.npu_path, result.bench_path = str(pair.npu_dump), str(pair.bench_dump)
    phase_done()
    if log_rows:
        _log_rows(result)
    if written is None:
        write_table(result, xlsx_path, form, highlight=highlight)
    else:
        written.result()
    phase_done()
    if advisor_path is not None:
        write_advisor(result, advisor_path)
    files = {"xlsx": xlsx_path.name, "advisor": advisor_path.name if advisor_path is not None else None}
    return RankReport(result, xlsx_path, advisor_path, rank_summary(result, files))


def write_table(result: CompareResult, path: Path, form: ReportForm, *, highlight: bool = True) -> None:
    """Write the compare table of one rank in ``form``."""
    if form == "xlsx":
        write_xlsx(result, path, highlight=highlight)
        return
    from parity.shared.report.msprobe26 import write_csv_26, write_xlsx_26

    if form == "csv26":
        write_csv_26(result, path)
    else:
        write_xlsx_26(result, path, highlight=highlight)


def merge_summary(plan: ComparePlan, rank_summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary document of the whole compare, from its ranks' documents (in plan order)."""
    if not plan.multi_rank:
        return single_rank_summary(rank_summaries[0])
    return multi_rank_summary(
        rank_summaries,
        npu_only_ranks=plan.npu_only_ranks,
        bench_only_ranks=plan.bench_only_ranks,
        skipped_ranks=plan.skipped_ranks,
        npu_path=plan.npu_path,
        bench_path=plan.bench_path,
    )


def report_paths(out_dir: Path, rank: int | None, multi_rank: bool, ts: str, form: ReportForm = "xlsx"
                 ) -> tuple[Path, Path]:  # fmt: skip
    """msprobe's file names for one rank's table (8.3.3's xlsx, 26's csv or xlsx) and advisor."""
    suffix = f"_rank{'' if rank is None else rank}" if multi_rank else ""
    return out_dir / f"compare_result{suffix}_{ts}{_SUFFIX[form]}", out_dir / f"advisor{suffix}_{ts}.txt"


def run_compare(
    spec: CompareSpec,
    out_dir: Path,
    options: CompareOptions,
    progress: ProgressCallback | None = None,
    *,
    advisor: bool = True,
    highlight: bool = True,
    timestamp: str | None = None,
    form: ReportForm = "xlsx",
    diff_analyze: bool = False,
) -> CompareOutputs:
    """Compare what ``spec`` names and write the reports into ``out_dir`` (created when missing).

    ``advisor=False`` is ``-c`` (no advisor file); ``timestamp`` overrides the ``{ts}`` of the file names;
    ``form`` is the table's form and ``diff_analyze`` (msprobe 26's ``-da``) adds ``diff_analyze_{ts}.json``.
    For step directories ``progress`` gets ``(ranks done, ranks to compare)``, for one rank the engine's own.
    Raises ``CompareInputError``/``DumpError`` for bad inputs, ``ReportError`` when a file cannot be written.
    """
    out_dir = _prepare_out_dir(Path(out_dir))
    ts = timestamp or time.strftime("%Y%m%d%H%M%S", time.localtime())
    plan = plan_compare(spec)
    outputs = CompareOutputs(
        out_dir=out_dir, timestamp=ts, results=[], npu_only_ranks=list(plan.npu_only_ranks),
        bench_only_ranks=list(plan.bench_only_ranks), skipped_ranks=list(plan.skipped_ranks),
    )  # fmt: skip
    summaries: list[dict[str, Any]] = []
    for done, pair in enumerate(plan.pairs, start=1):
        xlsx_path, advisor_path = report_paths(out_dir, pair.rank, plan.multi_rank, ts, form)
        report = compare_rank(
            pair, options, xlsx_path=xlsx_path, advisor_path=advisor_path if advisor else None,
            highlight=highlight, log_rows=spec.is_print_compare_log,
            progress=None if plan.multi_rank else progress, form=form,
        )  # fmt: skip
        outputs.results.append(report.result)
        outputs.xlsx.append(report.xlsx)
        if report.advisor is not None:
            outputs.advisors.append(report.advisor)
        summaries.append(report.summary)
        if plan.multi_rank and progress is not None:
            progress(done, len(plan.pairs))
    if diff_analyze:
        from parity.shared.report.msprobe26 import write_diff_analyze

        outputs.diff_analyze = write_diff_analyze(outputs.results, out_dir / f"diff_analyze_{ts}.json")
    summary = merge_summary(plan, summaries)
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
