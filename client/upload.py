"""Sending a dump to a Parity server, resumable: the one implementation both uploaders use.

``parity upload`` (:func:`upload_dump`, a dump folder already on disk) and the training job's
:class:`~parity.client.uploader.BackgroundUploader` (rank folders as their steps are flushed) both go through
:class:`RunFiles`, which knows what the server already holds for a run: a file stored there with the same
sha256 is never sent twice, a path stored with other content is refused (a resumed upload must not mix two
dumps), and each request is retried with bounded back-off by :func:`retry_call`. Where the files go on the
server (``step{N}/rank{R}/...``) comes from :mod:`parity.shared.dump.layout`.

Example::

    with ParityClient("http://parity:8000") as api:
        run = upload_dump(api, Path("dump"), name="llama-npu", device="npu")
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

from parity.client.errors import RunInvalid, UploadError
from parity.client.rest import ParityClient, sha256_file
from parity.client.run_metadata import read_environment
from parity.shared.contract import RunPublic
from parity.shared.dump.layout import DEBUG_JSON, DUMP_JSON, find_dump_ranks, stored_prefix
from parity.shared.naming import NameRefused, check_name, check_tags
from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential

__all__ = [
    "DumpFile",
    "RunFiles",
    "UploadProgress",
    "check_same_dump",
    "collect_files",
    "find_resumable",
    "iter_dump_files",
    "retry_call",
    "upload_dump",
    "wait_validated",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Files whose content refers to other files: sent last, so a stored dump.json implies its tensors are there.
INDEX_FILES = (DUMP_JSON, DEBUG_JSON)

#: What sending one file did: ``stored`` (sent now) or ``present`` (the server had it with the same sha256).
Sent = Literal["stored", "present"]


@dataclass(frozen=True)
class DumpFile:
    """One file to upload: its path on the server (``step{N}/rank{R}/...``) and on disk."""

    rel: str
    path: Path

    @property
    def is_index(self) -> bool:
        return self.path.name in INDEX_FILES


def iter_dump_files(rank_dir: Path) -> Iterator[Path]:
    """Every regular file under ``rank_dir`` (links are skipped: the server refuses them), dump.json last."""
    files = [p for p in rank_dir.rglob("*") if p.is_file() and not p.is_symlink()]
    files.sort(key=lambda p: (p.name in INDEX_FILES, p.relative_to(rank_dir).as_posix()))
    yield from files


def rank_files(step: int, rank: int, rank_dir: Path) -> list[DumpFile]:
    """The files of one rank folder with their server paths, dump.json last."""
    prefix = stored_prefix(step, rank)
    return [DumpFile(f"{prefix}/{p.relative_to(rank_dir).as_posix()}", p) for p in iter_dump_files(rank_dir)]


def collect_files(dump_dir: Path) -> list[DumpFile]:
    """Every file to upload from a dump root, a step folder or a rank folder (see ``find_dump_ranks``)."""
    files: list[DumpFile] = []
    for step, rank_dir in find_dump_ranks(dump_dir):
        if not rank_dir.has_dump:
            count = sum(1 for _ in iter_dump_files(rank_dir.path))
            log.warning("%s: step %d rank %d: %d files but no dump.json: the process died or was killed "
                        "before step() wrote it, so the step cannot be compared; its files are sent anyway",
                        rank_dir.path, step, rank_dir.number, count)  # fmt: skip
        files.extend(rank_files(step, rank_dir.number, rank_dir.path))
    return files


def retry_call(
    fn: Callable[[], T],
    *,
    what: str,
    budget_s: float,
    initial_backoff_s: float = 0.25,
    max_backoff_s: float = 8.0,
    wait: Callable[[float], Any] = time.sleep,
) -> T:
    """Call ``fn`` until it succeeds, retrying retryable :class:`UploadError` with exponential back-off
    (tenacity: ``initial_backoff_s``, doubled each try, at most ``max_backoff_s``).

    The total time spent waiting is bounded by ``budget_s`` (0 means a single try). A non-retryable error
    (a 4xx other than 408/429) is raised at once: trying the same request again cannot change the answer.
    """
    deadline = time.monotonic() + budget_s
    backoff = wait_exponential(multiplier=initial_backoff_s, max=max_backoff_s)

    def pause(state: RetryCallState) -> float:
        return max(0.0, min(backoff(state), deadline - time.monotonic()))

    def give_up(state: RetryCallState) -> T:
        assert state.outcome is not None
        tries = state.attempt_number
        raise UploadError(f"{state.outcome.exception()} (gave up after {tries} tries)") from None

    def log_retry(state: RetryCallState) -> None:
        assert state.outcome is not None and state.next_action is not None
        log.debug("%s failed (try %d), retrying in %.2f s: %s", what, state.attempt_number,
                  state.next_action.sleep, state.outcome.exception())  # fmt: skip

    retrying = Retrying(
        retry=retry_if_exception(lambda e: isinstance(e, UploadError) and getattr(e, "retryable", False)),
        stop=lambda state: deadline - time.monotonic() <= 0,
        wait=pause,
        sleep=wait,
        before_sleep=log_retry,
        retry_error_callback=give_up,
    )  # fmt: skip
    return retrying(fn)


#: How a request is made: ``call(what, fn)`` runs ``fn`` with the caller's retry policy.
Caller = Callable[[str, Callable[[], bool]], bool]


class RunFiles:
    """The files of one run on the server as far as this process knows, and the one way to add to them.

    ``held`` maps each stored path to its sha256; :meth:`resume` reads it from the server. Thread-safe:
    several threads may :meth:`send` at once.
    """

    def __init__(self, api: ParityClient, run: RunPublic, held: Mapping[str, str] | None = None) -> None:
        self.api = api
        self.run = run
        self._held = dict(held or {})
        self._lock = threading.Lock()

    @classmethod
    def resume(cls, api: ParityClient, run: RunPublic) -> RunFiles:
        """The run's files as the server lists them now (``GET /runs/{id}/files``)."""
        return cls(api, run, {f.path: f.sha256 for f in api.list_files(run.id)})

    def __len__(self) -> int:
        return len(self._held)

    def send(self, item: DumpFile, call: Caller) -> Sent:
        """Send ``item`` unless the server holds it already; a path held with other content is refused."""
        digest = sha256_file(item.path)
        with self._lock:
            have = self._held.get(item.rel)
        if have == digest:
            return "present"
        if have is not None:
            raise UploadError(
                f"{item.rel}: run {self.run.id} ({self.run.name}) already holds this path with other content "
                f"(sha256 {have[:12]}…, local {digest[:12]}…); delete that run or upload under another name"
            )
        api, run_id = self.api, self.run.id
        path = item.path
        stored = call(f"upload {item.rel}", lambda: api.upload_file(run_id, item.rel, path, sha256=digest))
        with self._lock:
            self._held[item.rel] = digest
        return "stored" if stored else "present"


@dataclass(frozen=True)
class UploadProgress:
    """Where :func:`upload_dump` stands, handed to its ``on_progress`` after each file."""

    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    bytes_sent: int  # of bytes_done, those sent now (the rest the server already had)
    elapsed_s: float

    @property
    def finished(self) -> bool:
        return self.files_done == self.files_total


class _Tally:
    """Counts finished files across the sending threads and reports each step to ``on_progress``."""

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
            progress = UploadProgress(self.files_done, self.files_total, self.bytes_done, self.bytes_total,
                                      self.bytes_sent, time.monotonic() - self.start)  # fmt: skip
            if self.on_progress is not None:
                self.on_progress(progress)


def find_resumable(api: ParityClient, name: str, project: str) -> RunPublic | None:
    """The run called ``name`` in ``project``, if any (names are unique in a project). Servers from before
    that rule may hold several: the newest unfinished one is resumed, and several complete ones are an error
    listing them."""
    runs = api.find_runs(name=name, project=project)
    if len(runs) <= 1:
        return runs[0] if runs else None
    runs.sort(key=lambda r: r.created_at)
    unfinished = [r for r in runs if r.status != "complete"]
    if unfinished:
        log.warning("%d runs named %r in project %r; resuming the newest unfinished one, %s",
                    len(runs), name, project, unfinished[-1].id)  # fmt: skip
        return unfinished[-1]
    ids = ", ".join(r.id for r in runs)
    raise UploadError(f"project {project!r} has {len(runs)} complete runs named {name!r} ({ids}); "
                      "delete the extra ones or upload under another name")  # fmt: skip


def _hash_all(files: list[DumpFile], jobs: int) -> dict[str, str]:
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="parity-hash") as pool:
        return dict(zip((f.rel for f in files), pool.map(lambda f: sha256_file(f.path), files), strict=True))


def check_same_dump(run: RunPublic, stored: Mapping[str, str], local: Mapping[str, str]) -> None:
    """Nothing to do when the complete ``run`` holds exactly ``local`` (path → sha256); otherwise an error
    naming how the two differ and what to do. A complete run is never changed: the comparisons made from it
    would describe files it no longer holds."""
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
    raise UploadError(
        f"run {run.id} ({run.name!r} in project {run.project!r}) is complete and holds another dump: "
        f"{'; '.join(parts)}. A complete run is never changed: delete it (parity runs delete {run.name} "
        f"--project {run.project} --with-comparisons) or upload under another --name"
    )


def upload_dump(
    api: ParityClient,
    dump_dir: Path,
    *,
    name: str,
    project: str = "default",
    device: str | None = None,
    tags: Mapping[str, str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    jobs: int = 4,
    retry_budget_s: float = 30.0,
    on_progress: Callable[[UploadProgress], None] | None = None,
    wait_s: float = 3600.0,
) -> RunPublic:
    """Upload (or finish uploading) ``dump_dir`` as run ``name`` and complete it; returns the complete run
    (validated by a server worker, waited for up to ``wait_s``: see :func:`complete_run`).

    ``name``, ``project`` and ``tags`` follow :mod:`parity.shared.naming` (trimmed, or an error naming the
    field before anything is sent). The environment the training client wrote beside the dump
    (:data:`~parity.client.run_metadata.ENVIRONMENT_FILE`) becomes the run's metadata, so comparisons show
    what differs between two runs' environments; its device is the one used when ``device`` is None.

    Names are unique in a project, so a run of that name is never made twice. An ``uploading`` one is
    resumed: only the files it lacks are sent. A ``complete`` one that holds exactly this dump (same paths,
    same sha256) is returned as it is, so the same upload may run twice; one that holds anything else is
    refused (:func:`check_same_dump`), naming the differences. Files are
    hashed and sent by ``jobs`` threads, every dump.json after every other file; a transient failure is
    retried with back-off for ``retry_budget_s``. The first error stops the upload, and what was sent stays
    on the server for the next resume.
    """
    try:  # the server's rule, before anything is read or sent; a trimmed name finds the run to resume
        name, project = check_name(name, "name"), check_name(project, "project")
        tags = check_tags(dict(tags or {}), "tags")
    except NameRefused as exc:
        raise UploadError(str(exc)) from None
    files = collect_files(dump_dir)
    run = find_resumable(api, name, project)
    if run is not None and run.status in ("complete", "validating"):
        stored = {f.path: f.sha256 for f in api.list_files(run.id)}
        check_same_dump(run, stored, _hash_all(files, jobs))
        log.info("run %s (%s) already holds this dump: nothing to send", run.id, name)
        if run.status == "validating":  # an earlier upload stopped waiting for its validation
            return complete_run(api, run.id, retry_budget_s=retry_budget_s, wait_s=wait_s)
        return run
    if run is not None:
        remote = RunFiles.resume(api, run)
        log.info("resuming run %s (%s): %d files already on the server", run.id, name, len(remote))
    else:
        from parity import __version__

        recorded, environment = read_environment(dump_dir)

        meta = {
            "source": "parity upload",
            "dump_path": str(dump_dir.resolve()),
            "hostname": socket.gethostname(),
            "parity_version": __version__,
            **environment,  # the training job's own, written beside the dump
            **(metadata or {}),
        }
        recorded = recorded if recorded in ("npu", "gpu", "cpu") else None
        run = api.create_run(name, project=project, device=device or recorded or "other", tags=tags,
                             metadata=meta)  # fmt: skip
        remote = RunFiles(api, run)
        log.info("created run %s (%s)", run.id, name)
    tally = _Tally(files, on_progress)

    def call(what: str, fn: Callable[[], bool]) -> bool:
        return retry_call(fn, what=what, budget_s=retry_budget_s)

    def send(item: DumpFile) -> None:
        sent = remote.send(item, call)
        tally.done(item.path.stat().st_size, sent == "stored")

    data = [f for f in files if not f.is_index]
    index = [f for f in files if f.is_index]
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="parity-upload") as pool:
        for batch in (data, index):  # a dump.json is sent only once every tensor of the dump is in
            try:
                for future in [pool.submit(send, f) for f in batch]:
                    future.result()
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    return complete_run(api, run.id, retry_budget_s=retry_budget_s, wait_s=wait_s)


#: Polls of a validating run: the first soon (a small dump validates in about a second), then less often.
FIRST_POLL_S, MAX_POLL_S = 0.2, 2.0


def complete_run(
    api: ParityClient, run_id: str, *, retry_budget_s: float = 30.0, wait_s: float = 3600.0,
    sleep: Callable[[float], Any] = time.sleep,
) -> RunPublic:  # fmt: skip
    """Complete the run and wait until a server worker has validated it: the run ``complete``.

    Raises :class:`RunInvalid` when the run turned out ``invalid`` (the message is the server's, naming
    the file and the entry), :class:`UploadError` when it is still ``validating`` after ``wait_s`` seconds
    (it completes on its own later; ``parity runs show`` tells). ``wait_s`` 0 returns the run as ``complete``
    answered (``validating``) without waiting.
    """
    run = retry_call(lambda: api.complete_run(run_id), what="complete run", budget_s=retry_budget_s)
    if wait_s <= 0:  # the caller follows the validation itself
        return run
    run = wait_validated(api, run, wait_s=wait_s, retry_budget_s=retry_budget_s, sleep=sleep)
    if run.status != "complete":
        raise RunInvalid(f"run {run_id} ({run.name!r}) is {run.status}: {run.error or 'no reason given'}")
    return run


def wait_validated(
    api: ParityClient, run: RunPublic, *, wait_s: float, retry_budget_s: float = 30.0,
    sleep: Callable[[float], Any] = time.sleep,
) -> RunPublic:  # fmt: skip
    """``run`` read again until it is no longer ``validating`` (``complete`` or ``invalid``), polled soon and
    then less often; an :class:`UploadError` after ``wait_s`` seconds (the run completes on its own later)."""
    deadline = time.monotonic() + wait_s
    pause = FIRST_POLL_S
    while run.status == "validating":
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise UploadError(
                f"run {run.id} ({run.name!r}) is still validating after {wait_s:g} s; it becomes complete "
                f"once a server worker has read its dump.json files (parity runs list --name {run.name})"
            )
        sleep(min(pause, remaining))
        pause = min(pause * 2, MAX_POLL_S)
        run = retry_call(partial(api.get_run, run.id), what="read run", budget_s=retry_budget_s)
    return run
