"""``parity compare-runs TARGET BENCH --server URL [--wait] [-o OUT]``: compare two uploaded runs on a server.

TARGET and BENCH are run ids or run names (a name must match exactly one run; otherwise the error lists the
candidate ids). Without ``--wait`` the command queues the comparison and prints its id. With ``--wait`` it
polls until the comparison is done, downloads ``report.xlsx`` and ``advisor.txt`` into OUT under msprobe's
names (``compare_result_{ts}.xlsx``, or ``compare_result_rank{R}_{ts}.xlsx`` per rank when there are
several) and the summary JSON as ``compare_summary_{ts}.json`` (as ``parity compare`` names it), and prints
the top suspects. Asking for a comparison that exists returns it (a failed one is retried).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from parity.client.errors import ClientError
from parity.client.rest import ApiError, ComparisonInfo, ParityClient
from parity.commands import upload

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="TARGET", help="run id or name of the run under test (e.g. NPU)")
    parser.add_argument("bench", metavar="BENCH", help="run id or name of the reference run (e.g. GPU)")
    upload.add_server_arguments(parser)
    parser.add_argument("--project", default=None, help="project to look run names up in")
    parser.add_argument("--step", type=int, default=None, help="step to compare (default: the server's)")
    parser.add_argument("--rank", type=int, nargs="+", action="extend", dest="ranks", default=None,
                        metavar="R", help="ranks to compare (default: all)")
    parser.add_argument("--fuzzy-match", action="store_true", help="pair APIs whose call counts differ")
    parser.add_argument("--stack-mode", action="store_true", help="add the call stack of each API")
    parser.add_argument("--wait", action="store_true", help="wait for the result and download the reports")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds --wait waits (default: 1800)")
    parser.add_argument("-o", "--output", type=Path, default=Path("."), help="folder for the reports")


def report_names(ranks: Sequence[int], stamp: str) -> list[tuple[int | None, str, str]]:
    """``(rank to ask for, xlsx name, advisor name)``: msprobe's names, per rank when there are several."""
    if len(ranks) <= 1:
        return [(None, f"compare_result_{stamp}.xlsx", f"advisor_{stamp}.txt")]
    return [(r, f"compare_result_rank{r}_{stamp}.xlsx", f"advisor_rank{r}_{stamp}.txt") for r in ranks]


def download_reports(api: ParityClient, info: ComparisonInfo, out_dir: Path) -> list[Path]:
    """Download every report and advisor of a succeeded comparison, then its summary JSON, into ``out_dir``;
    returns their paths."""
    summary = info.get("summary") or {}
    ranks = [int(r) for r in summary.get("ranks") or info.get("ranks") or []]
    stamp = time.strftime("%Y%m%d%H%M%S")
    paths: list[Path] = []
    for rank, xlsx, advisor in report_names(ranks, stamp):
        paths.append(api.download(info["id"], "report.xlsx", out_dir / xlsx, rank=rank))
        paths.append(api.download(info["id"], "advisor.txt", out_dir / advisor, rank=rank))
    try:
        paths.append(api.download(info["id"], "summary.json", out_dir / f"compare_summary_{stamp}.json"))
    except ApiError as exc:
        if exc.status_code != 404:
            raise
        # A server from before summaries were stored (or a comparison it finished then): the reports suffice.
        log.warning("no summary JSON: %s", exc.detail)
    return paths


def print_summary(info: ComparisonInfo, out: TextIO, limit: int = 10) -> None:
    """The comparison's verdict and its top suspects, one line each."""
    summary: dict[str, Any] = info.get("summary") or {}
    out.write(
        f"comparison {info['id']}: {summary.get('rows', 0)} rows, {summary.get('failing_rows', 0)} failing, "
        f"{len(summary.get('failing_apis') or [])} failing APIs (mode {summary.get('mode', '?')})\n"
    )
    suspects = summary.get("top_suspects") or []
    if not suspects:
        out.write("no suspects: every compared API agrees within tolerance\n")
        return
    out.write("top suspects (where precision is first lost):\n")
    for s in suspects[:limit]:
        where = f" [{' '.join(str(s['stack']).split())}]" if s.get("stack") else ""
        out.write(
            f"  {s.get('rank')}. {s.get('api')} ({s.get('direction')}, rank {s.get('compare_rank', 0)}): "
            f"{s.get('reason')}{where}\n"
        )


def run(args: argparse.Namespace) -> int:
    with upload.make_client(args) as api:  # looked up at call time: tests swap in a mock transport
        target = api.resolve_run(args.target, project=args.project)
        bench = api.resolve_run(args.bench, project=args.project)
        for role, r in (("TARGET", target), ("BENCH", bench)):
            if r.get("status") != "complete":
                raise ClientError(
                    f"{role} run {r['id']} ({r.get('name')}) is {r.get('status')}, not complete"
                    + (f": {r['error']}" if r.get("error") else "")
                )
        info = api.create_comparison(
            target["id"], bench["id"], step=args.step, ranks=args.ranks,
            fuzzy_match=args.fuzzy_match, stack_mode=args.stack_mode,
        )
        sys.stderr.write(
            f"parity compare-runs: comparison {info['id']} {info.get('status')}: "
            f"{target.get('name')} ({target['id']}) vs {bench.get('name')} ({bench['id']})\n"
        )
        if not args.wait:
            sys.stdout.write(f"{info['id']}\n")
            return 0

        last = [-1.0]

        def show(i: ComparisonInfo) -> None:
            progress = float(i.get("progress") or 0.0)
            if progress - last[0] >= 0.1 or i.get("status") in ("succeeded", "failed"):
                last[0] = progress
                sys.stderr.write(f"parity compare-runs: {i.get('status')} {progress:.0%}\n")

        info = api.wait_for_comparison(info["id"], timeout=args.timeout, on_progress=show)
        if info.get("status") != "succeeded":
            raise ClientError(f"comparison {info['id']} failed: {info.get('error') or 'no reason given'}")
        paths = download_reports(api, info, args.output)
    print_summary(info, sys.stdout)
    for path in paths:
        sys.stdout.write(f"wrote {path}\n")
    return 0
