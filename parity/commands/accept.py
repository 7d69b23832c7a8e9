"""``parity accept API [API ...] --note TEXT [--project P]`` / ``parity accept API ... --revoke``: the team's
word on failing APIs. ``--new-in COMPARISON_ID`` names every API that comparison judges new (the first
nightly's drift, accepted in one command).

An accepted API counts as known in its project's comparisons against the baseline, with the note saying why
(a bf16 drift the team lives with); revoking the acceptance makes it fail as new or worse again. The
server records who accepted (the token's name or fingerprint); ``--author`` adds free text beside it.
"""

from __future__ import annotations

import argparse
import sys

from parity.client.errors import ClientError
from parity.commands import server_args
from parity.shared.naming import check_name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("apis", metavar="API", nargs="*", help="the APIs as the comparison names them, e.g. "
                        "Functional.gelu.1.forward")  # fmt: skip
    parser.add_argument("--new-in", metavar="COMPARISON_ID", default=None,
                        help="also every API this comparison judges new against the baseline")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--note", help="why the failure is accepted (shown beside it on every comparison)")
    what.add_argument("--revoke", action="store_true", help="withdraw the acceptance: the API fails again")
    parser.add_argument("--project", default="default", help="project of the acceptance (default: default)")
    parser.add_argument("--author", default=None, help="free text kept beside the note (who, a ticket)")
    server_args.add_server_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.revoke and args.author:
        raise ClientError("--author goes with --note, not with --revoke")
    if args.note is not None and not args.note.strip():
        raise ClientError("--note: say why the failure is accepted (the note is shown beside it)")
    if not args.apis and args.new_in is None:
        raise ClientError("name the APIs to accept (or --new-in COMPARISON_ID for every new one)")
    project = check_name(args.project, "--project")  # a project no path could name has no acceptances
    with server_args.connect(args) as api:
        apis = list(dict.fromkeys(args.apis))
        if args.new_in is not None:
            new = [v.api for v in api.regressions(args.new_in).data if v.verdict == "new"]
            if not new:
                sys.stderr.write(f"parity accept: comparison {args.new_in} judges no API new\n")
            apis += [a for a in new if a not in apis]
        for name in apis:
            if args.revoke:
                api.revoke_acceptance(project, name)
                sys.stderr.write(f"parity accept: {name} is no longer accepted in project {project!r}\n")
                continue
            done = api.accept(project, name, args.note.strip(), author=args.author)
            sys.stderr.write(f"parity accept: {done.api} accepted in project {done.project!r} by "
                             f"{done.accepted_by}: {done.note}\n")  # fmt: skip
    return 0
