"""``parity runs list|delete|baseline``: find, remove and promote runs on a server, in the REST API's words.

``list`` takes the filters ``GET /runs`` does (``--tag KEY=VALUE`` as on ``parity upload``, ``--name`` exact,
``--name-contains`` a substring in any case) and prints one run per line. ``delete`` takes a run id or name
and refuses a run that comparisons use unless ``--with-comparisons`` is given, as the server does.
``baseline`` makes a run (id or name, ``--project`` to look the name up in) its project's baseline
(``PATCH /runs/{run}`` with ``{"baseline": true}``).
"""

from __future__ import annotations

import argparse
import sys

from parity.client.errors import ClientError
from parity.commands import server_args, upload
from parity.shared.contract import RunPublic

#: Comparisons named in the refusal of a delete.
LISTED = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    listing = actions.add_parser("list", help="list runs, newest first", description="List runs.")
    server_args.add_server_arguments(listing)
    listing.add_argument("--project", default=None, help="only runs of this project")
    listing.add_argument("--name", default=None, help="only runs of exactly this name")
    listing.add_argument("--name-contains", default=None, metavar="TEXT", help="only names holding TEXT")
    listing.add_argument("--status", default=None, choices=("uploading", "validating", "complete", "invalid"))
    listing.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                         help="only runs with this tag (repeatable: all of them)")
    listing.add_argument("--limit", type=int, default=50, help="at most this many runs (default: 50)")
    delete = actions.add_parser("delete", help="delete a run and its files",
                                description="Delete a run and its files.")  # fmt: skip
    delete.add_argument("run", metavar="RUN", help="run id or name")
    server_args.add_server_arguments(delete)
    delete.add_argument("--with-comparisons", action="store_true",
                        help="also delete the comparisons that use the run, and their reports")
    baseline = actions.add_parser(
        "baseline", help="make a run its project's baseline (auto-compare and regressions use it)",
        description="Make a run its project's baseline: later runs of the project are compared with it.",
    )  # fmt: skip
    baseline.add_argument("run", metavar="RUN", help="run id or name")
    baseline.add_argument("--project", default=None, help="project to look the name up in")
    server_args.add_server_arguments(baseline)


def format_run(run: RunPublic) -> str:
    """One line: id, project/name, status, device, size, steps and ranks, tags as KEY=VALUE."""
    tags = " ".join(f"{k}={v}" for k, v in sorted(run.tags.items()))
    return (
        f"{run.id}  {run.project}/{run.name}  {run.status}  {run.device}  "
        f"{run.file_count} files {run.total_bytes / 1e6:.1f} MB  steps {run.steps} ranks {run.ranks}"
        + (f"  {tags}" if tags else "")
    )


def run(args: argparse.Namespace) -> int:
    with server_args.connect(args) as api:
        if args.action == "list":
            runs, total = api.list_runs(
                name=args.name, name_contains=args.name_contains, project=args.project, status=args.status,
                tags=upload.parse_tags(args.tag), limit=args.limit,
            )  # fmt: skip
            for r in runs:
                sys.stdout.write(format_run(r) + "\n")
            if total > len(runs):
                sys.stderr.write(f"parity runs: {len(runs)} of {total} runs shown (raise --limit)\n")
            return 0
        if args.action == "baseline":
            run = api.set_baseline(args.run, project=args.project)
            sys.stderr.write(f"parity runs: run {run.id} ({run.name}) is the baseline of project "
                             f"{run.project!r}\n")  # fmt: skip
            return 0
        if not args.with_comparisons:
            # Said in the CLI's words; the server refuses the same delete on its own (409) in any case.
            used, total = api.list_comparisons(run=args.run, limit=LISTED)
            if total:
                ids = ", ".join(c.id for c in used) + (", ..." if total > len(used) else "")
                raise ClientError(
                    f"run {args.run} is used by {total} comparison(s) ({ids}): deleting it deletes them and "
                    "their reports too; nothing deleted: pass --with-comparisons to do so"
                )
        api.delete_run(args.run, with_comparisons=args.with_comparisons)
        sys.stderr.write(f"parity runs: run {args.run} deleted\n")
        return 0
