"""``parity upload DUMP_DIR --server URL --name NAME``: send an existing dump directory to a Parity server.

DUMP_DIR is a dump root holding ``step*/rank*`` (Parity's or msprobe's layout). msprobe's unnumbered ``rank``
folder and its ``proc{pid}`` folder are stored as ``rank0`` when they are the only rank folder of their step.
A step directory (``step3``) or a single rank directory (one holding dump.json) is accepted too and stored
under its own step and rank numbers.

Run names are unique in a project (the server refuses a second run of a name), so an upload under a name
that exists is either a resume or refused:

* the run is still ``uploading`` (an interrupted upload): the files it holds with the same sha256 are
  skipped, the rest are sent to it, and it is completed;
* the run is ``complete`` and holds exactly this dump (same paths, same sha256): nothing is sent, and the
  command succeeds with that run, so a script may run the same upload twice;
* the run is ``complete`` and holds anything else: refused, naming the differences. A complete run is never
  changed, since the comparisons made from it would then describe files it no longer holds; delete it
  (``parity runs delete NAME --with-comparisons``) or choose another ``--name``.

On a terminal a progress bar is redrawn in place; elsewhere (a CI log) a line is written at each quarter of
the bytes; ``--quiet`` shows nothing but errors and, on stdout, the run id.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.client.errors import ClientError, UploadError
from parity.client.rest import ParityClient, RunInfo, sha256_file
from parity.client.uploader import iter_dump_files, retry_call
from parity.progress import TransferProgress

log = logging.getLogger(__name__)

_STEP = re.compile(r"^step(0|[1-9][0-9]*)$")
_RANK = re.compile(r"^rank(0|[1-9][0-9]*)$")
_LOOSE_RANK = re.compile(r"^(rank|proc[0-9]+)$")  # msprobe's unnumbered folders
_DUMP_FILES = ("dump.json", "debug.json")
DEVICES = ("npu", "gpu", "cpu", "other")


@dataclass(frozen=True)
class DumpFile:
    """One file to upload: its path on the server (relative to the dump root) and on disk."""

    rel: str
    path: Path


def _rank_dirs(step_dir: Path) -> list[tuple[int, Path]]:
    """The rank folders of one step with their rank numbers (msprobe's loose folder → 0 when alone)."""
    numbered: list[tuple[int, Path]] = []
    loose: list[Path] = []
    for child in sorted(step_dir.iterdir()):
        if not child.is_dir() or child.is_symlink():
            continue
        if m := _RANK.match(child.name):
            numbered.append((int(m[1]), child))
        elif _LOOSE_RANK.match(child.name):
            loose.append(child)
        else:
            log.warning("%s: not a rank folder, skipped", child)
    if loose:
        if len(loose) == 1 and not numbered:
            return [(0, loose[0])]
        names = ", ".join(sorted(p.name for p in [*loose, *(d for _, d in numbered)]))
        raise ClientError(
            f"{step_dir}: cannot number its rank folders ({names}): an unnumbered 'rank' or 'proc{{pid}}' "
            "folder is stored as rank0 only when it is the only rank folder of its step"
        )
    return numbered


def _rank_number(rank_dir: Path) -> int:
    if m := _RANK.match(rank_dir.name):
        return int(m[1])
    return 0  # ``rank``, ``proc{pid}`` or a folder named by hand: a lone rank directory is rank 0


def find_rank_dirs(dump_dir: Path) -> list[tuple[int, int, Path]]:
    """``(step, rank, folder)`` for every rank folder of ``dump_dir`` (a dump root, a step or a rank dir)."""
    if not dump_dir.is_dir():
        raise ClientError(f"{dump_dir}: not a directory")
    if any((dump_dir / name).is_file() for name in _DUMP_FILES):  # a rank directory itself
        step_match = _STEP.match(dump_dir.parent.name)
        return [(int(step_match[1]) if step_match else 0, _rank_number(dump_dir), dump_dir)]
    if m := _STEP.match(dump_dir.name):
        found = [(int(m[1]), rank, d) for rank, d in _rank_dirs(dump_dir)]
    else:
        found = []
        for child in sorted(dump_dir.iterdir()):
            if child.is_dir() and (sm := _STEP.match(child.name)):
                found.extend((int(sm[1]), rank, d) for rank, d in _rank_dirs(child))
    if not found:
        raise ClientError(
            f"{dump_dir}: no step*/rank* folders (expected a dump root such as "
            "DUMP_DIR/step0/rank0/dump.json, a step folder, or a rank folder holding dump.json)"
        )
    for step, rank, d in found:
        if not any((d / name).is_file() for name in _DUMP_FILES):
            log.warning("%s: no dump.json (step %d rank %d); its other files are sent anyway", d, step, rank)
    return sorted(found)


def collect_files(dump_dir: Path) -> list[DumpFile]:
    """Every file to upload, with its server path ``step{N}/rank{R}/...``."""
    files: list[DumpFile] = []
    for step, rank, rank_dir in find_rank_dirs(dump_dir):
        files.extend(
            DumpFile(f"step{step}/rank{rank}/{p.relative_to(rank_dir).as_posix()}", p)
            for p in iter_dump_files(rank_dir)
        )
    return files


@dataclass(frozen=True)
class UploadProgress:
    """Where :func:`upload_dump` stands, handed to its ``on_progress`` after each file."""

    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    bytes_sent: int  # of bytes_done, those sent now (the rest the server already had)
    elapsed_s: float


class _Tally:
    """Counts finished files across the sending threads and reports each one to ``on_progress``."""

    def __init__(self, files: list[DumpFile], on_progress: Callable[[UploadProgress], None] | None) -> None:
        self.files_total = len(files)
        self.bytes_total = sum(f.path.stat().st_size for f in files)
        self.files_done = self.bytes_done = self.bytes_sent = 0
        self.start = time.monotonic()
        self.on_progress = on_progress
        self._lock = threading.Lock()

    def done(self, size: int, sent: bool) -> None:
        with self._lock:
            self.files_done += 1
            self.bytes_done += size
            self.bytes_sent += size if sent else 0
            if self.on_progress is not None:
                elapsed = time.monotonic() - self.start
                self.on_progress(UploadProgress(self.files_done, self.files_total, self.bytes_done,
                                                self.bytes_total, self.bytes_sent, elapsed))  # fmt: skip


def _existing_run(api: ParityClient, name: str, project: str) -> RunInfo | None:
    """The run called ``name`` in ``project``, if any. Servers from before names were unique may hold
    several: the newest uploading one is resumed, and several complete ones are an error listing them."""
    runs = api.find_runs(name=name, project=project)
    if len(runs) <= 1:
        return runs[0] if runs else None
    runs.sort(key=lambda r: str(r.get("created_at") or ""))
    uploading = [r for r in runs if r.get("status") != "complete"]
    if uploading:
        log.warning("%d runs named %r in project %r; resuming the newest uploading one, %s",
                    len(runs), name, project, uploading[-1]["id"])  # fmt: skip
        return uploading[-1]
    ids = ", ".join(r["id"] for r in runs)
    raise ClientError(f"project {project!r} has {len(runs)} complete runs named {name!r} ({ids}); "
                      "delete the extra ones or upload under another --name")  # fmt: skip


def _hash_all(files: Sequence[DumpFile], jobs: int) -> dict[str, str]:
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="parity-hash") as pool:
        return dict(zip((f.rel for f in files), pool.map(lambda f: sha256_file(f.path), files), strict=True))


def _check_same_dump(run: RunInfo, stored: Mapping[str, str], local: Mapping[str, str], project: str) -> None:
    """Nothing to do when the complete ``run`` holds exactly ``local``; otherwise an error naming how the
    two differ and what to do."""
    differ = sorted(p for p in local.keys() & stored.keys() if local[p] != stored[p])
    only_here = sorted(local.keys() - stored.keys())
    only_there = sorted(stored.keys() - local.keys())
    if not (differ or only_here or only_there):
        return
    parts = []
    for label, paths in (("differ", differ), ("only here", only_here), ("only on the server", only_there)):
        if paths:
            shown = ", ".join(paths[:3]) + (", ..." if len(paths) > 3 else "")
            parts.append(f"{len(paths)} file(s) {label} ({shown})")
    name = run.get("name")
    raise ClientError(
        f"run {run['id']} ({name!r} in project {project!r}) is complete and holds another dump: "
        f"{'; '.join(parts)}. A complete run is never changed: delete it (parity runs delete {name} "
        f"--project {project} --with-comparisons) or upload under another --name"
    )


def upload_dump(
    api: ParityClient,
    dump_dir: Path,
    *,
    name: str,
    project: str = "default",
    device: str = "other",
    tags: Mapping[str, str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    jobs: int = 4,
    retry_budget_s: float = 30.0,
    on_progress: Callable[[UploadProgress], None] | None = None,
    on_file: Callable[[DumpFile], None] | None = None,
) -> RunInfo:
    """Upload (or finish uploading) ``dump_dir`` as run ``name`` and complete it; returns the complete run.

    Files are hashed and sent by ``jobs`` threads; a transient failure is retried with back-off for
    ``retry_budget_s``. A path the server already holds with other content is an error: a resumed upload
    must not mix two dumps. A complete run of that name is returned as is when it holds this very dump, and
    refused otherwise (see the module docstring). ``on_progress`` hears of each file as it is done.
    """
    files = collect_files(dump_dir)
    run = _existing_run(api, name, project)
    stored: dict[str, str] = {}
    if run is not None:
        stored = {f["path"]: f["sha256"] for f in api.list_files(run["id"])}
        if run.get("status") == "complete":
            _check_same_dump(run, stored, _hash_all(files, jobs), project)
            log.info("run %s (%s) already holds this dump: nothing to send", run["id"], name)
            return run
        log.info("resuming run %s (%s): %d files already on the server", run["id"], name, len(stored))
    else:
        from parity import __version__

        meta = {
            "source": "parity upload",
            "dump_path": str(dump_dir.resolve()),
            "hostname": socket.gethostname(),
            "parity_version": __version__,
            **(metadata or {}),
        }
        run = api.create_run(name, project=project, device=device, tags=tags, metadata=meta)
        log.info("created run %s (%s)", run["id"], name)
    run_id = run["id"]
    tally = _Tally(files, on_progress)

    def send(item: DumpFile) -> None:
        digest = sha256_file(item.path)
        have = stored.get(item.rel)
        if have == digest:
            tally.done(item.path.stat().st_size, sent=False)
            return
        if have is not None:
            raise UploadError(
                f"{item.rel}: run {run_id} ({name}) already holds this path with other content "
                f"(sha256 {have[:12]}…, local {digest[:12]}…); delete that run or upload under another --name"
            )
        retry_call(
            lambda: api.upload_file(run_id, item.rel, item.path, sha256=digest),
            what=f"upload {item.rel}",
            budget_s=retry_budget_s,
        )
        if on_file is not None:
            on_file(item)
        tally.done(item.path.stat().st_size, sent=True)

    # dump.json files go after every other file of the dump (iter_dump_files orders each rank that way), and
    # are sent only once the rest is in, so a stored dump.json always finds its tensors on the server.
    data = [f for f in files if Path(f.rel).name not in _DUMP_FILES]
    index = [f for f in files if Path(f.rel).name in _DUMP_FILES]
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="parity-upload") as pool:
        for batch in (data, index):
            try:
                for future in [pool.submit(send, f) for f in batch]:
                    future.result()
            except BaseException:
                # The first error stops the command; what was sent stays on the server for a resume.
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    return retry_call(lambda: api.complete_run(run_id), what="complete run", budget_s=retry_budget_s)


def parse_tags(values: Sequence[str] | None) -> dict[str, str]:
    """``--tag KEY=VALUE`` values as a dict, split at the first ``=`` as the server's ``tag=`` filter does;
    a value without ``=`` is an error naming it."""
    tags: dict[str, str] = {}
    for value in values or ():
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise ClientError(f"--tag {value!r}: expected KEY=VALUE")
        tags[key] = val
    return tags


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """``--server`` and ``--token``, shared by every command that talks to a server."""
    parser.add_argument("--server", default=os.environ.get("PARITY_SERVER"),
                        help="server base URL, e.g. http://127.0.0.1:8000 (default: $PARITY_SERVER)")
    parser.add_argument("--token", default=os.environ.get("PARITY_TOKEN"),
                        help="bearer token when the server requires one (default: $PARITY_TOKEN)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dump_dir", type=Path, metavar="DUMP_DIR",
                        help="dump root holding step*/rank* (or one step or rank folder)")
    add_server_arguments(parser)
    parser.add_argument("--name", required=True,
                        help="run name, unique in its project (an unfinished upload of it is resumed)")
    parser.add_argument("--project", default="default", help="project of the run (default: default)")
    parser.add_argument("--device", default="other", choices=DEVICES, help="device the dump was taken on")
    parser.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                        help="run tag (repeatable)")
    parser.add_argument("--jobs", type=int, default=4, help="files uploaded in parallel (default: 4)")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress and no summary: only errors, and the run id on stdout")


def make_client(args: argparse.Namespace) -> ParityClient:
    """The REST client of a command (a seam for tests, which inject a mock transport)."""
    if not args.server:
        raise ClientError("no server given: pass --server URL or set PARITY_SERVER")
    return ParityClient(args.server, token=args.token)


def run(args: argparse.Namespace) -> int:
    tags = parse_tags(args.tag)
    progress = TransferProgress("parity upload", quiet=args.quiet)
    try:
        with make_client(args) as api:
            done = upload_dump(
                api, args.dump_dir, name=args.name, project=args.project, device=args.device, tags=tags,
                jobs=args.jobs, on_progress=progress,
            )
    finally:
        progress.close()
    if not args.quiet:
        sys.stderr.write(
            f"parity upload: run {done['id']} ({done.get('name')}) {done.get('status')}: "
            f"{done.get('file_count')} files, {int(done.get('total_bytes') or 0) / 1e6:.1f} MB, "
            f"steps {done.get('steps')}, ranks {done.get('ranks')}\n"
        )
    sys.stdout.write(f"{done['id']}\n")
    return 0
