"""The compare engine: two dumps in, one ``CompareResult`` out (compare.md §1.4-§7).

A pure library: it reads files, computes and returns values; no HTTP, SQL or threads of its own (tensor mode
hands its file pairs to ``parity.shared.metrics.parallel``, on the executor the caller put in the options).
The pipeline is read → rows → pair → cells and verdicts → tensor metrics (tensor mode) → highlight → messages
and status → advice and suspects, each step one pass over plain lists.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from parity.shared.compare import md5 as md5_mode
from parity.shared.compare import statistics as stats_mode
from parity.shared.compare import verdicts as v
from parity.shared.compare.advisor import advise
from parity.shared.compare.cells import PairFacts, Table, stack_cells
from parity.shared.compare.headers import CompareMode, full_header
from parity.shared.compare.highlight import REASONS as HIGHLIGHT_REASONS
from parity.shared.compare.highlight import apply_highlights
from parity.shared.compare.localization import localize
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.pairing import pair_rows
from parity.shared.compare.result import Cell, CompareResult, CompareRow, Highlight, RowStatus
from parity.shared.compare.rows import SideRows, data_file, side_rows
from parity.shared.compare.statistics_table import build_statistics_rows
from parity.shared.compare.suspects import suspects_of
from parity.shared.dump.layout import sibling_stack_json
from parity.shared.dump.reader import Dump, load_dump, load_stack
from parity.shared.errors import CompareInputError

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
NA = "N/A"
_fc = stats_mode.finite_cell
_stat_cells = stats_mode.stat_cells
_STATUS_TEXT = {status: status.value for status in RowStatus}


def detect_mode(npu: Dump, bench: Dump) -> CompareMode:
    """§1.4: equal tasks; ``tensor`` → tensor mode; ``statistics`` → md5 mode if checksums were dumped."""
    if npu.task != bench.task:
        raise CompareInputError(
            f"{npu.path} has task {npu.task!r} but {bench.path} has task {bench.task!r}: "
            "dumps of different tasks cannot be compared"
        )
    if npu.task == "tensor":
        return CompareMode.TENSOR
    if npu.task == "statistics":
        if npu.has_md5 != bench.has_md5:
            with_md5 = npu.path if npu.has_md5 else bench.path
            raise CompareInputError(
                f"{with_md5} carries md5 checksums but the other dump does not: dump both with the same "
                "summary_mode"
            )
        return CompareMode.MD5 if npu.has_md5 else CompareMode.STATISTICS
    raise CompareInputError(
        f"{npu.path}: task {npu.task!r} cannot be compared (expected tensor or statistics)"
    )


def compare_dumps(
    npu_dump_json: Path,
    bench_dump_json: Path,
    options: CompareOptions,
    *,
    stack_path: Path | None = None,
    progress: Progress | None = None,
    read_dump: Callable[[Path], Dump] = load_dump,
) -> CompareResult:
    """Compare one NPU dump.json against one bench dump.json.

    With ``stack_path`` the stack column follows ``options.stack_mode`` (``-s``); without it a stack.json
    next to the NPU dump.json is auto-detected and turns the column on (compare.md §1.1). ``progress`` gets
    ``(done, total)`` in tensor pairs (tensor mode) or rows (other modes, once at the end). ``read_dump``
    reads each side (the server's tasks pass ``dump.sidecar.read_dump``, which takes already parsed columns).
    """
    npu, bench = read_dump(npu_dump_json), read_dump(bench_dump_json)
    mode = detect_mode(npu, bench)
    stacks: dict[str, list[str]] | None
    if stack_path is not None:
        stacks = load_stack(stack_path)
        stack_mode = options.stack_mode
    else:
        found = sibling_stack_json(npu_dump_json)
        stacks = load_stack(found) if found is not None else None
        stack_mode = found is not None
    result = _compare(npu, bench, mode, options, stacks, stack_mode, progress)
    result.npu_path = str(npu_dump_json)
    result.bench_path = str(bench_dump_json)
    return result


# --------------------------------------------------------------------------------------------------------
# the table


def compare_loaded(
    npu: Dump,
    bench: Dump,
    mode: CompareMode,
    options: CompareOptions,
    *,
    stacks: Mapping[str, list[str]] | None = None,
    stack_mode: bool = False,
    progress: Progress | None = None,
) -> CompareResult:
    """Compare two already-read dumps in ``mode`` (see ``compare_dumps``)."""
    return _compare(npu, bench, mode, options, stacks, stack_mode, progress)


def _compare(
    npu: Dump,
    bench: Dump,
    mode: CompareMode,
    options: CompareOptions,
    stacks: Mapping[str, list[str]] | None,
    stack_mode: bool,
    progress: Progress | None,
) -> CompareResult:
    """The pipeline: rows, pairing, cells, tensor metrics, highlights, statuses, advice and suspects."""
    tensor = mode is CompareMode.TENSOR
    header = full_header(mode, stack=stack_mode)
    missing: list[Path] = []
    npu_rows = side_rows(npu, tensor_mode=tensor)
    bench_rows = side_rows(bench, tensor_mode=tensor)
    pairing = pair_rows(npu_rows, bench_rows, fuzzy=options.fuzzy_match)
    stack = stack_cells(npu_rows.apis, stacks) if stack_mode else None
    if mode is CompareMode.STATISTICS:
        table = build_statistics_rows(npu_rows, bench_rows, pairing.bench_index, fuzzy=options.fuzzy_match,
                                      stack=stack)  # fmt: skip
    else:
        table = Table()
        _build_rows(table, mode, npu_rows, bench_rows, pairing.bench_index, options.fuzzy_match, stack)
    _build_bench_only(table, mode, bench_rows, pairing.bench_only, stack_mode)
    if table.highlight_ranges is not None and pairing.bench_only:
        table.highlight_ranges = _with_tail(table.highlight_ranges, npu_rows.apis, len(table.rows))
    paired = len(npu_rows) - pairing.bench_index.count(-1)
    logger.debug("%s mode: %d NPU rows, %d bench rows, %d paired, %d bench-only", mode.value,
                 len(npu_rows), len(bench_rows), paired, len(pairing.bench_only))  # fmt: skip
    if tensor:
        missing = _run_tensor_metrics(table, header, npu, bench, options, progress)
    elif progress is not None:
        progress(len(table.rows), len(table.rows))
    apply_highlights(table.rows, table.states, mode, header, table.messages, table.highlight_ranges)
    _finish_rows(table, header, mode)
    localization = localize(table.rows, table.states, header, mode)
    advice = advise(table.rows, header, mode, localization)
    pos = {name: i for i, name in enumerate(header)}

    def reason_of(i: int) -> str:
        return _reason(table.rows[i], pos, mode)

    suspects, first = suspects_of(localization, table.rows, reason_of, stacks)
    return CompareResult(mode=mode, stack_mode=stack_mode, rows=table.rows, advice=advice, suspects=suspects,
                         first_divergence=first, row_scores=localization.row_scores(len(table.rows)),
                         missing_tensor_files=[str(f) for f in missing])  # fmt: skip


def _build_rows(
    table: Table,
    mode: CompareMode,
    npu_rows: SideRows,
    bench_rows: SideRows,
    bench_index: list[int],
    fuzzy: bool,
    stack: list[Cell] | None,
) -> None:
    """Tensor and md5 modes: one row per NPU leaf, in NPU dump order (statistics mode is column-wise, in
    ``statistics_table``)."""
    rows, states, messages, jobs = table.rows, table.states, table.messages, table.jobs
    b_names, b_leaf = bench_rows.names, bench_rows.columns.leaf
    tensor = mode is CompareMode.TENSOR
    no_npu_file = ""
    if tensor:  # imported here: md5 compares never need the metrics module
        from parity.shared.metrics.tensor import MSG_NO_NPU_FILE

        no_npu_file = MSG_NO_NPU_FILE
    for i, (name, n, api) in enumerate(zip(npu_rows.names, npu_rows.leaves, npu_rows.apis, strict=True)):
        j = bench_index[i]
        b = b_leaf(j) if j >= 0 else None
        facts = PairFacts(name, n, b_names[j] if j >= 0 else None, b, fuzzy)
        msgs, status = facts.messages, facts.status
        if tensor:
            if b is None:
                accuracy = v.NONE  # msprobe 8.3.3's cell for an unmatched row (never Yes)
                # msprobe's words, in its order: "No bench data matched." unless requires_grad disagreed
                # (that message replaces it), then why no metric could be computed.
                if not msgs:
                    msgs.append(stats_mode.NO_BENCH)
                msgs.append(v.MSG_BENCH_UNMATCHED if n.data_name else no_npu_file)
            elif not facts.compatible:
                accuracy = v.NO
            else:
                accuracy = v.NONE  # set once the metrics are in
                jobs.append((i, n, b))
            cells = [*facts.prefix, *_UNSUPPORTED6, *facts.stats, facts.rg_consistent, accuracy, None]
        else:
            md5_result = md5_mode.md5_result(n.md5, b.md5 if b is not None else None, matched=b is not None)
            if md5_result == md5_mode.DIFFERENT:
                status = v.escalate(status, RowStatus.FAIL)
            cells = [*facts.prefix, n.md5 or NA, (b.md5 or NA) if b is not None else NA, facts.rg_consistent,
                     md5_result]  # fmt: skip
        if stack is not None:
            cells.append(stack[i])
        if tensor:
            cells.append(repr([data_file(n), data_file(b) if b is not None else NA]))
        cells += (None, api)  # Parity Status: written by _finish_rows
        rows.append(CompareRow(cells, api, status))
        states.append(n.state)
        messages.append(msgs)


_UNSUPPORTED6 = (v.UNSUPPORTED,) * 6


def _build_bench_only(table: Table, mode: CompareMode, bench_rows: SideRows, bench_only: list[int],
                      stack_mode: bool) -> None:  # fmt: skip
    """Bench rows nobody paired with: reported after the NPU rows with every NPU column ``N/A``."""
    status = RowStatus.BENCH_ONLY
    for j in bench_only:
        b = bench_rows.columns.leaf(j)
        cells: list[Cell] = [NA, bench_rows.names[j], NA, b.dtype, NA, b.shape, NA, b.requires_grad]
        bench_stats = _stat_cells(b.max, b.min, b.mean, b.norm)
        if mode is CompareMode.STATISTICS:
            cells += [NA] * 12
            cells += bench_stats
            cells += (False, NA, None)
        elif mode is CompareMode.TENSOR:
            cells += [NA] * 10
            cells += bench_stats
            cells += (False, NA, None)
        else:
            cells += (NA, b.md5, False, NA)
        if stack_mode:
            cells.append(NA)
        if mode is CompareMode.TENSOR:
            cells.append(repr([NA, data_file(b)]))
        cells += (status.value, bench_rows.apis[j])
        table.rows.append(CompareRow(cells, bench_rows.apis[j], status))
        table.states.append(b.state)
        table.messages.append([v.MSG_NPU_UNMATCHED])


def _with_tail(ranges: list[tuple[int, int]], npu_apis: list[str], total: int) -> list[tuple[int, int]]:
    """Add the bench-only rows to the highlight ranges, with the last NPU entry: a bench-only row of that
    entry follows it directly, and the rules group consecutive rows of one entry."""
    tail = len(npu_apis)
    while tail > 0 and npu_apis[tail - 1] == npu_apis[-1]:
        tail -= 1
    return [r for r in ranges if r[0] < tail] + [(tail, total)]


def _run_tensor_metrics(table: Table, header: list[str], npu: Dump, bench: Dump, options: CompareOptions,
                        progress: Progress | None) -> list[Path]:  # fmt: skip
    """Tensor mode: hand every compatible matched pair to the metric workers, then judge each row.

    Returns the tensor files that were missing or unreadable, in row order (each row also says so).
    """
    missing: list[tuple[int, Path]] = []
    if table.jobs:
        # Imported here: statistics and md5 compares never pay for the tensor readers.
        from parity.shared.metrics.parallel import TensorPairJob, compare_tensor_files

        npu_dir, bench_dir = npu.tensor_dir, bench.tensor_dir
        _check_tensor_dir(npu, "NPU")
        _check_tensor_dir(bench, "bench")
        jobs = [
            TensorPairJob(
                index=i,
                npu_file=npu_dir / n.data_name if n.data_name else None,
                bench_file=bench_dir / b.data_name if b.data_name else None,
            )
            for i, n, b in table.jobs
        ]
        first = header.index("Cosine")
        total = len(jobs)
        results = compare_tensor_files(jobs, executor=options.executor)
        for done, (i, metrics) in enumerate(results, start=1):
            cells = table.rows[i].cells
            cells[first : first + 6] = [
                _fc(metrics.cosine), _fc(metrics.euc_dist), _fc(metrics.max_abs_err),
                _fc(metrics.max_relative_err), _fc(metrics.one_thousandth), _fc(metrics.five_thousandths),
            ]  # fmt: skip
            table.messages[i].extend(metrics.messages)
            if metrics.unread_file is not None:  # results come in any order: sorted by row below
                missing.append((i, Path(metrics.unread_file)))
            if progress is not None:
                progress(done, total)
    cos_col, err_col = header.index("Cosine"), header.index("MaxAbsErr")
    acc_col = header.index("Accuracy Reached or Not")
    for i, _n, _b in table.jobs:
        row = table.rows[i]
        accuracy = v.tensor_accuracy(row.cells[cos_col], row.cells[err_col])
        row.cells[acc_col] = accuracy
        row.status = v.escalate(v.tensor_status(accuracy), row.status)
    for row in table.rows:
        if row.status is RowStatus.FAIL and row.cells[acc_col] not in (v.NO, NA):
            row.cells[acc_col] = v.NO  # a failure found outside the metrics (a changed scalar argument)
    return [f for _, f in sorted(missing, key=lambda item: item[0])]


def _check_tensor_dir(dump: Dump, side: str) -> None:
    """A tensor dump whose ``dump_tensor_data`` is missing or not a directory has no file to read: one error
    naming it, rather than one "not found" row per tensor (msprobe logs each and exits 0)."""
    where = dump.tensor_dir
    if not where.is_dir():
        problem = "is not a directory" if where.exists() else "does not exist"
        raise CompareInputError(
            f"{where} {problem}: the {side} dump {dump.path} is a tensor dump, its tensor files belong there"
        )


def _finish_rows(table: Table, header: list[str], mode: CompareMode) -> list[bool]:
    """Fold highlights into statuses, write Err_message and Parity Status; return which rows disagree.

    With ``table.highlight_ranges`` (statistics mode), the builder has written both cells of every row
    already, as they stand without highlights, and only the rows of those ranges can have changed since.
    """
    pos = {name: i for i, name in enumerate(header)}
    msg_col = pos.get("Err_message", -1)
    status_col = pos["Parity Status"]
    shape_col = pos.get("Cosine", -1)
    red, yellow, fail, warning = Highlight.RED, Highlight.YELLOW, RowStatus.FAIL, RowStatus.WARNING
    escalate, join, status_text = v.escalate, v.join_messages, _STATUS_TEXT
    reasons = HIGHLIGHT_REASONS
    rows, messages = table.rows, table.messages
    spans = table.highlight_ranges if table.highlight_ranges is not None else [(0, len(rows))]
    for start, stop in spans:
        for i in range(start, stop):
            row = rows[i]
            highlight = row.highlight
            if highlight is red:
                row.status = escalate(row.status, fail)
            elif highlight is yellow:
                row.status = escalate(row.status, warning)
            cells = row.cells
            if msg_col >= 0:
                msgs = messages[i]
                cells[msg_col] = join(msgs, reasons) if msgs else ""
            cells[status_col] = status_text[row.status]
    if shape_col < 0:
        return [row.status is fail for row in rows]
    unmatched = v.SHAPE_UNMATCHED
    return [row.status is fail or row.cells[shape_col] == unmatched for row in rows]


def _reason(row: CompareRow, pos: Mapping[str, int], mode: CompareMode) -> str:
    """One line saying why a failing row fails, for the suspects list."""
    cells = row.cells
    if mode is CompareMode.TENSOR:
        facts = (f"Cosine {cells[pos['Cosine']]}, MaxAbsErr {cells[pos['MaxAbsErr']]}, "
                 f"One Thousandth Err Ratio {cells[pos['One Thousandth Err Ratio']]}")  # fmt: skip
    elif mode is CompareMode.STATISTICS:
        facts = (f"MaxRelativeErr {cells[pos['MaxRelativeErr']]}, "
                 f"NormRelativeErr {cells[pos['NormRelativeErr']]}")  # fmt: skip
    else:
        facts = f"MD5 {cells[pos['NPU MD5']]} vs {cells[pos['BENCH MD5']]}"
    reason = f"{cells[0]}: {facts}"
    text = cells[pos["Err_message"]] if "Err_message" in pos else None
    return f"{reason} ({text})" if text else reason
