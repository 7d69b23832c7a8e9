"""``parity upload DUMP_DIR --server URL --name NAME``: send an existing dump directory to a Parity server.

DUMP_DIR is a dump root holding ``step*/rank*`` (Parity's or msprobe's layout), one step folder, or one rank
folder holding dump.json. msprobe's unnumbered ``rank`` or ``proc{pid}`` folder is stored as ``rank0`` when it
is the only rank folder of its step. An interrupted upload is resumed rather than duplicated: if the server
has a run of that name and project still ``uploading``, only the files it lacks are sent. The work is
:func:`parity.client.upload.upload_dump`; this module parses arguments and prints.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from parity.client.errors import ClientError
from parity.client.upload import UploadProgress, upload_dump
from parity.commands import server_args

DEVICES = ("npu", "gpu", "cpu", "other")


def parse_tags(values: Sequence[str] | None) -> dict[str, str]:
    """``--tag k=v`` values as a dict; a value without ``=`` is an error naming it."""
    tags: dict[str, str] = {}
    for value in values or ():
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise ClientError(f"--tag {value!r}: expected KEY=VALUE")
        tags[key] = val
    return tags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dump_dir", type=Path, metavar="DUMP_DIR",
                        help="dump root holding step*/rank* (or one step or rank folder)")
    server_args.add_server_arguments(parser)
    parser.add_argument("--name", required=True, help="run name (an uploading run of this name is resumed)")
    parser.add_argument("--project", default="default", help="project of the run (default: default)")
    parser.add_argument("--device", default="other", choices=DEVICES, help="device the dump was taken on")
    parser.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                        help="run tag (repeatable)")
    parser.add_argument("--jobs", type=int, default=4, help="files uploaded in parallel (default: 4)")


class ProgressLines:
    """Progress lines on ``stream``, at most one a second, and always the last one."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._last = 0.0

    def __call__(self, p: UploadProgress) -> None:
        now = time.monotonic()
        if now - self._last < 1.0 and not p.finished:
            return
        self._last = now
        rate = p.bytes_sent / max(p.elapsed_s, 1e-9) / 1e6
        self.stream.write(
            f"parity upload: {p.files_done}/{p.files_total} files, "
            f"{p.bytes_done / 1e6:.1f}/{p.bytes_total / 1e6:.1f} MB, {rate:.1f} MB/s\n"
        )
        self.stream.flush()


def run(args: argparse.Namespace) -> int:
    tags = parse_tags(args.tag)
    with server_args.connect(args) as api:
        done = upload_dump(
            api, args.dump_dir, name=args.name, project=args.project, device=args.device, tags=tags,
            jobs=args.jobs, on_progress=ProgressLines(sys.stderr),
        )  # fmt: skip
    sys.stderr.write(
        f"parity upload: run {done.id} ({done.name}) {done.status}: {done.file_count} files, "
        f"{done.total_bytes / 1e6:.1f} MB, steps {done.steps}, ranks {done.ranks}\n"
    )
    sys.stdout.write(f"{done.id}\n")
    return 0
