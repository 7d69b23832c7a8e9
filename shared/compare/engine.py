"""The compare engine: two dumps in, one ``CompareResult`` out (compare.md §1.4-§7).

A pure library: it reads files, computes and returns values; no HTTP, SQL or threads of its own (tensor mode
hands its file pairs to ``parity.shared.metrics.parallel``, on the executor the caller put in the options).
The pipeline is read → rows → pair → cells and verdicts → tensor metrics (tensor mode) → highlight → messages
and status → advice and suspects, each step one pass over plain lists.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from parity.shared.compare import md5 as md5_mode
from parity.shared.compare import statistics as stats_mode
from parity.shared.compare import verdicts as v
from parity.shared.compare.advisor import advise
from parity.shared.compare.alignment import BASIS_FOREACH, Aligned, Modules, Sites, pair_calls
from parity.shared.compare.call_errors import JUDGED_INPUTS
from parity.shared.compare.cells import PairFacts, Table, stack_cells
from parity.shared.compare.choices import argument_difference
from parity.shared.compare.facts import (
    F_INCOMPATIBLE,
    F_NO_FILE,
    F_POSITIONS,
    F_SHAPE,
    F_STATISTICS_ONLY,
    F_UNINITIALISED,
    RowFacts,
    fill_limits,
)
from parity.shared.compare.headers import CompareMode, full_header
from parity.shared.compare.highlight import REASONS as HIGHLIGHT_REASONS
from parity.shared.compare.highlight import apply_highlights
from parity.shared.compare.localization import localize, user_frame
from parity.shared.compare.options import REPLAY_TOP, CompareOptions
from parity.shared.compare.pairing import Pairing
from parity.shared.compare.replay_judgement import Replayer, judge_with_replay
from parity.shared.compare.result import Cell, CompareResult, CompareRow, Highlight, RowStatus
from parity.shared.compare.rows import SideRows, data_file, side_rows
from parity.shared.compare.slices import CallSlice, TablePart
from parity.shared.compare.statistics_table import build_statistics_rows
from parity.shared.compare.suspects import suspects_of
from parity.shared.compare.uninitialised import MSG_UNINITIALISED, uninitialised_rows
from parity.shared.dump.columns import Leaf
from parity.shared.dump.layout import sibling_stack_json
from parity.shared.dump.reader import Dump, load_construct, load_dump, load_stack
from parity.shared.errors import CompareInputError, DumpError
from parity.shared.numbers import prose_number

if TYPE_CHECKING:
    from parity.shared.metrics.tensor import TensorMetrics

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
NA = "N/A"
_fc = stats_mode.finite_cell
_stat_cells = stats_mode.stat_cells
_STATUS_TEXT = {status: status.value for status in RowStatus}


def detect_mode(npu: Dump, bench: Dump, *, mixed_tasks: bool = False) -> CompareMode:
    """§1.4: equal tasks; ``tensor`` → tensor mode; ``statistics`` → md5 mode if checksums were dumped.

    With ``mixed_tasks`` a tensor dump against a statistics dump is compared in statistics mode: a tensor dump
    records each tensor's statistics too (a nightly dumped with tensors against a statistics baseline)."""
    if mixed_tasks and {npu.task, bench.task} == {"tensor", "statistics"}:
        logger.info("%s is a %s dump and %s a %s dump: compared in statistics mode", npu.path, npu.task,
                    bench.path, bench.task)  # fmt: skip
        return CompareMode.STATISTICS
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
    part = compare_part(npu_dump_json, bench_dump_json, options, stack_path=stack_path, progress=progress,
                        read_dump=read_dump)  # fmt: skip
    replayer = None
    if options.replay_top > 0:  # imported here: a compare without the replay never imports torch for it
        from parity.shared.replay.compare import dump_replayer

        replayer = dump_replayer(npu_dump_json, bench_dump_json, limits=options.tensor_limits,
                                 budget=options.replay_budget)  # fmt: skip
    result = conclude([part], stacks_of(npu_dump_json, stack_path), replayer=replayer,
                      replay_top=options.replay_top)  # fmt: skip
    result.npu_path = str(npu_dump_json)
    result.bench_path = str(bench_dump_json)
    return result


def compare_part(
    npu_dump_json: Path,
    bench_dump_json: Path,
    options: CompareOptions,
    *,
    part: CallSlice | None = None,
    stack_path: Path | None = None,
    progress: Progress | None = None,
    read_dump: Callable[[Path], Dump] = load_dump,
) -> TablePart:
    """The finished rows of the NPU calls ``part`` selects (every call when None), before localization.

    Both dumps are read and paired whole, so a row pairs as it would in the whole compare; only the part's
    rows are built into cells, and in tensor mode only their tensor files are read. ``conclude`` over the
    parts of every slice of a rank gives the result ``compare_dumps`` gives for the rank.
    """
    npu, bench = read_dump(npu_dump_json), read_dump(bench_dump_json)
    mode = detect_mode(npu, bench, mixed_tasks=options.mixed_tasks)
    stacks = stacks_of(npu_dump_json, stack_path)
    stack_mode = options.stack_mode if stack_path is not None else stacks is not None
    table = _table_part(npu, bench, mode, options, stacks, stack_mode, progress, part,
                        call_sites(npu_dump_json, bench_dump_json),
                        call_modules(npu_dump_json, bench_dump_json))
    table.parents = module_parents(npu_dump_json, table.rows)
    return table


def module_parents(npu_dump_json: Path, rows: Sequence[CompareRow]) -> dict[str, str]:
    """The innermost module of each call of ``rows`` and of the modules around them, from the construct.json
    beside the NPU dump.json (mix level; empty without one, or with a broken one: a hint for the
    localization, never a reason to fail)."""
    path = npu_dump_json.parent / "construct.json"
    if not path.is_file():
        return {}
    try:
        construct = load_construct(path)
    except DumpError as exc:
        logger.warning("construct.json not used for the modules' expected rounding: %s", exc)
        return {}
    out: dict[str, str] = {}
    todo = list(dict.fromkeys(row.api for row in rows))
    for name in todo:  # each call, then the modules around it (appended as they are met), each once
        parent = construct.get(name)
        if parent is not None and name not in out:
            out[name] = parent
            todo.append(parent)
    return out


def call_sites(npu_dump_json: Path, bench_dump_json: Path) -> Callable[[], Sites | None]:
    """Each side's call site per entry (the innermost frame in the user's code, from the stack.json beside
    each dump.json), for the alignment's score; read when asked, None unless both sides have one."""

    def read() -> Sites | None:
        found = [sibling_stack_json(p) for p in (npu_dump_json, bench_dump_json)]
        if found[0] is None or found[1] is None:
            return None
        try:
            stacks = [load_stack(p) for p in found if p is not None]
        except DumpError as exc:  # a call site is a hint for the alignment: a broken stack.json is none
            logger.warning("call sites not used for the alignment: %s", exc)
            return None
        npu_sites, bench_sites = ({entry: user_frame(frames) or (frames[0] if frames else "")
                                   for entry, frames in s.items()} for s in stacks)  # fmt: skip
        return npu_sites, bench_sites

    return read


def call_modules(npu_dump_json: Path, bench_dump_json: Path) -> Callable[[], Modules | None]:
    """Each side's construct.json (beside each dump.json), for the alignment's module scopes; read when
    asked, None unless both sides have a readable one (a hint: a broken file is none, with a warning)."""

    def read() -> Modules | None:
        paths = [p.parent / "construct.json" for p in (npu_dump_json, bench_dump_json)]
        if not all(p.is_file() for p in paths):
            return None
        try:
            return load_construct(paths[0]), load_construct(paths[1])
        except DumpError as exc:
            logger.warning("construct.json not used for the alignment's module scopes: %s", exc)
            return None

    return read


def part_tensor_files(
    npu_dump_json: Path,
    bench_dump_json: Path,
    options: CompareOptions,
    part: CallSlice,
    *,
    read_dump: Callable[[Path], Dump] = load_dump,
) -> tuple[list[str], list[str]]:
    """The tensor files (names under each side's ``dump_tensor_data``) the rows of ``part`` read: what a
    worker fetches for one slice of a rank. Empty outside tensor mode."""
    npu, bench = read_dump(npu_dump_json), read_dump(bench_dump_json)
    if detect_mode(npu, bench, mixed_tasks=options.mixed_tasks) is not CompareMode.TENSOR:
        return [], []
    npu_rows = side_rows(npu, tensor_mode=True)
    bench_rows = side_rows(bench, tensor_mode=True)
    bench_index = pair_calls(npu_rows, bench_rows, fuzzy=options.fuzzy_match, mapping=options.data_mapping,
                             sites=call_sites(npu_dump_json, bench_dump_json),
                             modules=call_modules(npu_dump_json, bench_dump_json))[0].bench_index
    start, stop, _ = part.rows(npu_rows.apis)
    n_leaf, b_leaf = npu.columns.leaf, bench.columns.leaf
    npu_files: list[str] = []
    bench_files: list[str] = []
    for i in range(start, stop):
        j = bench_index[i]
        if j < 0:
            continue
        n, b = n_leaf(i), b_leaf(j)
        # the engine reads a pair only when both sides name a file (else the row says why, no file read)
        if n.data_name:
            npu_files.append(n.data_name)
        if b.data_name:
            bench_files.append(b.data_name)
    return npu_files, bench_files


def stacks_of(npu_dump_json: Path, stack_path: Path | None) -> dict[str, list[str]] | None:
    """The stack.json a compare reads: ``stack_path``, else the one beside the NPU dump.json (§1.1)."""
    if stack_path is not None:
        return load_stack(stack_path)
    found = sibling_stack_json(npu_dump_json)
    return load_stack(found) if found is not None else None


# --------------------------------------------------------------------------------------------------------
# the table


def _table_part(
    npu: Dump,
    bench: Dump,
    mode: CompareMode,
    options: CompareOptions,
    stacks: Mapping[str, list[str]] | None,
    stack_mode: bool,
    progress: Progress | None,
    part: CallSlice | None,
    sites: Callable[[], Sites | None] | None = None,
    modules: Callable[[], Modules | None] | None = None,
) -> TablePart:
    """The rows: pairing, cells, tensor metrics, highlights and statuses, for the calls of ``part``.

    The whole table is laid out (cheap) and cut to the part's rows before the tensor metrics (the cost),
    so a row is built exactly as in the whole compare: the highlight rules group the rows of one call,
    which a slice never splits, and the bench-only rows go with the last slice, beside the last call they
    follow.
    """
    tensor = mode is CompareMode.TENSOR
    header = full_header(mode, stack=stack_mode)
    missing: list[Path] = []

    def phase_done() -> None:
        # A statistics rank of a million rows is seconds of work with no tensor pair in it: its phases are
        # where a caller (a server job) may stop it early (``progress`` raises when its job was cancelled).
        if progress is not None:
            progress(0, 0)  # no progress to report (total 0): only a point to stop at

    npu_rows = side_rows(npu, tensor_mode=tensor)
    bench_rows = side_rows(bench, tensor_mode=tensor)
    phase_done()
    pairing, aligned = pair_calls(npu_rows, bench_rows, fuzzy=options.fuzzy_match,
                                  mapping=options.data_mapping, sites=sites, modules=modules)
    phase_done()
    facts = _row_facts(npu_rows, bench_rows, pairing)
    stack = stack_cells(npu_rows.apis, stacks) if stack_mode else None
    if mode is CompareMode.STATISTICS:
        table = build_statistics_rows(npu_rows, bench_rows, pairing.bench_index, fuzzy=options.fuzzy_match,
                                      stack=stack)  # fmt: skip
        table.facts = facts
        phase_done()
    else:
        table = Table()
        table.facts = facts
        _build_rows(table, mode, npu_rows, bench_rows, pairing.bench_index, options.fuzzy_match, stack)
    _build_bench_only(table, mode, bench_rows, pairing.bench_only, stack_mode)
    gaps, partners = _pairing_cells(table, npu_rows, bench_rows, pairing, aligned)
    if table.highlight_ranges is not None and pairing.bench_only:
        table.highlight_ranges = _with_tail(table.highlight_ranges, npu_rows.apis, len(table.rows))
    paired = len(npu_rows) - pairing.bench_index.count(-1)
    logger.debug("%s mode: %d NPU rows, %d bench rows, %d paired, %d bench-only", mode.value,
                 len(npu_rows), len(bench_rows), paired, len(pairing.bench_only))  # fmt: skip
    start, stop, calls = (part or CallSlice()).rows(npu_rows.apis)
    if part is not None:
        # the last slice keeps the bench-only rows, which follow the last call
        _cut(table, start, len(table.rows) if stop == len(npu_rows) else stop)
    if tensor:
        missing = _run_tensor_metrics(table, header, npu, bench, options, progress)
    elif progress is not None:
        progress(len(table.rows), len(table.rows))
    apply_highlights(table.rows, table.states, mode, header, table.messages, table.highlight_ranges)
    phase_done()
    _finish_rows(table, header, mode)
    _leave_uninitialised(table, header)
    return TablePart(mode=mode.value, stack_mode=stack_mode, rows=table.rows, states=table.states,
                     missing_tensor_files=[str(f) for f in missing], calls=calls, gaps=gaps,
                     partners=partners, facts=table.facts)  # fmt: skip


def _row_facts(npu_rows: SideRows, bench_rows: SideRows, pairing: Pairing) -> RowFacts:
    """The typed facts of the table's rows: each NPU row against its bench row, then the bench-only rows."""
    n_npu, only = len(npu_rows), pairing.bench_only
    names = [*npu_rows.names, *map(bench_rows.names.__getitem__, only)]
    npu_index = np.concatenate((np.arange(n_npu), np.full(len(only), -1))).astype(np.intp)
    bench_index = np.asarray([*pairing.bench_index, *only], dtype=np.intp)
    facts = RowFacts.build(names, npu_rows.columns, npu_index, bench_rows.columns, bench_index)
    uninitialised = uninitialised_rows(facts, npu_rows.columns.states, npu_rows.apis)
    facts.flags_array()[:n_npu][uninitialised] |= F_UNINITIALISED
    return facts


_NAME = "name"


def _pairing_cells(table: Table, npu_rows: SideRows, bench_rows: SideRows, pairing: Pairing,
                   aligned: Aligned | None) -> tuple[dict[str, str], dict[str, str]]:  # fmt: skip
    """Write each row's pairing basis and gap (the Parity Pairing and Parity Gap columns, which the builders
    fill for the fast path: ``name`` where paired, empty where not), and give a gap's rows the state and
    call the localization judges them by. Returns the gaps that have target calls (judged as their first
    call) with their labels, and the calls the float64 replay must not take by name on the bench: the bench
    call of a call paired under another name, ``""`` for a gap's."""
    if aligned is None:
        return {}, {}
    rows, n_npu = table.rows, len(npu_rows)
    labels = [gap.label for gap in aligned.gaps]
    row_gap, basis = aligned.row_gap, aligned.basis
    for i, row in enumerate(rows[:n_npu]):
        k = row_gap.get(i)
        row.cells[-2:] = (basis[i] or None, labels[k] if k is not None else None)
    bench_gap = aligned.bench_row_gap
    for row, j in zip(rows[n_npu:], pairing.bench_only, strict=True):
        k = bench_gap.get(j)
        if k is not None:
            row.cells[-2:] = ("gap", labels[k])
    for i, state in aligned.states.items():
        table.states[i] = state
    for i, api in aligned.apis.items():
        rows[i].api = api
    partners: dict[str, str] = {}
    for i, j in enumerate(pairing.bench_index):
        if j >= 0 and basis[i] != _NAME and i not in row_gap:
            partners.setdefault(npu_rows.apis[i], bench_rows.apis[j])
    partners.update((call, "") for gap in aligned.gaps for call in gap.target)
    # a foreach call stands for several bench calls (and a per-parameter call for part of one): no bench
    # call of its own to replay
    partners.update((npu_rows.apis[i], "") for i, b in enumerate(basis) if b == BASIS_FOREACH)
    return {gap.api: gap.label for gap in aligned.gaps if gap.api is not None}, partners


def _cut(table: Table, start: int, stop: int) -> None:
    """Keep rows ``[start, stop)`` of ``table`` (each side of the cut a call boundary), renumbered from 0."""
    table.rows = table.rows[start:stop]
    table.states = table.states[start:stop]
    if table.facts is not None:
        table.facts = table.facts.take(start, stop)
    table.messages = table.messages[start:stop]
    table.jobs = [(i - start, n, b) for i, n, b in table.jobs if start <= i < stop]
    if table.highlight_ranges is not None:
        clipped = ((max(a, start) - start, min(b, stop) - start) for a, b in table.highlight_ranges)
        table.highlight_ranges = [(a, b) for a, b in clipped if a < b]


def conclude(parts: Sequence[TablePart], stacks: Mapping[str, list[str]] | None = None, *,
             replayer: Replayer | None = None, replay_top: int = REPLAY_TOP) -> CompareResult:  # fmt: skip
    """One rank's result from the parts of all its slices (in call order): localization, advice and
    suspects need every call of the rank, so they run here, once, over the joined rows.

    With a ``replayer`` (tensor mode), the float64 replay of the candidates ``replay_judgement`` picks
    (about ``replay_top`` of them) is part of the judgement: it re-ranks the suspects, and the advice and
    the result's ``replay`` document say what it found."""
    if not parts:
        raise CompareInputError("a rank's result needs at least one part")
    mode, stack_mode = CompareMode(parts[0].mode), parts[0].stack_mode
    header = full_header(mode, stack=stack_mode)
    rows = [row for p in parts for row in p.rows] if len(parts) > 1 else parts[0].rows
    states = [state for p in parts for state in p.states] if len(parts) > 1 else parts[0].states
    parents = {call: module for p in parts for call, module in p.parents.items()}
    facts = RowFacts.concat([p.facts for p in parts if p.facts is not None])
    if len(facts) != len(rows):
        raise CompareInputError(f"a rank's parts carry facts for {len(facts)} of its {len(rows)} rows")
    localization = localize(rows, states, facts, mode, parents=parents)
    partners = {call: bench for p in parts for call, bench in p.partners.items()}
    localization, replay, verdicts = judge_with_replay(localization, replayer, replay_top, partners)
    advice = advise(rows, facts.names, mode, localization, verdicts)
    message_col = header.index("Err_message") if "Err_message" in header else -1

    def reason_of(i: int) -> str:
        return _reason(facts, i, mode, rows[i].cells[message_col] if message_col >= 0 else None)

    gaps = {api: label for p in parts for api, label in p.gaps.items()}
    suspects, first = suspects_of(localization, rows, reason_of, stacks, gaps=gaps)
    return CompareResult(mode=mode, stack_mode=stack_mode, rows=rows, advice=advice, suspects=suspects,
                         first_divergence=first, row_scores=localization.row_scores(len(rows)),
                         missing_tensor_files=[f for p in parts for f in p.missing_tensor_files],
                         systematic=localization.systematic, replay=replay, facts=facts,
                         states=list(states))  # fmt: skip


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
    flag = table.facts.flag if table.facts is not None else _no_flag
    flags = table.facts.flags if table.facts is not None else bytearray(len(npu_rows))

    def uninitialised(i: int) -> bool:
        return bool(flags[i] & F_UNINITIALISED)

    for i, (name, n, api) in enumerate(zip(npu_rows.names, npu_rows.leaves, npu_rows.apis, strict=True)):
        j = bench_index[i]
        b = b_leaf(j) if j >= 0 else None
        facts = PairFacts(name, n, b_names[j] if j >= 0 else None, b, fuzzy)
        msgs, status = facts.messages, facts.status
        if b is not None and not facts.compatible:
            flag(i, F_INCOMPATIBLE)
        if tensor:
            metric_cells = _UNSUPPORTED6  # until the metrics are in
            changed = _changed_argument(name, api, n, b)
            if changed is not None:  # no data file to read: the row says what the two sides asked for
                accuracy = v.NONE
                msgs.append(changed)
            elif b is None:
                accuracy = v.NONE  # msprobe 8.3.3's cell for an unmatched row (never Yes)
                # msprobe's words, in its order: "No bench data matched." unless requires_grad disagreed
                # (that message replaces it), then why no metric could be computed.
                if not msgs:
                    msgs.append(stats_mode.NO_BENCH)
                msgs.append(v.MSG_BENCH_UNMATCHED if n.data_name else no_npu_file)
            elif not facts.compatible:
                accuracy = v.NO
            elif uninitialised(i):
                accuracy, metric_cells = v.NA, _NA6  # no values to compare (``_leave_uninitialised``)
            elif not n.data_name and not b.data_name and n.is_tensor and b.is_tensor:
                accuracy, status = _statistics_only(n, b, msgs, status)
                metric_cells = _NA6
                flag(i, F_STATISTICS_ONLY)
            else:
                accuracy = v.NONE  # set once the metrics are in
                jobs.append((i, n, b))
            cells = [*facts.prefix, *metric_cells, *facts.stats, facts.rg_consistent, accuracy, None]
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
        cells += (None, api, _NAME if j >= 0 else None, None)  # Parity Status: written by _finish_rows
        rows.append(CompareRow(cells, api, status))
        states.append(n.state)
        messages.append(msgs)


_UNSUPPORTED6 = (v.UNSUPPORTED,) * 6


def _changed_argument(name: str, api: str, n: Leaf, b: Leaf | None) -> str | None:
    """A non-tensor input argument that the bench passed with another value, or not at all, in words
    (``Argument approximate: 'tanh' vs 'none'.``); None for a tensor, an output, or the same request."""
    if n.is_tensor or n.data_name or n.state not in JUDGED_INPUTS or (b is not None and b.is_tensor):
        return None
    text = argument_difference(name, api, n.max, *(() if b is None else (b.max,)))
    return None if text is None else f"Argument {text}."


_NA6 = (v.NA,) * 6


def _no_flag(_i: int, _bits: int) -> None:
    """Where a table has no facts (nothing to flag)."""


def _statistics_only(n: Leaf, b: Leaf, msgs: list[str], status: RowStatus) -> tuple[str, RowStatus]:
    """A tensor pair that neither dump saved as a file (a planned dump writes files for its listed calls
    only): judged from its statistics, as a statistics compare would (msprobe v1's rule), not "missing".
    Accuracy ``Warning`` (status fail) where a statistic moved by more than half, else ``Yes``."""
    _cells, warning = stats_mode.statistics_cells((n.max, n.min, n.mean, n.norm),
                                                  (b.max, b.min, b.mean, b.norm))  # fmt: skip
    msgs.append(v.MSG_STATISTICS_ONLY)
    if warning:
        msgs.insert(0, stats_mode.NEED_DOUBLE_CHECK)
        return stats_mode.WARNING, v.escalate(status, RowStatus.FAIL)
    return v.YES, status


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
        cells += (status.value, bench_rows.apis[j], None, None)
        table.rows.append(CompareRow(cells, bench_rows.apis[j], status))
        table.states.append(b.state)
        argument = None
        if not b.is_tensor and not b.data_name and b.state in JUDGED_INPUTS:
            argument = argument_difference(bench_rows.names[j], bench_rows.apis[j], bench=b.max)
        table.messages.append([v.MSG_NPU_UNMATCHED if argument is None else f"Argument {argument}."])


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
        fills = _fills(table.facts, len(table.rows))
        jobs = [
            TensorPairJob(
                index=i,
                npu_file=npu_dir / n.data_name if n.data_name else None,
                bench_file=bench_dir / b.data_name if b.data_name else None,
                fill=fills[i],
            )
            for i, n, b in table.jobs
        ]
        first = header.index("Cosine")
        total = len(jobs)
        extra = {"limits": options.tensor_limits} if options.tensor_limits is not None else {}
        results = compare_tensor_files(jobs, executor=options.executor, **extra)
        record = _metric_facts(table.facts)
        for done, (i, metrics) in enumerate(results, start=1):
            cells = table.rows[i].cells
            cells[first : first + 6] = [
                _fc(metrics.cosine), _fc(metrics.euc_dist), _fc(metrics.max_abs_err),
                _fc(metrics.max_relative_err), _fc(metrics.one_thousandth), _fc(metrics.five_thousandths),
            ]  # fmt: skip
            record(i, metrics)
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


def _fills(facts: RowFacts | None, n: int) -> list[float]:
    """Each row's fill limit where its statistics say it is masked (``RowFacts.masked``), else infinity:
    the metrics of a masked pair are taken over its other elements (``metrics.tensor.unmask``)."""
    if facts is None:
        return [math.inf] * n
    return np.where(facts.masked(), fill_limits(facts.npu.dtype), math.inf).tolist()


def _metric_facts(facts: RowFacts | None) -> Callable[[int, TensorMetrics], None]:
    """What records a row's tensor metrics in ``facts``: the six numbers (NaN for a sentinel cell) and the
    flags the pass found (shapes that differ, NaN/Inf at other places, a file missing or unreadable)."""
    if facts is None:
        return lambda _i, _m: None
    from parity.shared.metrics.tensor import (
        MSG_NAN_INF_POSITION,
        MSG_NO_BENCH_FILE,
        MSG_NO_NPU_FILE,
        MSG_UNREADABLE,
        SHAPE_UNMATCHED,
    )

    values = facts.metrics_array()
    no_file = {MSG_NO_NPU_FILE, MSG_NO_BENCH_FILE, MSG_UNREADABLE}

    def record(i: int, m: TensorMetrics) -> None:
        cells = (m.cosine, m.euc_dist, m.max_abs_err, m.max_relative_err, m.one_thousandth,
                 m.five_thousandths)  # fmt: skip
        values[i] = [c if type(c) is float else math.nan for c in cells]
        bits = F_SHAPE if m.cosine == SHAPE_UNMATCHED else 0
        if MSG_NAN_INF_POSITION in m.messages:
            bits |= F_POSITIONS
        if m.unread_file is not None or no_file.intersection(m.messages):
            bits |= F_NO_FILE
        if bits:
            facts.flag(i, bits)

    return record


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


def _leave_uninitialised(table: Table, header: list[str]) -> None:
    """The rows of uninitialised memory (``uninitialised``): no verdict, no highlight, status
    uncomparable, and the message says why (whatever their statistics or metrics said)."""
    if table.facts is None:
        return
    rows = np.flatnonzero(table.facts.has(F_UNINITIALISED)).tolist()
    if not rows:
        return
    pos = {name: i for i, name in enumerate(header)}
    verdict = pos.get("Accuracy Reached or Not", pos.get("Result", -1))
    msg_col, status_col = pos.get("Err_message", -1), pos["Parity Status"]
    for i in rows:
        row = table.rows[i]
        row.status, row.highlight = RowStatus.UNCOMPARABLE, None
        table.messages[i] = [MSG_UNINITIALISED]
        if verdict >= 0:
            row.cells[verdict] = NA
        if msg_col >= 0:
            row.cells[msg_col] = MSG_UNINITIALISED
        row.cells[status_col] = RowStatus.UNCOMPARABLE.value


def _reason(facts: RowFacts, i: int, mode: CompareMode, message: Cell) -> str:
    """One line saying why a failing row fails, for the suspects list (numbers to 3 significant digits),
    from the row's facts, and its Err_message."""
    n = _prose
    if mode is CompareMode.TENSOR:
        cosine, _dist, max_abs, _rel, one, _five = facts.metrics_array()[i].tolist()
        text = f"Cosine {n(cosine)}, MaxAbsErr {n(max_abs)}, One Thousandth Err Ratio {n(one)}"
    elif mode is CompareMode.STATISTICS:
        a, b = facts.npu.stats_array()[i], facts.bench.stats_array()[i]
        with np.errstate(all="ignore"):
            rel = np.abs((a - b) / b) * 100.0
        text = f"MaxRelativeErr {n(rel[0], '%')}, NormRelativeErr {n(rel[3], '%')}"
    else:
        text = f"MD5 {facts.npu.md5[i] or NA} vs {facts.bench.md5[i] or NA}"
    reason = f"{facts.names[i]}: {text}"
    return f"{reason} ({message})" if message else reason


def _prose(value: float, unit: str = "") -> str:
    """A metric in a sentence (``prose_number``), ``N/A`` where it is no number."""
    if math.isfinite(value):
        return f"{prose_number(value)}{unit}"
    return NA if math.isnan(value) else str(value)
