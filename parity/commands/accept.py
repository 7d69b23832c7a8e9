"""``parity accept API --note TEXT [--project P]`` / ``parity accept API --revoke``: the team's word on a
failing API.

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
    parser.add_argument("api", metavar="API", help="the API as the comparison names it, e.g. "
                        "Functional.gelu.1.forward")  # fmt: skip
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
    project = check_name(args.project, "--project")  # a project no path could name has no acceptances
    with server_args.connect(args) as api:
        if args.revoke:
            api.revoke_acceptance(project, args.api)
            sys.stderr.write(f"parity accept: {args.api} is no longer accepted in project {project!r}\n")
            return 0
        done = api.accept(project, args.api, args.note.strip(), author=args.author)
    sys.stderr.write(f"parity accept: {done.api} accepted in project {done.project!r} by {done.accepted_by}: "
                     f"{done.note}\n")  # fmt: skip
    return 0
