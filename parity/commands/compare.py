"""``parity compare``: msprobe's compare, locally, in both of msprobe's forms.

* msprobe 8.3.3's: ``parity compare -i compare.json -o OUT [-s] [-c] [-f] [-hl] [-da] [-dm MAP] [-cm MAP]``,
  writing ``compare_result_{ts}.xlsx``;
* msprobe 26's: ``parity compare -tp TARGET -gp GOLDEN [-o OUT] [--xlsx] [-fm] [-dm MAP] [-cm MAP] [-da]
  [-m auto]`` (two dump.json files, or two step folders), writing 26's ``compare_result_{ts}.csv`` (its
  columns; ``--xlsx``: the same table as ``.xlsx``) and with ``-da`` its ``diff_analyze_{ts}.json``.

``-dm`` (data mapping) and ``-cm`` (msprobe 26's module mapping: ``{module}.{class}`` or a part of one, to
the golden side's) pair the rows they name over the alignment, one rank and no ``-f``. 8.3.3's ``-hl`` and
``-da`` are always on in Parity, and ``-am -lm`` (MindSpore's API and layer mappings) do not apply to
PyTorch dumps: each prints one note line and changes nothing. 26's switches for other tools
(``-m offline_data``, ``--rank``, ``--consistent_check``, ...) are refused by name with the reason.

Exit codes: 0 whenever the compare ran, whatever it found (the findings are in the reports and printed at
the end); 2 for a bad input, as one ``parity compare: error: ...`` line (``parity.cli`` turns every
``ParityError`` into that line).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from parity.progress import ProgressBar

logger = logging.getLogger(__name__)

#: msprobe 26's compare switches for what Parity does not compare, each refused with the reason
_REFUSED_26 = {
    "--rank": "compares MindSpore static-graph dumps (ms_graph_compare); Parity reads PyTorch dumps",
    "--step": "belongs to --rank's MindSpore static-graph compare; Parity reads PyTorch dumps",
    "--consistent_check": "is msprobe 26's training/inference consistency check (vLLM, SGLang layouts), "
    "not a dump compare Parity runs",
    "--backend": "belongs to --consistent_check (fsdp/megatron layouts)",
    "--config": "belongs to --consistent_check",
    "-tensor_log": "belongs to msprobe 26's offline (non-dump) compare modes",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """msprobe v1's flags (underscore long forms), plus the same names with dashes."""
    parser.add_argument(
        "-i",
        "--input_path",
        "--input-path",
        dest="input_path",
        type=Path,
        default=None,
        metavar="COMPARE_JSON",
        help="msprobe 8.3.3's form: compare.json naming the NPU and bench dumps (an xlsx report)",
    )
    parser.add_argument(
        "-tp",
        "--target_path",
        "--target-path",
        dest="target_path",
        type=Path,
        default=None,
        metavar="PATH",
        help="msprobe 26's form: the target (NPU) dump.json, or its step folder (a CSV report)",
    )
    parser.add_argument(
        "-gp",
        "--golden_path",
        "--golden-path",
        dest="golden_path",
        type=Path,
        default=None,
        metavar="PATH",
        help="msprobe 26's form: the golden (bench) dump.json, or its step folder",
    )
    parser.add_argument(
        "--xlsx",
        dest="xlsx",
        action="store_true",
        help="msprobe 26's form: write the table as .xlsx instead of .csv",
    )
    parser.add_argument(
        "-m",
        "--mode",
        dest="mode",
        default="auto",
        metavar="MODE",
        help="msprobe 26's compare mode: auto (the only one for PyTorch dumps)",
    )
    parser.add_argument(
        "--is_print_compare_log",
        "--is-print-compare-log",
        dest="print_compare_log",
        action="store_true",
        help="msprobe 26's form: log one line per row in tensor mode",
    )
    for flag in _REFUSED_26:
        parser.add_argument(flag, dest=f"refused_{flag.strip('-')}", nargs="?", const=True, default=None,
                            help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument(
        "-o",
        "--output_path",
        "--output-path",
        dest="output_path",
        type=Path,
        nargs="?",
        const=Path("./output"),
        default=Path("./output"),
        metavar="DIR",
        help="directory for the reports (created; same-named files replaced; default ./output)",
    )
    parser.add_argument(
        "-s",
        "--stack_mode",
        "--stack-mode",
        dest="stack_mode",
        action="store_true",
        help="add the NPU_Stack_Info column (with stack_path in compare.json; a stack.json "
        "next to the NPU dump.json turns it on by itself)",
    )
    parser.add_argument(
        "-c",
        "--compare_only",
        "--compare-only",
        dest="compare_only",
        action="store_true",
        help="do not write the advisor file",
    )
    parser.add_argument(
        "-f",
        "-fm",
        "--fuzzy_match",
        "--fuzzy-match",
        dest="fuzzy_match",
        action="store_true",
        help="pair APIs ignoring their call counts",
    )
    parser.add_argument(
        "-hl",
        "--highlight",
        dest="msprobe_highlight",
        action="store_true",
        help="msprobe's switch for red/yellow row fills: always on in Parity (see --no-highlight)",
    )
    parser.add_argument(
        "-da",
        "--diff_analyze",
        "--diff-analyze",
        dest="diff_analyze",
        action="store_true",
        help="msprobe's first-divergence analysis: always on in Parity (the suspects in the summary, the "
        "advisor file and the output)",
    )
    parser.add_argument(
        "-dm",
        "--data_mapping",
        "--data-mapping",
        dest="data_mapping",
        type=Path,
        default=None,
        metavar="YAML",
        help="msprobe's data mapping: a YAML map of NPU row (or call) names to bench row (or call) names; "
        "the rows it names pair as it says, over the alignment (one rank only, not with -f)",
    )
    parser.add_argument(
        "-cm",
        "--cell_mapping",
        "--cell-mapping",
        dest="cell_mapping",
        nargs="?",
        const=True,
        default=None,
        metavar="YAML",
        help="msprobe 26's module mapping: a YAML map of target module names ({module}.{class}, or a part "
        "of one such as a class name) to golden ones; their rows pair as it says, over the alignment",
    )
    for short, long_name, what in (
        ("-am", "api_mapping", "api"),
        ("-lm", "layer_mapping", "layer"),
    ):
        parser.add_argument(
            short,
            f"--{long_name}",
            f"--{long_name.replace('_', '-')}",
            dest=long_name,
            nargs="?",
            const=True,
            default=None,
            metavar="YAML",
            help=f"msprobe's MindSpore {what} mapping: not applicable to PyTorch dumps (accepted, ignored)",
        )
    parser.add_argument(
        "-j",
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="threads for tensor metrics (default: one per core; 1: none, in the main thread)",
    )
    parser.add_argument(
        "--no-highlight",
        dest="highlight",
        action="store_false",
        help="write the xlsx without red/yellow row fills",
    )
    parser.add_argument(
        "--replay",
        type=int,
        default=10,
        metavar="N",
        help="tensor mode: replay the top N calls, the first divergence and each systematic finding's first "
        "call on the CPU in float64; a call whose kernel is wrong is ranked first (default 10; 0: no replay)",
    )
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false", help="never draw the progress bar on stderr"
    )


def msprobe_flag_notes(args: argparse.Namespace, form_26: bool = False) -> list[str]:
    """One line per msprobe flag that Parity accepts but has no switch for: why it changes nothing."""
    notes: list[str] = []
    if args.msprobe_highlight:
        notes.append(
            "-hl: row highlighting is always on in Parity"
            + ("; --no-highlight wins" if not args.highlight else "")
        )
    if args.diff_analyze and not form_26:
        notes.append("-da: first-divergence analysis is always on in Parity (the suspects printed below)")
    if args.cell_mapping is True:
        notes.append("-cm without a file maps no module (as in msprobe); give -cm MAP.yaml")
    for flag, dest in (("-am", "api_mapping"), ("-lm", "layer_mapping")):
        if getattr(args, dest) is not None:
            notes.append(f"{flag}: a MindSpore mapping, not applicable to PyTorch dumps; ignored")
    return notes


def _spec_of(args: argparse.Namespace) -> tuple[Any, bool]:
    """The compare spec of either form, and whether it is msprobe 26's (``-tp -gp``)."""
    from parity.shared.compare.spec import load_compare_spec, parse_compare_spec
    from parity.shared.errors import CompareInputError

    for flag, why in _REFUSED_26.items():
        if getattr(args, f"refused_{flag.strip('-')}") is not None:
            raise CompareInputError(f"{flag}: not supported: it {why}")
    if args.mode != "auto":
        raise CompareInputError(f"-m {args.mode}: not supported: Parity compares msprobe dumps (mode "
                                "auto); offline_data, torchair, offline_model and atb compare other tools' "
                                "data")  # fmt: skip
    form_26 = args.target_path is not None or args.golden_path is not None
    if form_26 and args.input_path is not None:
        raise CompareInputError("-i cannot be combined with -tp/-gp: give compare.json (msprobe 8.3.3's "
                                "form) or -tp and -gp (msprobe 26's form)")  # fmt: skip
    if form_26:
        if args.target_path is None or args.golden_path is None:
            missing = "-gp" if args.golden_path is None else "-tp"
            raise CompareInputError(f"{missing} is required with {'-tp' if missing == '-gp' else '-gp'}")
        doc = {"npu_path": str(args.target_path), "bench_path": str(args.golden_path),
               "is_print_compare_log": args.print_compare_log}  # fmt: skip
        return parse_compare_spec(doc, source="-tp/-gp"), True
    if args.input_path is None:
        raise CompareInputError("required: -i compare.json (msprobe 8.3.3's form) or -tp TARGET -gp GOLDEN "
                                "(msprobe 26's form)")  # fmt: skip
    if args.xlsx:
        raise CompareInputError("--xlsx belongs to the -tp/-gp form; -i compare.json always writes xlsx")
    return load_compare_spec(args.input_path), False


def _mapping_of(args: argparse.Namespace, multi_rank: bool) -> Any:
    """The row mapping of ``-cm`` and ``-dm`` (applied in that order), or None."""
    from parity.shared.compare.mapping import MappingChain, load_data_mapping, load_module_mapping
    from parity.shared.errors import CompareInputError

    given = [(flag, path) for flag, path in (("-cm", args.cell_mapping), ("-dm", args.data_mapping))
             if path is not None and path is not True]  # fmt: skip
    for flag, path in given:
        if args.fuzzy_match:
            raise CompareInputError(f"{flag} {path}: a mapping cannot be combined with -f (as in msprobe)")
        if multi_rank:
            raise CompareInputError(f"{flag} {path}: a mapping names the rows of one rank; this compare "
                                    "takes step directories (as in msprobe, it takes two dump.json "
                                    "files)")  # fmt: skip
    loaded = [load_module_mapping(path) if flag == "-cm" else load_data_mapping(path) for flag, path in given]
    if not loaded:
        return None
    return loaded[0] if len(loaded) == 1 else MappingChain(tuple(loaded))


def run(args: argparse.Namespace) -> int:
    """Parse compare.json, run the compare, print each rank's first divergence and top suspects (the advisor
    file's lines: score, evidence, Excel row, user frame) and the report paths."""
    from parity.shared.errors import CompareInputError

    if args.replay < 0:
        raise CompareInputError(f"--replay must be 0 or more, got {args.replay}")
    if args.workers is not None and args.workers < 1:
        raise CompareInputError(f"--workers must be at least 1, got {args.workers}")
    spec, form_26 = _spec_of(args)
    mapping = _mapping_of(args, spec.multi_rank)
    for note in msprobe_flag_notes(args, form_26):
        sys.stderr.write(f"parity compare: note: {note}\n")

    from parity.process_policy import collector_paused, metric_executor, replay_budget, tensor_limits
    from parity.shared.compare.job import run_compare
    from parity.shared.compare.options import TOP_SUSPECTS, CompareOptions
    from parity.shared.replay.text import replay_lines
    from parity.shared.report.advisor import suspect_lines

    bar = ProgressBar("compare") if args.progress else None
    try:
        with collector_paused(), metric_executor(args.workers) as executor:
            options = CompareOptions(
                fuzzy_match=args.fuzzy_match, stack_mode=args.stack_mode, executor=executor,
                replay_top=args.replay, tensor_limits=tensor_limits(), data_mapping=mapping,
                replay_budget=replay_budget(),  # a crash or a runaway replay loses only its verdict
            )  # fmt: skip
            outputs = run_compare(
                spec,
                args.output_path,
                options,
                progress=bar,
                advisor=not args.compare_only,
                highlight=args.highlight,
                form=("xlsx26" if args.xlsx else "csv26") if form_26 else "xlsx",
                diff_analyze=form_26 and args.diff_analyze,
            )
    finally:
        if bar is not None:
            bar.close()

    from parity.shared.incomplete import incomplete_lines

    for warning in incomplete_lines(outputs.results):
        sys.stderr.write(f"parity compare: warning: {warning}\n")
    out = sys.stdout
    for result in outputs.results:
        where = f"rank {result.rank}: " if result.rank is not None else ""
        counts = result.summary()["status_counts"]
        assert isinstance(counts, dict)
        shown = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
        out.write(f"{where}{len(result.rows)} rows ({shown or 'none'}), {result.mode.value} mode\n")
        if result.suspects:
            # The advisor file's own lines (one formatter): the first divergence, then the ranked suspects.
            for line in suspect_lines(result.suspects, result.first_divergence, limit=TOP_SUSPECTS,
                                      systematic=[f.text for f in result.systematic]):
                out.write(f"  {line}\n" if line else "\n")
        else:
            out.write(f"{where}no suspect: {result.advice.text}\n")
        for line in replay_lines(result.replay):
            out.write(f"  {line}\n")
    for rank in outputs.npu_only_ranks:
        out.write(f"rank {rank}: only in the NPU dump, not compared\n")
    for rank in outputs.bench_only_ranks:
        out.write(f"rank {rank}: only in the bench dump, not compared\n")
    for rank in outputs.skipped_ranks:
        out.write(f"rank {rank}: a dump.json is missing on one side, not compared\n")
    out.write("reports:\n")
    for path in outputs.files:
        out.write(f"  {path}\n")
    missing = [path for result in outputs.results for path in result.missing_tensor_files]
    if missing:
        out.flush()
        files = "tensor file" + ("s" if len(missing) > 1 else "")
        sys.stderr.write(
            f"parity compare: warning: {len(missing)} {files} missing or unreadable "
            f"(their rows say so in Err_message), the first: {missing[0]}\n"
        )
    return 0
