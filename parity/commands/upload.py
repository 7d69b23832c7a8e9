"""``parity upload DUMP_DIR --server URL --name NAME``: send an existing dump directory to a Parity server.

DUMP_DIR is a dump root holding ``step*/rank*`` (Parity's or msprobe's layout), one step folder, or one rank
folder holding dump.json. msprobe's unnumbered ``rank`` or ``proc{pid}`` folder is stored as ``rank0`` when it
is the only rank folder of its step. Run names are unique in a project, so an upload under a name that exists
resumes it (still ``uploading``), does nothing (``complete`` with this very dump) or is refused (``complete``
with anything else); see :func:`parity.client.upload.upload_dump`. On a terminal a progress bar is redrawn in
place; elsewhere (a CI log) a line is written at each tenth of the bytes; ``--quiet`` shows nothing but errors
and, on stdout, the run id. The work is :func:`parity.client.upload.upload_dump`; this module parses
arguments and prints. Once every file is sent it completes the run and waits (``--wait``) until the server's
workers have validated it: exit 0 with the run ``complete``, or 2 with their error naming the file and entry.
The name, project and tags follow :mod:`parity.shared.naming` (trimmed; a ``/`` or a control character is
refused before anything is read). The environment the training client wrote beside the dump
(``parity_environment.json``) is sent as the run's metadata, and its device is the default of ``--device``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from parity.client.errors import ClientError
from parity.client.run_metadata import ENVIRONMENT_FILE
from parity.client.upload import upload_dump
from parity.commands import server_args
from parity.progress import TransferProgress
from parity.shared.contract import split_tag
from parity.shared.naming import check_name, check_tags

DEVICES = ("npu", "gpu", "cpu", "other")


def parse_tags(values: Sequence[str] | None) -> dict[str, str]:
    """``--tag KEY=VALUE`` values as a dict, split at the first ``=`` as the server's ``tag=`` filter does;
    a value without ``=`` is an error naming it."""
    tags: dict[str, str] = {}
    for value in values or ():
        try:
            key, val = split_tag(value)
        except ValueError:
            raise ClientError(f"--tag {value!r}: expected KEY=VALUE") from None
        tags[key] = val
    return tags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dump_dir", type=Path, metavar="DUMP_DIR",
                        help="dump root holding step*/rank* (or one step or rank folder)")
    server_args.add_server_arguments(parser)
    parser.add_argument("--name", required=True,
                        help="run name, unique in its project (an unfinished upload of it is resumed)")
    parser.add_argument("--project", default="default", help="project of the run (default: default)")
    parser.add_argument("--device", default=None, choices=DEVICES,
                        help="device the dump was taken on (default: the one the training client recorded "
                        f"beside the dump in {ENVIRONMENT_FILE}, else other)")
    parser.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                        help="run tag (repeatable)")
    parser.add_argument("--jobs", type=int, default=4, help="files uploaded in parallel (default: 4)")
    parser.add_argument("--wait", type=float, default=3600.0, metavar="SECONDS",
                        help="how long to wait for the server's workers to validate the run (default: 3600; "
                        "0: return once it is validating)")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress and no summary: only errors, and the run id on stdout")


def run(args: argparse.Namespace) -> int:
    # the server's rule (parity.shared.naming), said in the options' words before anything is read
    name, project = check_name(args.name, "--name"), check_name(args.project, "--project")
    tags = check_tags(parse_tags(args.tag), "--tag")
    progress = TransferProgress("parity upload", quiet=args.quiet)
    try:
        with server_args.connect(args) as api:
            done = upload_dump(
                api, args.dump_dir, name=name, project=project, device=args.device, tags=tags,
                jobs=args.jobs, on_progress=progress, wait_s=args.wait,
            )  # fmt: skip
    finally:
        progress.close()
    if not args.quiet:
        sys.stderr.write(
            f"parity upload: run {done.id} ({done.name}) {done.status}: {done.file_count} files, "
            f"{done.total_bytes / 1e6:.1f} MB, steps {done.steps}, ranks {done.ranks}\n"
        )
    sys.stdout.write(f"{done.id}\n")
    return 0
