"""Upload a dump to a Parity server from inside a training job, without ever slowing or failing training.

The debugger hands over each rank directory once its step is flushed
(:meth:`BackgroundUploader.submit_rank_dir`). That call only puts the directory on a bounded queue; one daemon
thread creates the run on first use (with the environment metadata of :mod:`parity.client.run_metadata`), then
streams every file of the directory to ``PUT /runs/{id}/files/step{N}/rank{R}/...`` with its sha256. When
the server is down, each request is retried with exponential back-off for a bounded time, then the item is
given up with ONE warning per uploader (later failures are logged at DEBUG): the dump stays on disk, and
``parity upload`` can finish the run later, since a run that missed files is left ``uploading``.
:meth:`close` (also run at interpreter exit) drains the queue, then marks the run complete. What to skip and
what to refuse on a re-flushed folder is :class:`~parity.client.upload.RunFiles`' rule, shared with
``parity upload``.

Example::

    uploader = BackgroundUploader("http://parity:8000", run_name="llama-npu", project="llama")
    uploader.submit_rank_dir(0, 0, Path("dump/step0/rank0"))
    uploader.close(timeout=60)
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from parity.client.errors import ConfigError, RunInvalid, UploadError
from parity.client.rest import ApiError, ParityClient, ServerUnreachable
from parity.client.server_address import with_default_port
from parity.client.upload import RunFiles, complete_run, rank_files, retry_call
from parity.shared.contract import RunPublic

__all__ = ["BackgroundUploader", "UploadStats"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class UploadStats:
    """What the uploader did, for the closing log line and for tests."""

    files_uploaded: int = 0  # stored by this uploader (201)
    files_present: int = 0  # the server already had them with the same sha256 (200)
    bytes_uploaded: int = 0
    files_failed: int = 0
    items_dropped: int = 0  # rank directories refused because the queue stayed full
    items_failed: int = 0  # rank directories given up (server down, or a file refused)
    errors: list[str] = field(default_factory=list)


_STOP = object()

#: How long a server that answers nothing is waited for at exit (counted from its first unanswered request):
#: the steps it still lacks are named in the exit warning with the ``parity upload`` command that sends them.
DOWN_GRACE_S = 1.0


def _spans(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``: every number named, however many."""
    out: list[str] = []
    for n in sorted(set(numbers)):
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)


class BackgroundUploader:
    """Uploads the rank directories of one run from a daemon thread; nothing it does raises into training.

    ``server`` and ``token`` default to ``PARITY_SERVER`` and ``PARITY_TOKEN``. ``run_name`` defaults to
    ``{dump dir name}-{timestamp}``; ``device`` is detected (cuda → gpu, npu, else cpu). ``queue_size`` rank
    directories may wait; when the queue is full, :meth:`submit_rank_dir` blocks at most ``enqueue_timeout_s``
    then drops the item with a warning. ``retry_budget_s`` bounds the back-off of each request. ``client``
    injects an ``httpx.Client`` (tests use ``httpx.MockTransport``). ``close_at_exit=False`` is for an owner
    that closes the uploader from its own atexit hook: atexit runs hooks last-registered-first, so the
    uploader's own hook would close it before the owner's final flush could submit the last step.

    ``check_s`` (the training client passes it) asks the server once, before training, within that many
    seconds, whether it answers and takes the token (:meth:`ParityClient.check_access`): a refused token or a
    URL with no Parity API behind it is a :class:`ConfigError` at once; a server that does not answer turns
    uploads off for the job (one warning now), so it costs training nothing more. In every case
    :meth:`close` ends with one warning naming each step not uploaded and the ``parity upload`` command
    that sends them; ``dump_root`` is the folder that command names (default: two levels above the first
    rank directory).
    """

    def __init__(
        self,
        server: str | None = None,
        *,
        run_name: str | None = None,
        project: str | None = None,
        tags: Mapping[str, str] | None = None,
        token: str | None = None,
        device: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        planned_by: str | None = None,
        queue_size: int = 64,
        enqueue_timeout_s: float = 1.0,
        retry_budget_s: float = 30.0,
        initial_backoff_s: float = 0.25,
        max_backoff_s: float = 8.0,
        close_timeout_s: float = 300.0,
        close_at_exit: bool = True,
        client: httpx.Client | None = None,
        check_s: float | None = None,
        dump_root: Path | None = None,
    ) -> None:
        self.server = server or os.environ.get("PARITY_SERVER") or ""
        self.run_name = run_name
        self.project = project or "default"
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.device = device
        self.extra_metadata = dict(metadata or {})
        self.planned_by = planned_by  # the comparison whose plan the dump followed (run provenance)
        self.enqueue_timeout_s = enqueue_timeout_s
        self.retry_budget_s = retry_budget_s
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.close_timeout_s = close_timeout_s
        self.stats = UploadStats()
        self.run: RunPublic | None = None
        self.dump_root: Path | None = dump_root
        self.offline: str | None = None  # why uploads are off for the job (the server did not answer)
        self._handed: list[tuple[int, int]] = []  # (step, rank) of every directory submitted, in order
        self._sent: set[tuple[int, int]] = set()  # those whose every file reached the server
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._abort = threading.Event()  # set when close() times out: stop waiting in back-off
        self._closing = threading.Event()  # set by close(): a server that gives no answer is not waited for
        self._silent_since: float | None = None  # monotonic time of the first unanswered request in a row
        self._closed = False
        self._warned = False
        self._cause: str | None = None  # the first failure, in a few words, for the exit warning
        self._server_down = False  # after one give-up, later requests try once instead of backing off again
        self._remote: RunFiles | None = None  # what the run holds: a re-flush sends only what changed
        self._lock = threading.Lock()
        self._api: ParityClient | None = None
        self._thread: threading.Thread | None = None
        self.has_token = bool(token or os.environ.get("PARITY_TOKEN"))
        try:
            token = token or os.environ.get("PARITY_TOKEN")
            self._api = ParityClient(self.server, token=token, client=client)
        except UploadError as exc:  # no or malformed server URL: a config slip must not stop training
            self._warn(f"{exc}; nothing is uploaded, the dumps stay on disk")
            self._closed = True
            return
        self.server = self._api.server
        if check_s is not None:
            try:
                self.offline = self._check(check_s)
            except ConfigError:
                self._closed = True
                self._api.close()
                raise
        if self.offline is not None:
            where = f" at {self.dump_root}" if self.dump_root else ""
            self._warn(f"{self.server} does not answer ({self.offline}): nothing is uploaded from this job; "
                       f"the dump is written{where} as usual, and the command that uploads it is printed at "
                       "exit")  # fmt: skip
        else:
            self._thread = threading.Thread(target=self._work, name="parity-uploader", daemon=True)
            self._thread.start()
        if close_at_exit:
            atexit.register(self._close_at_exit)

    def _check(self, timeout_s: float) -> str | None:
        """Ask the server once, in a thread joined for ``timeout_s`` (a name lookup that hangs included):
        None when it answers and takes the token, the reason when it does not answer in time. A refusal
        that no retry can change is a :class:`ConfigError` naming ``token`` or ``server``."""
        assert self._api is not None
        api = self._api
        outcome: list[BaseException | None] = []

        def ask() -> None:
            try:
                api.check_access(timeout=2 * timeout_s)  # the join below decides; this only ends the thread
                outcome.append(None)
            except BaseException as exc:  # handed to the training thread, which decides
                outcome.append(exc)

        asker = threading.Thread(target=ask, name="parity-server-check", daemon=True)
        asker.start()
        asker.join(timeout_s)
        if not outcome:
            return f"no answer within {timeout_s:g} s"
        exc = outcome[0]
        if exc is None:
            return None
        if isinstance(exc, ServerUnreachable):
            return str(exc).rpartition("server unreachable: ")[2] or "unreachable"
        if isinstance(exc, ApiError) and exc.status_code == 401:
            problem = ("the server refuses it" if self.has_token else
                       "the server needs one: set PARITY_TOKEN or the 'token' field")  # fmt: skip
            raise ConfigError("token", f"{problem} ({exc.detail}, {self.server})")
        if isinstance(exc, ApiError) and exc.status_code == 403:
            raise ConfigError("token", f"the server takes it for reading only; uploads need a read-write "
                                       f"token ({exc.detail}, {self.server})")  # fmt: skip
        if isinstance(exc, ApiError) and exc.status_code in (404, 405):
            raise ConfigError("server", f"{self.server} has no Parity API (POST {exc.url} answers "
                                        f"{exc.status_code}); expected the server's base URL, "
                                        "such as http://host:8000")  # fmt: skip
        # a server error or an overload: the uploads retry, as they would later in the job
        log.info("parity upload: server check of %s: %s; uploading anyway", self.server, exc)
        return None

    # -- the training side ------------------------------------------------------------------------------

    @property
    def run_id(self) -> str | None:
        """The server's id of the run once it is created (None before, or when it could not be)."""
        return self.run.id if self.run else None

    def submit_rank_dir(self, step: int, rank: int, rank_dir: Path) -> None:
        """Queue ``rank_dir`` (``{root}/step{step}/rank{rank}``) for upload; never raises nor waits long."""
        if self._api is not None:
            if self.dump_root is None:
                self.dump_root = Path(rank_dir).resolve().parent.parent
            if self.run_name is None:  # fixed now: the exit warning's command names it, sent or not
                self.run_name = f"{self.dump_root.name}-{time.strftime('%Y%m%d-%H%M%S')}"
            self._handed.append((int(step), int(rank)))
        if self._closed or self.offline is not None:
            log.debug("uploader closed, step %s rank %s not uploaded: %s", step, rank, rank_dir)
            return
        try:
            self._queue.put((int(step), int(rank), Path(rank_dir)), timeout=self.enqueue_timeout_s)
        except queue.Full:
            self.stats.items_dropped += 1
            self._warn(
                f"upload queue full for {self.enqueue_timeout_s:g} s: step {step} rank {rank} not uploaded "
                f"(the dump stays at {rank_dir}; `parity upload` can send it later)",
                cause=f"the upload queue stayed full for {self.enqueue_timeout_s:g} s",
            )

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued rank directory was handled; False when ``timeout`` ran out first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._queue.all_tasks_done.wait(remaining)
        return True

    def close(self, timeout: float | None = None) -> None:
        """Drain the queue, mark the run complete, stop the thread; at most ``timeout`` seconds in all.

        ``None`` means ``close_timeout_s`` (300 s by default), not forever: a server that accepts connections
        but never answers must not keep a finished training job from exiting.
        """
        if timeout is None:
            timeout = self.close_timeout_s
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._closing.set()
        atexit.unregister(self._close_at_exit)
        if self._thread is None:  # offline: nothing was sent
            self._report_unsent()
            return
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            pass
        while self._thread.is_alive():
            silent_since = self._silent_since  # no answer: not waited for beyond a short grace
            limit = deadline if silent_since is None else min(deadline, silent_since + DOWN_GRACE_S)
            if time.monotonic() >= limit:
                break
            self._thread.join(min(0.05, limit - time.monotonic()))
        if self._thread.is_alive():
            self._abort.set()
            if self._silent_since is None:
                self._warn(
                    f"upload to {self.server} not finished after {timeout:g} s; "
                    f"{self._queue.qsize()} rank directories left (the dump stays on disk)",
                    cause=f"not finished after {timeout:g} s",
                )
        elif self._api is not None:
            self._api.close()
        self._report_unsent()

    def upload_command(self) -> str:
        """The ``parity upload`` command that sends what this uploader did not (it resumes the run)."""
        import shlex

        from parity.client.run_metadata import detect_device

        root = self.dump_root or Path("DUMP_DIR")
        # A URL with no port that never answered was most likely missing parity server's: suggest it.
        server = (with_default_port(self.server) if self.offline else None) or self.server
        parts = ["parity", "upload", str(root), "--server", server, "--name", self.run_name or "NAME",
                 "--project", self.project, "--device", self.device or detect_device()]  # fmt: skip
        for key, value in self.tags.items():
            parts += ["--tag", f"{key}={value}"]
        command = shlex.join(parts)
        return command + (" --token ..." if self.has_token and not os.environ.get("PARITY_TOKEN") else "")

    def _report_unsent(self) -> None:
        """The one warning at the end: every step not uploaded, and the command that uploads it."""
        unsent = [item for item in self._handed if item not in self._sent]
        if not unsent:
            return
        steps, ranks = {step for step, _ in unsent}, {rank for _, rank in unsent}
        why = f"no answer ({self.offline})" if self.offline else self._cause or "not finished"
        log.warning(
            "parity upload: step%s %s (rank%s %s) not uploaded to %s: %s. The dump is on disk; "
            "to upload it:\n    %s",
            "s" if len(steps) > 1 else "", _spans(list(steps)),
            "s" if len(ranks) > 1 else "", _spans(list(ranks)), self.server, why, self.upload_command(),
        )  # fmt: skip

    def _close_at_exit(self) -> None:
        self.close(self.close_timeout_s)

    # -- the upload thread ------------------------------------------------------------------------------

    def _warn(self, message: str, cause: str | None = None) -> None:
        """The one warning an uploader gives while the job runs; the rest goes to DEBUG so a down server never
        floods the log. ``cause`` (default: the message) is what the exit warning gives as the reason."""
        if self._cause is None:
            self._cause = cause or message
        self.stats.errors.append(message)
        if self._warned:
            log.debug("%s", message)
        else:
            self._warned = True
            log.warning("parity upload: %s", message)

    def _budget(self) -> float:
        return 0.0 if self._server_down or self._abort.is_set() else self.retry_budget_s

    def _pause(self, seconds: float) -> None:
        """The back-off between tries, cut short by an abort, or by the end of the job when the server gives
        no answer (an answering server that failed is still given its back-off)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self._abort.wait(min(left, 0.05)):
                return
            if self._given_up():
                raise ServerUnreachable(f"{self.server}: no answer, not waited for at exit")

    def _given_up(self) -> bool:
        """The job is ending and the server has answered nothing for ``DOWN_GRACE_S``."""
        since = self._silent_since
        return self._closing.is_set() and since is not None and time.monotonic() - since >= DOWN_GRACE_S

    def _attempt(self, fn: Callable[[], T]) -> T:
        try:
            result = fn()
        except ServerUnreachable:
            if self._silent_since is None:
                self._silent_since = time.monotonic()
            raise
        self._silent_since = None
        return result

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            result = retry_call(
                lambda: self._attempt(fn),
                what=what,
                budget_s=self._budget(),
                initial_backoff_s=self.initial_backoff_s,
                max_backoff_s=self.max_backoff_s,
                wait=self._pause,
            )
        except UploadError as exc:
            if not isinstance(exc, ApiError):  # retries ran out (an ApiError here is a definite 4xx refusal)
                self._server_down = True
            raise
        self._server_down = False
        return result

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    self._finish()
                    return
                self._upload_rank_dir(*item)
            except Exception as exc:  # a bug here must not kill the thread silently nor reach training
                self.stats.items_failed += 1
                log.debug("upload thread error", exc_info=True)
                self._warn(f"upload failed unexpectedly: {type(exc).__name__}: {exc}")
            finally:
                self._queue.task_done()

    def _ensure_run(self, rank_dir: Path) -> RunFiles:
        if self._remote is not None:
            return self._remote
        from parity.client.run_metadata import capture_metadata, detect_device, read_environment

        root = self.dump_root or rank_dir.resolve().parent.parent
        self.dump_root = root
        device = self.device or detect_device()
        name = self.run_name or f"{root.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        _, environment = read_environment(root)  # the training client wrote it (parity upload reads it too)
        environment = environment or capture_metadata(device, cwd=Path.cwd())
        metadata = {**environment, "dump_path": str(root), **self.extra_metadata}
        assert self._api is not None
        api = self._api

        def create() -> RunPublic:
            return api.create_run(name, project=self.project, device=device, tags=self.tags,
                                  metadata=metadata, planned_by=self.planned_by)  # fmt: skip

        self.run = self._call("create run", create)
        self.run_name = name
        self._remote = RunFiles(api, self.run)
        log.info("parity upload: run %s (%s) created on %s", self.run.id, name, self.server)
        return self._remote

    def _upload_rank_dir(self, step: int, rank: int, rank_dir: Path) -> None:
        if self._given_up():  # the job is ending and the server gives no answer: left to the exit warning's
            self.stats.items_failed += 1  # command, and counted as given up like the ones that were tried
            return
        try:
            remote = self._ensure_run(rank_dir)
        except UploadError as exc:
            self.stats.items_failed += 1
            self._warn(
                f"could not create the run on {self.server}: {exc}; step {step} rank {rank} not uploaded "
                f"(the dump stays at {rank_dir})",
                cause=f"could not create the run: {exc}",
            )
            return
        failed = 0
        for item in rank_files(step, rank, rank_dir):
            try:
                sent = remote.send(item, self._call)
            except (UploadError, OSError) as exc:
                failed += 1
                self.stats.files_failed += 1
                self._warn(f"{item.rel}: not uploaded: {exc} (the dump stays at {rank_dir})",
                           cause=f"{item.rel}: {exc}")  # fmt: skip
                if self._server_down:
                    break  # the rest of this directory would fail the same way, each one after a try
                continue
            if sent == "stored":
                self.stats.files_uploaded += 1
                self.stats.bytes_uploaded += item.path.stat().st_size
            else:
                self.stats.files_present += 1
        if failed:
            self.stats.items_failed += 1
        else:
            self._sent.add((step, rank))
        log.debug("step %d rank %d uploaded from %s (%d failures)", step, rank, rank_dir, failed)

    def _finish(self) -> None:
        """After the last item: complete the run when every file reached the server, else leave it open."""
        s = self.stats
        if self.run is None:
            log.info("parity upload: nothing uploaded (%d rank directories failed or dropped)",
                     s.items_failed + s.items_dropped)
            return
        resume = self.upload_command()
        if s.items_failed or s.items_dropped or s.files_failed:
            log.info("parity upload: run %s left uploading (%d files failed, %d directories dropped); "
                     "finish it with: %s", self.run_id, s.files_failed, s.items_dropped, resume)
            return
        assert self._api is not None
        api = self._api
        run_id = self.run.id

        def wait(seconds: float) -> None:
            if self._abort.wait(seconds):
                raise UploadError(f"run {run_id} is still validating on the server; it completes by itself")

        try:
            self.run = complete_run(api, run_id, retry_budget_s=self._budget(), wait_s=self.close_timeout_s,
                                    sleep=wait)  # fmt: skip
        except RunInvalid as exc:
            self._warn(str(exc))
            return
        except UploadError as exc:
            self._warn(f"run {run_id} could not be completed: {exc}; finish it with: {resume}")
            return
        log.info("parity upload: run %s (%s) complete, %d files (%.1f MB) uploaded, %d already there: "
                 "%s/runs/%s", run_id, self.run_name, s.files_uploaded, s.bytes_uploaded / 1e6,
                 s.files_present, self.server, run_id)  # fmt: skip
