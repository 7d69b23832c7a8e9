"""Runs: create, list, read, delete, upload files (streamed, verified, published atomically), complete."""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import anyio.to_thread
from parity.server.db import Database
from parity.server.disk import Reserve, is_storage_full
from parity.server.errors import (
    BadRequest,
    Conflict,
    NotFound,
    PayloadTooLarge,
    StoreError,
    Unprocessable,
)
from parity.server.job_repository import JobRepository
from parity.server.jobs.base import JobQueue, NullQueue
from parity.server.models import ComparisonCall, ComparisonRow, Run, RunFile, RunTag, utcnow
from parity.server.repositories import RunRepository, RunStats, serialize_on
from parity.server.schemas import FilePublic, FilesPublic, RunCreate, RunPublic, RunsPublic
from parity.server.services.paths import check_sha256, check_upload_path
from parity.server.store import BlobStore, comparison_key, run_key, upload_key
from parity.shared.contract import split_tag
from parity.shared.dump.layout import DUMP_JSON, stored_prefix
from parity.shared.naming import skeleton
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

logger = logging.getLogger(__name__)

#: Run states that take no more files: validating (the files being validated are the run's) and complete.
FROZEN = frozenset({"validating", "complete"})

#: Body bytes gathered before one hand-off to a thread that hashes and writes them (hashlib releases the GIL).
WRITE_BATCH = 1024 * 1024


def run_public(run: Run, stats: RunStats) -> RunPublic:
    return RunPublic(
        id=run.id, name=run.name, project=run.project, device=run.device, tags=dict(run.tags or {}),
        metadata=dict(run.meta or {}), status=run.status,  # type: ignore[arg-type]
        error=run.error, created_at=run.created_at, completed_at=run.completed_at, keep=bool(run.keep),
        file_count=stats.file_count, total_bytes=stats.total_bytes,
        steps=sorted(stats.steps), ranks=sorted(stats.ranks), baseline=bool(run.baseline),
        auto_compare=bool(run.auto_compare), auto_compare_note=run.auto_compare_note,
        planned_by=run.planned_by, dump_task=run.dump_task,
        incomplete=[stored_prefix(step, rank) for step, rank in sorted(stats.incomplete)],
    )  # fmt: skip


def parse_tag_filters(tags: Sequence[str]) -> list[tuple[str, str]]:
    """``tag=KEY=VALUE`` query values as pairs: the CLI's ``--tag KEY=VALUE`` syntax, split at the first
    ``=`` (so a value may hold ``=`` or ``:``, and tag keys never hold ``=``, see ``RunCreate``)."""
    out = []
    for tag in tags:
        try:
            out.append(split_tag(tag))
        except ValueError:
            raise BadRequest(
                f"query tag={tag!r}: expected KEY=VALUE, as in parity upload --tag KEY=VALUE"
            ) from None
    return out


#: How many ids a 409 lists (an ambiguous name's runs, a run's comparisons) before "and N more".
LISTED_IDS = 10


def listing(items: Sequence[str]) -> str:
    """``items`` joined for a one-line message, the first :data:`LISTED_IDS` of them."""
    more = f" and {len(items) - LISTED_IDS} more" if len(items) > LISTED_IDS else ""
    return ", ".join(items[:LISTED_IDS]) + more


#: rows a batch of a delete on a full disk removes: its WAL (a page per ~10 rows) fits in a small reserve
DELETE_BATCH_ROWS = 2000


def delete_rows_in_batches(db: Database, comparison_id: str) -> None:
    """Delete a comparison's rows and calls a batch at a time, checkpointing the WAL between batches: on a
    full disk one transaction deleting 42,240 rows needed 8 MB of WAL that the disk did not have. Only the
    comparison being deleted loses rows; its own row goes with the run's delete after."""
    db.checkpoint()  # the WAL from the start: the space the removed blobs left is the batches' room
    for model, order in ((ComparisonRow, ComparisonRow.idx), (ComparisonCall, ComparisonCall.seq)):
        while True:
            with db.write() as session:
                keys = session.execute(select(model.rank, order).where(model.comparison_id == comparison_id)
                                       .limit(DELETE_BATCH_ROWS)).all()  # fmt: skip
                if not keys:
                    break
                for rank in {r for r, _ in keys}:
                    numbers = [n for r, n in keys if r == rank]
                    session.execute(delete(model).where(model.comparison_id == comparison_id,
                                                        model.rank == rank, order.in_(numbers)))  # fmt: skip
            db.checkpoint()


def refuse_taken_name(session: Session, project: str, name: str, advice: str, *, renamed: str | None = None
                      ) -> None:  # fmt: skip
    """:class:`Conflict` when ``project`` has a run called ``name`` or a look-alike of it (the same
    :func:`~parity.shared.naming.skeleton`), other than the run ``renamed``; names are unique in a project so
    that ``compare-runs NAME`` is never ambiguous, to the eye either. Concurrent creates of one name (or of
    two look-alikes) are made to take turns first."""
    serialize_on(session, f"run-name\0{project}\0{skeleton(name)}")
    taken = [t for t in RunRepository(session).alike(name, project) if t.id != renamed]
    if taken:
        t = taken[-1]
        alike = "" if t.name == name else f" (which {name!r} looks like)"
        raise Conflict(f"name: project {project!r} already has a run named {t.name!r}{alike} ({t.id}, "
                       f"{t.status}); names are unique in a project: {advice}")  # fmt: skip


def resolve_run(repo: RunRepository, ref: str, *, project: str | None = None, field: str | None = None,
                for_update: bool = False, shared: bool = False) -> Run:  # fmt: skip
    """The run ``ref`` names: a run id, else a run name (within ``project`` when given).

    An id wins over a name, so an id always means one run. A name that no run has is a 404; a name that
    several runs have is a 409 listing their ids, as ``parity compare-runs`` does. ``field`` prefixes the
    message with the request field the reference came from (``target_run``).
    """
    where = f"{field}: " if field else ""
    run = repo.get(ref, for_update=for_update, shared=shared)
    if run is not None and (project is None or run.project == project):
        return run
    runs = repo.named(ref, project)
    in_project = f" in project {project!r}" if project is not None else ""
    if not runs:
        raise NotFound(f"{where}run {ref!r} not found (no run has this id or name{in_project})")
    if len(runs) > 1:
        listed = listing([f"{r.id} (project {r.project}, {r.status}, created {r.created_at:%Y-%m-%d %H:%M})"
                          for r in runs])  # fmt: skip
        raise Conflict(f"{where}run name {ref!r} is ambiguous: {len(runs)} runs{in_project} have it; "
                       f"use one of their ids: {listed}")  # fmt: skip
    if not for_update:
        return runs[0]
    locked = repo.get(runs[0].id, for_update=True, shared=shared)
    if locked is None:  # deleted between the lookup and the lock
        raise NotFound(f"{where}run {ref!r} not found")
    return locked


@dataclass
class UploadResult:
    file: FilePublic
    created: bool  # False: the same content was already stored under that path


class RunService:
    def __init__(
        self, db: Database, store: BlobStore, max_upload_bytes: int, reserve: Reserve | None = None,
        queue: JobQueue | None = None,
    ) -> None:  # fmt: skip
        self.db = db
        self.store = store
        self.max_upload_bytes = max_upload_bytes
        self.reserve = reserve
        self.queue: JobQueue = queue or NullQueue()

    # -- runs -------------------------------------------------------------------------------------------
    def create(self, body: RunCreate) -> RunPublic:
        run = Run(
            id=uuid.uuid4().hex, name=body.name, project=body.project, device=body.device, tags=body.tags,
            meta=body.metadata, status="uploading", created_at=utcnow(), keep=body.keep,
            auto_compare=body.auto_compare, baseline=False, planned_by=body.planned_by,
        )  # fmt: skip
        with self.db.write() as session:
            refuse_taken_name(session, body.project, body.name,
                              "resume that run's upload, delete it, or choose another name")  # fmt: skip
            session.add(run)
            session.flush()
            session.add_all(RunTag(run_id=run.id, key=k, value=v) for k, v in body.tags.items())
        logger.info("run %s created (%s/%s)", run.id, run.project, run.name)
        return run_public(run, RunStats())

    def _require(
        self, repo: RunRepository, run_id: str, *, for_update: bool = False, shared: bool = False
    ) -> Run:
        return resolve_run(repo, run_id, for_update=for_update, shared=shared)

    def get(self, ref: str) -> RunPublic:
        with self.db.read() as session:
            repo = RunRepository(session)
            run = self._require(repo, ref)
            return run_public(run, repo.stats([run.id])[run.id])

    def search(
        self,
        *,
        project: str | None,
        name: str | None,
        device: str | None,
        status: str | None,
        tags: Sequence[str],
        limit: int,
        offset: int,
        name_contains: str | None = None,
    ) -> RunsPublic:
        with self.db.read() as session:
            repo = RunRepository(session)
            stmt = repo.filtered(project=project, name=name, name_contains=name_contains, device=device,
                                 status=status, tags=parse_tag_filters(tags))  # fmt: skip
            runs, total = repo.page(stmt, limit, offset)
            stats = repo.stats([r.id for r in runs])
            return RunsPublic(data=[run_public(r, stats[r.id]) for r in runs], count=total)

    def delete(self, ref: str, *, with_comparisons: bool = False) -> list[str]:
        """Delete the run, its files and, with ``with_comparisons``, every comparison that used it; returns
        those comparisons' ids. Without it, a run that comparisons use is a 409 that lists them: deleting
        someone's reports must be asked for, not a side effect.

        On a full disk the database may refuse even a delete (SQLite writes its WAL first, a page per page
        of rows deleted: 8 MB for a comparison of 42,240 rows): the reserve is given up and the delete tried
        once more; if the database still cannot grow, the blobs the delete removes (the run's files, its
        comparisons' reports) are removed first and the rows after, in the space they left. Space can
        always be freed through the API, also after a restart (the reserve is not laid again on a full disk).
        """
        try:
            return self._delete(ref, with_comparisons)
        except Exception as exc:
            if not is_storage_full(exc):
                raise
        if self.reserve is not None and self.reserve.release():
            try:
                return self._delete(ref, with_comparisons)
            except Exception as exc:
                if not is_storage_full(exc):
                    raise
        with self.db.read() as session:
            run_id, comparison_ids = self._deletable(RunRepository(session), ref, with_comparisons)
        logger.warning("storage is full: run %s's blobs removed before its rows, so that the database can "
                       "record the delete", run_id)  # fmt: skip
        self.store.delete_prefix(run_key(run_id))
        for cid in comparison_ids:
            self.store.delete_prefix(comparison_key(cid))
        for cid in comparison_ids:  # the big tables in batches, each one's WAL given back before the next
            delete_rows_in_batches(self.db, cid)
        return self._delete(ref, with_comparisons)

    def _deletable(self, repo: RunRepository, ref: str, with_comparisons: bool, *,
                   for_update: bool = False) -> tuple[str, list[str]]:  # fmt: skip
        """The run's id and its comparisons' ids, once it may be deleted (409 otherwise)."""
        run = self._require(repo, ref, for_update=for_update)
        comparison_ids = repo.comparison_ids(run.id)
        if comparison_ids and not with_comparisons:
            raise Conflict(
                f"run {run.id} ({run.name}) is used by {len(comparison_ids)} comparison(s): "
                f"{listing(comparison_ids)}; deleting the run deletes them and their reports too: ask "
                "again with with_comparisons=true"
            )
        return run.id, comparison_ids

    def _delete(self, ref: str, with_comparisons: bool) -> list[str]:
        with self.db.write() as session:
            repo = RunRepository(session)
            run_id, comparison_ids = self._deletable(repo, ref, with_comparisons, for_update=True)
            repo.delete(run_id)
        self.store.delete_prefix(run_key(run_id))
        logger.info("run %s deleted with %d comparisons", run_id, len(comparison_ids))
        return comparison_ids

    def files(self, ref: str) -> FilesPublic:
        with self.db.read() as session:
            repo = RunRepository(session)
            run = self._require(repo, ref)
            files = [FilePublic(path=f.path, size=f.size, sha256=f.sha256) for f in repo.files(run.id)]
        return FilesPublic(data=files, count=len(files))

    # -- uploads ----------------------------------------------------------------------------------------
    def _settled(self, ref: str, path: str, sha256: str) -> tuple[str, UploadResult | None]:
        """The run's id and the answer for an upload that need not store anything: 404 for no run, 409 for
        a complete run or other content under ``path``; the same content already stored is a 200 (None:
        store it)."""
        with self.db.read() as session:
            repo = RunRepository(session)
            run = self._require(repo, ref)
            run_id = run.id
            existing = repo.file(run_id, path)
            if existing is not None:
                if existing.sha256 != sha256:
                    raise Conflict(f"run {run_id}: {path} already exists with sha256 {existing.sha256}")
                return run_id, UploadResult(FilePublic(path=path, size=existing.size, sha256=sha256), False)
            if run.status in FROZEN:
                raise Conflict(f"run {run_id}: already {run.status}, {path} cannot be added")
        return run_id, None

    async def upload(
        self,
        ref: str,
        path: str,
        sha256_header: str | None,
        content_length: str | None,
        body: AsyncIterator[bytes],
    ) -> UploadResult:
        """Stream ``body`` into a temp blob while hashing it, verify it, then publish it and record it.

        Every check that can be made before reading the body is made first (path, header, declared length,
        run state); a refused upload never leaves its temp file or a blob behind. Everything that touches the
        disk or the database runs in a worker thread, never on the event loop.
        """
        step, rank = check_upload_path(path)
        sha256 = check_sha256(sha256_header)
        if content_length is not None:
            try:
                declared = int(content_length)
            except ValueError:
                raise BadRequest(f"header Content-Length: not a number: {content_length!r}") from None
            if declared > self.max_upload_bytes:
                raise PayloadTooLarge(
                    f"{path}: Content-Length {declared} exceeds the limit of {self.max_upload_bytes} bytes"
                )
        run_id, _ = await anyio.to_thread.run_sync(self._settled, ref, path, sha256)

        temp = await anyio.to_thread.run_sync(self.store.new_temp)
        try:
            size, digest = await self._stream_to(temp, path, body)
            if digest != sha256:
                raise Unprocessable(f"{path}: sha256 mismatch: header {sha256}, body {digest}")
            # One thread call for publish + record + clean-up, so that a cancelled request cannot separate
            # a published blob from its row (or from its removal).
            return await anyio.to_thread.run_sync(self._commit, run_id, path, step, rank, size, sha256, temp)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_unlink, temp)

    async def _stream_to(self, temp: Path, path: str, body: AsyncIterator[bytes]) -> tuple[int, str]:
        hasher = hashlib.sha256()
        size = 0
        fh = await anyio.to_thread.run_sync(open, temp, "wb")
        try:

            def write(data: bytes) -> None:
                hasher.update(data)
                fh.write(data)

            pending: list[bytes] = []
            pending_bytes = 0
            async for chunk in body:
                size += len(chunk)
                if size > self.max_upload_bytes:
                    raise PayloadTooLarge(f"{path}: body exceeds the limit of {self.max_upload_bytes} bytes")
                pending.append(chunk)
                pending_bytes += len(chunk)
                if pending_bytes >= WRITE_BATCH:
                    await anyio.to_thread.run_sync(write, b"".join(pending))
                    pending, pending_bytes = [], 0
            if pending:
                await anyio.to_thread.run_sync(write, b"".join(pending))
            # On disk before the upload is acknowledged: a 201 must survive a crash of the host.
            await anyio.to_thread.run_sync(_sync, fh)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(fh.close)
        return size, hasher.hexdigest()

    def _commit(
        self, run_id: str, path: str, step: int | None, rank: int | None, size: int, sha256: str, temp: Path
    ) -> UploadResult:
        """Publish ``temp`` under a key of its own, then insert the row; the (run, path) primary key makes
        exactly one of racing uploads win. A loser removes its blob and answers as a late retry would: 200
        for the winner's content, 409 for other content.

        No database lock is held while the blob is published (an S3 upload of a large tensor can take a
        while); the transaction that records it is short.
        """
        _, settled = self._settled(run_id, path, sha256)  # the common case of a retry stores nothing
        if settled is not None:
            return settled
        key = upload_key(run_id, uuid.uuid4().hex)
        self.store.publish(temp, key)
        try:
            with self.db.write() as session:
                repo = RunRepository(session)
                # FOR SHARE: a concurrent delete or complete of the run waits until this row is in.
                run = self._require(repo, run_id, for_update=True, shared=True)
                if run.status in FROZEN:
                    raise Conflict(f"run {run_id}: already {run.status}, {path} cannot be added")
                session.add(RunFile(run_id=run_id, path=path, size=size, sha256=sha256, blob=key, step=step,
                                    rank=rank, created_at=utcnow()))  # fmt: skip
                session.flush()
        except IntegrityError:
            self._discard(key)
            _, settled = self._settled(run_id, path, sha256)
            if settled is None:  # the winner's row is gone again (its run was deleted meanwhile)
                raise Conflict(f"run {run_id}: {path} was changed by a concurrent request; retry") from None
            logger.info("run %s: %s was stored by a concurrent upload of the same content", run_id, path)
            return settled
        except BaseException:
            self._discard(key)
            raise
        return UploadResult(FilePublic(path=path, size=size, sha256=sha256), created=True)

    def _discard(self, key: str) -> None:
        """Remove the blob of an upload that was not recorded; a failure only leaves an orphan under the
        run's prefix (deleted with the run), so it is logged, not raised over the real answer."""
        try:
            self.store.delete(key)
        except (StoreError, OSError) as exc:
            logger.warning("could not remove unrecorded blob %s: %s", key, exc)

    # -- complete ---------------------------------------------------------------------------------------
    def complete(self, ref: str) -> RunPublic:
        """Queue the validation of every dump.json on the job backend and return at once (``validating``).

        A worker parses the files (the run's ``validate`` job), never this process, and makes the run
        ``complete`` or ``invalid`` with the error naming file and entry. A run already complete or
        validating is returned as it is; an ``invalid`` one is validated again (files may have been added
        since). From here on no file can be added: an upload's transaction and this one lock the run row,
        so the files validated are exactly those recorded before.
        """
        with self.db.write() as session:
            repo = RunRepository(session)
            run = self._require(repo, ref, for_update=True)
            run_id = run.id
            if run.status in ("complete", "validating"):
                return run_public(run, repo.stats([run_id])[run_id])
            if not any(f.path.rsplit("/", 1)[-1] == DUMP_JSON for f in repo.files(run_id)):
                raise Unprocessable(f"run {run_id}: no dump.json uploaded")
            run.status, run.error = "validating", None
            job_id = JobRepository(session).queue_validation(run_id, utcnow())
        self.queue.submit(job_id)  # after the commit: a worker always finds the run validating
        logger.info("run %s validating", run_id)
        return self.get(run_id)


def _sync(fh: BinaryIO) -> None:
    fh.flush()
    os.fsync(fh.fileno())


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)
