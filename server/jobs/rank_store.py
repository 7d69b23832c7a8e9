"""How a rank job ends: its rows, calls and summary stored, or why it failed, in one transaction guarded by
its attempt; the job that finds every other one finished merges the comparison (``merge``).

Everything that takes CPU (the cells as JSON, the rank's calls, the driver's parameters) is built before the
write transaction: on SQLite that transaction holds the one write lock every other worker waits for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from parity.server.db import Database
from parity.server.job_repository import JobRepository
from parity.server.jobs.base import task_id
from parity.server.jobs.lease import LeaseLost
from parity.server.jobs.merge import COMPARISON_LOCK, merge_comparison, slice_label
from parity.server.jobs.timeline import Timeline
from parity.server.models import Comparison, ComparisonCall, ComparisonRow, Job, utcnow
from parity.server.store import BlobStore, comparison_key
from parity.shared.compare.result import FAILING_STATUSES, json_cells
from sqlalchemy import Table, delete, insert, select
from sqlalchemy.orm import Session

__all__ = ["finish_failed", "finish_skipped", "finish_slice", "finish_succeeded"]

logger = logging.getLogger(__name__)

ROW_BATCH = 5000
_FAILING = frozenset(status.value for status in FAILING_STATUSES)


def _held_task(session: Session, comparison_id: str, rank: int, attempt: int, slice_: int = 0
               ) -> Job | None:  # fmt: skip
    """The job row, locked, if ``attempt`` still holds it; None (logged) when it is stale or gone."""
    task = JobRepository(session).held(task_id(comparison_id, rank, slice_), attempt)
    if task is None:
        logger.warning("comparison %s rank %d%s: attempt %d is stale; its result is dropped", comparison_id,
                       rank, slice_label(slice_), attempt)  # fmt: skip
        return None
    return task


def finish_slice(db: Database, comparison_id: str, rank: int, slice_: int, attempt: int, rows: int) -> bool:
    """A slice's part is in the store: True when every other slice of its rank has succeeded, so this one
    joins them (it stays running, under its lease, until ``finish_succeeded``); else it is done.

    The comparison row is locked as the merge locks it, so of two slices finishing at once the second
    sees the first done, and exactly one joins the rank.
    """
    with db.write() as session:
        task = _held_task(session, comparison_id, rank, attempt, slice_)
        if task is None:
            raise LeaseLost(f"attempt {attempt} no longer holds the task")
        if session.get(Comparison, comparison_id, with_for_update=COMPARISON_LOCK) is None:
            raise LeaseLost("the comparison was deleted")
        t = Job
        others = session.scalars(
            select(t.status).where(t.kind == "rank", t.subject == comparison_id, t.rank == rank,
                                   t.slice != slice_)
        ).all()  # fmt: skip
        if all(status == "succeeded" for status in others):
            return True
        JobRepository.finish(task, "succeeded", now=utcnow(), rows=rows)
        merge_comparison(session, comparison_id)
    logger.info("comparison %s rank %d slice %d stored: %d rows", comparison_id, rank, slice_, rows)
    return False


def finish_succeeded(db: Database, store: BlobStore, comparison_id: str, rank: int, attempt: int,
                     rows: Sequence[Any], summary: dict[str, Any], header: list[str],
                     calls: Sequence[dict[str, Any]], *,
                     scores: Sequence[float | None] | None = None, slice_: int = 0,
                     timeline: Timeline | None = None, before_write: Callable[[], None] | None = None,
                     then: Callable[[Session], object] | None = None) -> bool:  # fmt: skip
    """Store one rank's rows, calls (the engine's ``call_records``) and summary, as that rank finishes; merge
    if it is the last one. False
    when this attempt no longer held the task (nothing stored). ``then`` runs in the same transaction once
    the rank is stored (the runner claims its next task there).

    Everything that takes CPU (the cells as JSON, the rank's calls) is built before the write transaction:
    on SQLite that transaction holds the one write lock every other worker waits for.
    """
    records = _row_records(comparison_id, rank, rows, scores)
    call_rows = [{"comparison_id": comparison_id, "rank": rank, "seq": seq, **call}
                 for seq, call in enumerate(calls)]  # fmt: skip
    tables = ((ComparisonRow.__table__, records), (ComparisonCall.__table__, call_rows))
    inserts = [bulk for table, batch in tables if (bulk := _BulkInsert.of(db, table, batch)) is not None]
    timeline = timeline or Timeline()
    timeline.mark("records")
    if before_write is not None:
        before_write()
    began = time.perf_counter()
    with db.write() as session:
        task = _held_task(session, comparison_id, rank, attempt, slice_)
        waited = time.perf_counter() - began  # for the write lock, on SQLite: what two workers share
        timeline.mark("locked")
        if task is not None:
            _replace_rank(session, comparison_id, rank, inserts)
            JobRepository.finish(task, "succeeded", now=utcnow(), rows=len(rows), summary=_plain(summary),
                                 header=header)  # fmt: skip
            merge_comparison(session, comparison_id)
            if then is not None:
                then(session)
        timeline.mark("inserted")
    if task is None and _comparison_gone(db, comparison_id):
        # Deleted while it ran: the deleter removed the reports there then, not the ones stored since.
        logger.info(
            "comparison %s was deleted while rank %d ran; its reports are removed", comparison_id, rank
        )
        store.delete_prefix(comparison_key(comparison_id))
        return False
    if task is not None:
        took = time.perf_counter() - began
        logger.info("comparison %s rank %d succeeded: %d rows stored in %.2f s (%.2f s of it waiting for the "
                    "database)", comparison_id, rank, len(rows), took, waited)  # fmt: skip
    return task is not None


def finish_failed(db: Database, comparison_id: str, rank: int, attempt: int, message: str, *, slice_: int = 0
                  ) -> None:  # fmt: skip
    _finish(db, comparison_id, rank, slice_, attempt, "failed", message)
    logger.warning("comparison %s rank %d%s failed: %s", comparison_id, rank, slice_label(slice_), message)


def finish_skipped(db: Database, comparison_id: str, rank: int, attempt: int, message: str, *,
                   slice_: int = 0) -> None:  # fmt: skip
    _finish(db, comparison_id, rank, slice_, attempt, "skipped", message)
    logger.warning("comparison %s rank %d%s skipped: %s", comparison_id, rank, slice_label(slice_), message)


def _finish(db: Database, comparison_id: str, rank: int, slice_: int, attempt: int, status: str, message: str
            ) -> None:  # fmt: skip
    with db.write() as session:
        task = _held_task(session, comparison_id, rank, attempt, slice_)
        if task is not None:
            JobRepository.finish(task, status, error=message, now=utcnow())
            merge_comparison(session, comparison_id)


def _comparison_gone(db: Database, comparison_id: str) -> bool:
    with db.read() as session:
        return session.get(Comparison, comparison_id) is None



def _row_name(cells: list[Any]) -> str:
    """The text the rows endpoint's ``name=`` filter searches: the NPU name, else the bench name."""
    for cell in cells[:2]:
        if isinstance(cell, str) and cell and cell != "N/A":
            return cell
    return ""


def _row_records(comparison_id: str, rank: int, rows: Sequence[Any],
                 scores: Sequence[float | None] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """One rank's ``comparison_rows`` records (cells as JSON text, non-finite numbers as text)."""
    dumps = orjson.dumps
    records = []
    for index, row in enumerate(rows):
        status = row.status.value
        records.append({
            "comparison_id": comparison_id, "rank": rank, "index": index, "api": row.api, "status": status,
            "highlight": row.highlight.value if row.highlight is not None else None,
            "name": _row_name(row.cells), "failing": status in _FAILING,
            "cells": dumps(json_cells(row.cells), default=_numpy_scalar).decode(),
            "score": scores[index] if scores is not None else None,  # the localization score of its call
        })  # fmt: skip
    return records


def _numpy_scalar(value: Any) -> Any:
    """orjson's fallback: a NumPy scalar cell as the Python number it holds."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"a cell of type {type(value).__name__} is not JSON")


def _replace_rank(session: Session, comparison_id: str, rank: int, inserts: Sequence[_BulkInsert]) -> None:
    """The rank's rows and calls, in place of whatever an earlier attempt left."""
    for model in (ComparisonRow, ComparisonCall):
        session.execute(delete(model).where(model.comparison_id == comparison_id, model.rank == rank))
    conn = session.connection()
    for bulk in inserts:
        for start in range(0, len(bulk.params), ROW_BATCH):
            conn.exec_driver_sql(bulk.sql, bulk.params[start : start + ROW_BATCH])  # type: ignore[arg-type]


@dataclass(frozen=True)
class _BulkInsert:
    """An INSERT and its parameters in the driver's own form, run straight through its executemany.

    SQLAlchemy's own executemany spends as long walking the parameters as the driver spends inserting;
    these records need no type processing. Built before the write transaction: compiling the INSERTs and
    turning a rank's 8,000 rows and 4,000 calls into the driver's tuples took 25 ms (load 4) inside it,
    holding SQLite's one write lock while the other worker waited for it to claim its next task or store
    its own rank (``bench_scale.py --trace``: 0.5–0.8 s of waiting at claims a 16-rank comparison).
    """

    sql: str
    params: list[Any]

    @classmethod
    def of(cls, db: Database, table: Table, records: Sequence[dict[str, Any]]) -> _BulkInsert | None:
        """None for no records."""
        if not records:
            return None
        compiled = insert(table).compile(dialect=db.write_engine.dialect, column_keys=list(records[0]))
        order = compiled.positiontup
        params = [tuple(r[k] for k in order) for r in records] if order is not None else list(records)
        return cls(str(compiled), params)


def _plain(doc: dict[str, Any]) -> dict[str, Any]:
    """A summary document as strict JSON values (the database's JSON type refuses NaN on PostgreSQL)."""
    from parity.shared.report.summary import json_safe

    result: dict[str, Any] = json_safe(doc)
    return result
