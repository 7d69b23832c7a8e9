"""``parity compare-runs TARGET BENCH --server URL [--wait] [-o OUT]``: compare two uploaded runs on a server.

TARGET and BENCH are run ids or run names (a name must match exactly one run; otherwise the error lists the
candidate ids). Without ``--wait`` the command queues the comparison and prints its id. With ``--wait`` it
first waits for a run the server is still validating (just uploaded), then polls until the comparison is
done, downloads ``report.xlsx`` and ``advisor.txt`` into OUT under msprobe's names
(``compare_result_{ts}.xlsx``, or ``compare_result_rank{R}_{ts}.xlsx`` per rank when there are several) and
the summary JSON as ``compare_summary_{ts}.json`` (as ``parity compare`` names it), and prints, when BENCH
is its project's baseline, what changed since the previous comparison against it (``new`` and ``worse``
first, each with its error before and after), then the top suspects. Both say which step was compared and
which other steps both runs hold (a comparison covers one step; ``--step`` picks it). Asking for a
comparison that exists returns it (a failed one is retried), so ``compare-runs TARGET BENCH --wait`` again
prints an existing comparison's regressions and suspects.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from parity.client.errors import ClientError
from parity.client.reports import download_reports, summary_lines
from parity.client.rest import ApiError, ParityClient
from parity.client.upload import wait_validated
from parity.commands import server_args
from parity.shared.contract import ComparisonPublic, RunPublic
from parity.shared.report.regressions import regression_lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="TARGET", help="run id or name of the run under test (e.g. NPU)")
    parser.add_argument("bench", metavar="BENCH", help="run id or name of the reference run (e.g. GPU)")
    server_args.add_server_arguments(parser)
    parser.add_argument("--project", default=None, help="project to look run names up in")
    parser.add_argument("--step", type=int, default=None, help="step to compare (default: the server's)")
    parser.add_argument("--rank", type=int, nargs="+", action="extend", dest="ranks", default=None,
                        metavar="R", help="ranks to compare (default: all)")
    parser.add_argument("--fuzzy-match", action="store_true", help="pair APIs whose call counts differ")
    parser.add_argument("--stack-mode", action="store_true", help="add the call stack of each API")
    parser.add_argument("--wait", action="store_true",
                        help="wait for the runs' validation and the result, and download the reports")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds --wait waits in all (default: 1800)")  # fmt: skip
    parser.add_argument("-o", "--output", type=Path, default=Path("."), help="folder for the reports")


def _ready(api: ParityClient, role: str, ref: str, args: argparse.Namespace, deadline: float) -> RunPublic:
    """The run ``ref`` once complete; with ``--wait`` a ``validating`` one (just uploaded) is waited for."""
    run = api.resolve_run(ref, project=args.project)
    if run.status == "validating" and args.wait:
        sys.stderr.write(f"parity compare-runs: {role} run {run.id} ({run.name}) is validating; waiting\n")
        run = wait_validated(api, run, wait_s=max(0.0, deadline - time.monotonic()))
    if run.status != "complete":
        reason = f": {run.error}" if run.error else ""
        hint = " (--wait waits for it)" if run.status == "validating" else ""
        raise ClientError(f"{role} run {run.id} ({run.name}) is {run.status}, not complete{reason}{hint}")
    return run


def step_line(info: ComparisonPublic, target: RunPublic, bench: RunPublic) -> str:
    """Which step the comparison covers, and which other steps both runs hold (``--step`` picks one)."""
    common = sorted(set(target.steps) & set(bench.steps))
    others = [s for s in common if s != info.step]
    if not others:
        return f"step {info.step} compared (the only step both runs hold)"
    listed = ", ".join(map(str, others[:10])) + (", ..." if len(others) > 10 else "")
    return f"step {info.step} compared; both runs also hold step{'s' if len(others) > 1 else ''} {listed} " \
           f"(--step N compares another)"


def changed_lines(api: ParityClient, info: ComparisonPublic) -> list[str]:
    """What changed since the previous comparison against the baseline (``regression_lines``); empty when
    the comparison is not against its project's baseline, or the server predates the regressions route."""
    if not info.against_baseline:
        return []
    try:
        return regression_lines(api.regressions(info.id))
    except ApiError as exc:
        if exc.status_code != 404:
            raise
        return []


def run(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    with server_args.connect(args) as api:
        target = _ready(api, "TARGET", args.target, args, deadline)
        bench = _ready(api, "BENCH", args.bench, args, deadline)
        info = api.create_comparison(
            target.id, bench.id, step=args.step, ranks=args.ranks,
            fuzzy_match=args.fuzzy_match, stack_mode=args.stack_mode,
        )
        sys.stderr.write(
            f"parity compare-runs: comparison {info.id} {info.status}: "
            f"{target.name} ({target.id}) vs {bench.name} ({bench.id}), {step_line(info, target, bench)}\n"
        )
        if not args.wait:
            sys.stdout.write(f"{info.id}\n")
            return 0

        last = [-1.0]

        def show(i: ComparisonPublic) -> None:
            if i.progress - last[0] >= 0.1 or i.status in ("succeeded", "failed"):
                last[0] = i.progress
                sys.stderr.write(f"parity compare-runs: {i.status} {i.progress:.0%}\n")

        remaining = max(0.0, deadline - time.monotonic())
        info = api.wait_for_comparison(info.id, timeout=remaining, on_progress=show)
        if info.status != "succeeded":
            raise ClientError(f"comparison {info.id} failed: {info.error or 'no reason given'}")
        paths = download_reports(api, info, args.output)
        changed = changed_lines(api, info)
    lines = [step_line(info, target, bench), *changed, *summary_lines(info)]
    sys.stdout.writelines(f"{line}\n" for line in lines)
    for path in paths:
        sys.stdout.write(f"wrote {path}\n")
    return 0
