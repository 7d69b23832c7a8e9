"""``run_compare_job(job_id, settings)``: the one entry point every job backend calls.

It claims the job (queued → running, ``attempt`` + 1) under a lease that a background thread renews while it
works, stages the two runs' files for the chosen step and
ranks, runs the shared compare engine, stores each rank's xlsx and advisor in the blob store, and writes the
rows, the summary and ``succeeded`` in one transaction, guarded by the attempt it claimed: a job interrupted
at any point simply runs again from the start. Any error is recorded on the job; nothing is raised.

The lease is what lets a job outlive its worker: a Celery worker killed mid-job leaves the row ``running``
with nobody renewing it, and once the lease has passed the next delivery of the job id (the broker's, or the
one the server's lease watcher sends) claims it again as attempt + 1.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

from parity.server.db import Database
from parity.server.errors import ServiceError
from parity.server.models import Comparison, ComparisonRow, RunFile, utcnow
from parity.server.repositories import ComparisonRepository, RunRepository
from parity.server.settings import Settings
from parity.server.store import BlobStore, FileStore, comparison_key, open_store
from sqlalchemy import delete, insert, update

logger = logging.getLogger(__name__)

ROW_BATCH = 5000
PROGRESS_INTERVAL_S = 0.5
TOP_SUSPECTS = 10
FAILING_STATUSES = frozenset({"fail", "unmatched"})


class JobError(ServiceError):
    """A compare job cannot run (its files are missing from the store, the runs disagree)."""


class LeaseLost(Exception):
    """This attempt no longer holds its job (its lease passed and another worker claimed it, or the job was
    deleted): the work stops, and nothing is recorded, since the job's row is no longer this attempt's."""


def run_compare_job(job_id: str, settings: Settings) -> None:
    """Run comparison ``job_id`` to completion or record why it failed; never raises."""
    db = Database.connect(settings.resolved_database_url)
    try:
        attempt = _claim(db, job_id, settings.job_lease_seconds)
        if attempt is None:
            logger.info(
                "comparison %s is not claimable (finished, deleted, or running under a live lease); "
                "nothing to do", job_id,
            )  # fmt: skip
            return
        logger.info("comparison %s claimed: attempt %d", job_id, attempt)
        try:
            with _Lease(db, job_id, attempt, settings.job_lease_seconds) as lease:
                store = open_store(settings.resolved_store_url, settings.resolved_data_dir / "tmp")
                _run(db, store, settings, job_id, attempt, lease)
        except LeaseLost as exc:
            logger.warning("comparison %s: %s; this attempt stops", job_id, exc)
        except Exception as exc:
            expected = isinstance(exc, ServiceError) or _is_parity_error(exc)
            message = str(exc) if expected else f"{type(exc).__name__}: {exc}"
            if not expected:  # a bug, not bad input: keep the traceback in the log
                logger.exception("comparison %s failed", job_id)
            _finish_failed(db, job_id, attempt, message or type(exc).__name__)
    finally:
        db.dispose()


def _is_parity_error(exc: BaseException) -> bool:
    from parity.shared.errors import ParityError

    return isinstance(exc, ParityError)


def _claim(db: Database, job_id: str, lease_seconds: float) -> int | None:
    with db.write() as session:
        return ComparisonRepository(session).claim(job_id, utcnow(), lease_seconds)


class _Lease:
    """Renews the claimed attempt's lease from a daemon thread every third of its length, for as long as the
    ``with`` block runs, so a live worker keeps its job however long the engine or the final writes take.

    A renewal that finds the attempt no longer holding the job sets ``lost``; ``check`` (called with each
    progress report) then stops the work. A renewal that fails (the database is briefly unreachable) is only
    logged: the next one may succeed, and if the lease lapses meanwhile the attempt guard on every write
    keeps a reclaimed job's newer attempt safe.
    """

    def __init__(self, db: Database, job_id: str, attempt: int, seconds: float) -> None:
        self.db, self.job_id, self.attempt, self.seconds = db, job_id, attempt, seconds
        self.lost = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"parity-lease-{job_id[:8]}", daemon=True)

    def __enter__(self) -> _Lease:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def check(self) -> None:
        if self.lost.is_set():
            raise LeaseLost(f"attempt {self.attempt} no longer holds the job")

    def _renew(self) -> None:
        while not self._done.wait(self.seconds / 3):
            try:
                with self.db.write() as session:
                    held = ComparisonRepository(session).renew_lease(
                        self.job_id, self.attempt, utcnow() + timedelta(seconds=self.seconds)
                    )
            except Exception:
                logger.warning("comparison %s: lease renewal failed; retrying", self.job_id, exc_info=True)
                continue
            if not held:
                logger.warning("comparison %s: attempt %d lost its lease", self.job_id, self.attempt)
                self.lost.set()
                return


def _finish_failed(db: Database, job_id: str, attempt: int, message: str) -> None:
    with db.write() as session:
        session.execute(
            update(Comparison)
            .where(Comparison.id == job_id, Comparison.attempt == attempt, Comparison.status == "running")
            .values(status="failed", error=message[:4000], finished_at=utcnow(), lease_expires_at=None)
        )
    logger.warning("comparison %s failed: %s", job_id, message)


class _Progress:
    """Throttled progress writes: the engine may call back per row, the database hears twice a second."""

    def __init__(
        self, db: Database, job_id: str, attempt: int, low: float, high: float, lease: _Lease | None = None
    ) -> None:
        self.db, self.job_id, self.attempt, self.low, self.high = db, job_id, attempt, low, high
        self.lease = lease
        self._last = 0.0

    def set(self, fraction: float) -> None:
        if self.lease is not None:
            self.lease.check()  # stop early, rather than finish work whose result would be dropped
        now = time.monotonic()
        if now - self._last < PROGRESS_INTERVAL_S:
            return
        self._last = now
        value = self.low + (self.high - self.low) * min(max(fraction, 0.0), 1.0)
        with self.db.write() as session:
            session.execute(
                update(Comparison)
                .where(Comparison.id == self.job_id, Comparison.attempt == self.attempt)
                .values(progress=value)
            )

    def __call__(self, *args: Any) -> None:
        # The engine reports either a fraction or (done, total); both are accepted.
        numbers = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
        if len(numbers) >= 2 and numbers[1]:
            self.set(numbers[0] / numbers[1])
        elif numbers:
            self.set(float(numbers[0]))


def _stage(store: BlobStore, run_id: str, files: Iterable[RunFile], dest: Path, label: str) -> int:
    """Lay the files out as ``dest/rank{R}/...``: hard links into a file store (reading in place, without
    the engine ever seeing a symlink), downloads from a remote one."""
    count = 0
    for f in files:
        key = f.blob
        rel = f.path.split("/", 1)[1]  # drop "stepN/"
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        local = store.local_path(key)
        if local is not None:
            if not local.is_file():
                raise JobError(f"{label} run {run_id}: {f.path} is missing from the store")
            try:
                os.link(local, target)
            except OSError:
                shutil.copyfile(local, target)
        else:
            store.download(key, target)
        count += 1
    return count


def _run(
    db: Database, store: BlobStore, settings: Settings, job_id: str, attempt: int, lease: _Lease | None = None
) -> None:
    with db.read() as session:
        c = session.get(Comparison, job_id)
        assert c is not None
        runs = RunRepository(session)
        step = c.step if c.step is not None else 0
        target_files = runs.step_files(c.target_run_id, step, c.ranks)
        bench_files = runs.step_files(c.bench_run_id, step, c.ranks)
        target_id, bench_id, options = c.target_run_id, c.bench_run_id, dict(c.options or {})
    if not any(f.path.endswith("/dump.json") for f in target_files):
        raise JobError(f"target run {target_id}: no dump.json in step {step}")
    if not any(f.path.endswith("/dump.json") for f in bench_files):
        raise JobError(f"bench run {bench_id}: no dump.json in step {step}")

    tmp_root = store.root / ".tmp" if isinstance(store, FileStore) else settings.resolved_data_dir / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"job-{job_id[:8]}-", dir=tmp_root) as work:
        work_dir = Path(work)
        npu_dir, bench_dir, out_dir = work_dir / "npu" / f"step{step}", work_dir / "bench" / f"step{step}", \
            work_dir / "out"  # fmt: skip
        _stage(store, target_id, target_files, npu_dir, "target")
        _stage(store, bench_id, bench_files, bench_dir, "bench")
        out_dir.mkdir()
        progress = _Progress(db, job_id, attempt, 0.05, 0.85, lease)
        progress.set(0.0)

        from parity.server.jobs.engine import compare_step, write_step_summary

        try:
            outputs = compare_step(npu_dir, bench_dir, options, out_dir, progress)
        except Exception as exc:
            if not _is_parity_error(exc):
                raise
            # The engine names files by their staged paths; the client knows them by run and dump path.
            message = str(exc).replace(f"{npu_dir}/", f"target run {target_id}: step{step}/")
            message = message.replace(f"{bench_dir}/", f"bench run {bench_id}: step{step}/")
            raise JobError(message.replace(f"{work_dir}/", "")) from exc
        for out in outputs:
            store.put_file(out.xlsx, comparison_key(job_id, f"rank{out.rank}/report.xlsx"))
            store.put_file(out.advisor, comparison_key(job_id, f"rank{out.rank}/advisor.txt"))
        store.put_file(write_step_summary(outputs, out_dir), comparison_key(job_id, "summary.json"))
    # After the staging folder is gone (the results are in memory, the reports in the store): a job seen
    # as succeeded has left nothing in the temp folder.
    _finish_succeeded(db, store, job_id, attempt, outputs)


def _row_name(cells: list[Any]) -> str:
    """The text the rows endpoint's ``name=`` filter searches: the NPU name, else the bench name."""
    for cell in cells[:2]:
        if isinstance(cell, str) and cell and cell != "N/A":
            return cell
    return ""


def _finish_succeeded(db: Database, store: BlobStore, job_id: str, attempt: int, outputs: list[Any]) -> None:
    summary, headers = build_summary(outputs)
    with db.write() as session:
        # Locked (PostgreSQL) from this check to the commit, so that a claim made meanwhile, after a lapsed
        # lease, either comes first and makes this attempt stale, or waits and finds the job succeeded.
        c = session.get(Comparison, job_id, with_for_update=True)
        if c is not None:
            if c.attempt != attempt or c.status != "running":
                logger.warning("comparison %s: attempt %d is stale; its result is dropped", job_id, attempt)
                return
            _insert_rows(session, job_id, outputs)
            c.status, c.progress, c.finished_at, c.lease_expires_at = "succeeded", 1.0, utcnow(), None
            c.summary, c.headers, c.error = summary, headers, None
    if c is None:
        # Deleted while it ran (with its run, or on its own): the deleter removed the reports that were there
        # then, and the ones this job stored since would stay for good.
        logger.info("comparison %s was deleted while it ran; its reports are removed", job_id)
        store.delete_prefix(comparison_key(job_id))
        return
    logger.info("comparison %s succeeded: %d rows", job_id, summary["rows"])


def _insert_rows(session: Any, job_id: str, outputs: list[Any]) -> None:
    table = ComparisonRow.__table__
    session.execute(delete(ComparisonRow).where(ComparisonRow.comparison_id == job_id))
    batch: list[dict[str, Any]] = []
    for out in outputs:
        for index, row in enumerate(out.result.rows):
            status = getattr(row.status, "value", row.status)
            highlight = getattr(row.highlight, "value", row.highlight)
            batch.append({
                "comparison_id": job_id, "rank": out.rank, "index": index, "api": row.api,
                "status": status, "highlight": highlight, "name": _row_name(row.cells),
                "failing": status in FAILING_STATUSES,
                "cells": json.dumps(_json_safe(row.cells), separators=(",", ":")),
            })  # fmt: skip
            if len(batch) >= ROW_BATCH:
                session.execute(insert(table), batch)
                batch = []
    if batch:
        session.execute(insert(table), batch)


def _json_safe(cells: list[Any]) -> list[Any]:
    """JSON has no NaN or infinity: such a float cell is served as msprobe writes it in text."""
    out: list[Any] = []
    for v in cells:
        if isinstance(v, float) and v != v:
            out.append("Nan")
        elif isinstance(v, float) and v in (float("inf"), float("-inf")):
            out.append("inf" if v > 0 else "-inf")
        else:
            out.append(v if isinstance(v, (str, int, float, bool)) or v is None else str(v))
    return out


def build_summary(outputs: list[Any]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The Comparison body's ``summary`` and the per-rank headers, from the engine's results."""
    rows = failing_rows = 0
    failing_apis: dict[str, None] = {}
    suspects: list[dict[str, Any]] = []
    headers: dict[str, list[str]] = {}
    modes: list[str] = []
    for out in outputs:
        result = out.result
        headers[str(out.rank)] = list(result.header)
        modes.append(getattr(result.mode, "value", str(result.mode)))
        rows += len(result.rows)
        failing_rows += sum(
            1 for r in result.rows if getattr(r.status, "value", r.status) in FAILING_STATUSES
        )
        for api in result.failing_apis():
            failing_apis.setdefault(api)
        for s in result.suspects:
            suspects.append({"rank": s.rank, "api": s.api, "direction": s.direction, "row_index": s.row_index,
                             "reason": s.reason, "stack": s.stack, "compare_rank": out.rank})  # fmt: skip
    suspects.sort(key=lambda s: (s["rank"], s["compare_rank"]))
    summary = {
        "rows": rows, "failing_rows": failing_rows, "failing_apis": list(failing_apis),
        "top_suspects": suspects[:TOP_SUSPECTS], "ranks": sorted(out.rank for out in outputs),
        "mode": modes[0] if len(set(modes)) == 1 else "mixed" if modes else "none",
    }  # fmt: skip
    return summary, headers
