"""``parity regressions COMPARISON_ID --server URL [--limit N]``: what changed since the previous comparison
against the baseline, for a comparison that exists.

The lines ``compare-runs --wait`` prints above the suspects (``shared.report.regressions.regression_lines``,
in the comparison page's words): how many failing APIs are new, worse, fixed and known, then the changed
ones, ``worse`` and ``new`` first, each with its error before and after. A comparison that was not against
its project's baseline has no regressions: the command says so and exits 1; one not finished exits 2.
"""

from __future__ import annotations

import argparse
import sys

from parity.client.errors import ClientError
from parity.commands import server_args
from parity.shared.report.regressions import regression_lines

EXIT_NOT_AGAINST_BASELINE = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("comparison", metavar="COMPARISON_ID", help="the comparison's id")
    parser.add_argument("--limit", type=int, default=10, help="changed APIs to list (default: 10)")
    server_args.add_server_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise ClientError(f"--limit: {args.limit} lists nothing; give 1 or more")
    with server_args.connect(args) as api:
        info = api.get_comparison(args.comparison)
        if info.status != "succeeded":
            raise ClientError(f"comparison {info.id} is {info.status}: its regressions are judged once it "
                              "succeeded (parity compare-runs --wait waits for it)")  # fmt: skip
        found = api.regressions(info.id)
    if not found.against_baseline:
        sys.stderr.write(f"parity regressions: comparison {info.id} was not against its project's baseline: "
                         "nothing to judge new or worse (parity runs baseline NAME sets one)\n")  # fmt: skip
        return EXIT_NOT_AGAINST_BASELINE
    sys.stdout.writelines(f"{line}\n" for line in regression_lines(found, limit=args.limit))
    return 0
