"""``parity compare -i compare.json -o OUT [-s] [-c] [-f] [-hl] [-da] ...``: msprobe 8.3.3's compare, locally.

Every flag of msprobe 8.3.3's ``compare`` is accepted: ``-s -c -f -dm`` act as in msprobe (``-dm``'s
mapping overrides the alignment where it names a row or call, and, as in msprobe, takes one rank and no
``-f``); ``-hl`` and ``-da`` are always on in Parity and ``-cm -am -lm`` (MindSpore mappings) do not apply to
PyTorch dumps, so each prints one note line and changes nothing.

Exit codes: 0 whenever the compare ran, whatever it found (the findings are in the reports and printed at
the end); 2 for a bad input, as one ``parity compare: error: ...`` line (``parity.cli`` turns every
``ParityError`` into that line).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from parity.progress import ProgressBar

logger = logging.getLogger(__name__)



def add_arguments(parser: argparse.ArgumentParser) -> None:
    """msprobe v1's flags (underscore long forms), plus the same names with dashes."""
    parser.add_argument(
        "-i",
        "--input_path",
        "--input-path",
        dest="input_path",
        required=True,
        type=Path,
        metavar="COMPARE_JSON",
        help="compare.json naming the NPU and bench dumps",
    )
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
    for short, long_name, what in (
        ("-cm", "cell_mapping", "cell"),
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


def msprobe_flag_notes(args: argparse.Namespace) -> list[str]:
    """One line per msprobe 8.3.3 flag that Parity accepts but has no switch for: why it changes nothing."""
    notes: list[str] = []
    if args.msprobe_highlight:
        notes.append(
            "-hl: row highlighting is always on in Parity"
            + ("; --no-highlight wins" if not args.highlight else "")
        )
    if args.diff_analyze:
        notes.append("-da: first-divergence analysis is always on in Parity (the suspects printed below)")
    for flag, dest in (("-cm", "cell_mapping"), ("-am", "api_mapping"), ("-lm", "layer_mapping")):
        if getattr(args, dest) is not None:
            notes.append(f"{flag}: a MindSpore mapping, not applicable to PyTorch dumps; ignored")
    return notes


def run(args: argparse.Namespace) -> int:
    """Parse compare.json, run the compare, print each rank's first divergence and top suspects (the advisor
    file's lines: score, evidence, Excel row, user frame) and the report paths."""
    from parity.shared.compare.spec import load_compare_spec
    from parity.shared.errors import CompareInputError

    if args.replay < 0:
        raise CompareInputError(f"--replay must be 0 or more, got {args.replay}")
    if args.workers is not None and args.workers < 1:
        raise CompareInputError(f"--workers must be at least 1, got {args.workers}")
    mapping = None
    if args.data_mapping is not None:
        from parity.shared.compare.mapping import load_data_mapping

        if args.fuzzy_match:
            raise CompareInputError(f"-dm {args.data_mapping}: a data mapping cannot be combined with -f "
                                    "(as in msprobe)")  # fmt: skip
        mapping = load_data_mapping(args.data_mapping)
    for note in msprobe_flag_notes(args):
        sys.stderr.write(f"parity compare: note: {note}\n")
    spec = load_compare_spec(args.input_path)
    if mapping is not None and spec.multi_rank:
        raise CompareInputError(f"-dm {args.data_mapping}: a data mapping names the rows of one rank; "
                                f"{args.input_path} compares step directories (as in msprobe, -dm takes "
                                "two dump.json files)")  # fmt: skip

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
            )
    finally:
        if bar is not None:
            bar.close()

    out = sys.stdout
    for result in outputs.results:
        where = f"rank {result.rank}: " if result.rank is not None else ""
        counts = result.summary()["status_counts"]
        assert isinstance(counts, dict)
        shown = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
        out.write(f"{where}{len(result.rows)} rows ({shown or 'none'}), {result.mode.value} mode\n")
        if result.suspects:
            # The advisor file's own lines (one formatter): the first divergence, then the ranked suspects.
            for line in suspect_lines(result.suspects, result.first_divergence, limit=TOP_SUSPECTS):
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
