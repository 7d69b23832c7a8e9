"""Each finished comparison's calls: one row per API call with the error of its outputs, in execution order.

The comparison page's chart and heatmap and an API's history across comparisons all read these instead of
the comparison's rows: a 1,000,000-row comparison has some tens of thousands of calls, and the rows' cells
are JSON text that would have to be parsed again for every view. Each rank task stores its rank's calls with
its rows (the engine's ``compare.call_records``, from the rows' typed facts) and the merge step their
counts. A comparison stored before the tasks stored calls has only its rows: its page builds the calls once
from the stored cells (``index_comparison``, the one place cells are read back: nothing else remains of it).

Execution order is the order of the rows within a rank, which is the dump's order: the order the calls ran
in, forward and backward interleaved, for Parity's dumps (the writer numbers entries as they are recorded).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import orjson
from cachetools import LRUCache
from parity.server.db import Database
from parity.server.models import Comparison, ComparisonCall, ComparisonCounts, ComparisonRow
from parity.shared.compare.call_records import STATUS_RANK
from sqlalchemy import delete, insert, select

logger = logging.getLogger(__name__)
T = TypeVar("T")

INSERT_BATCH = 5000


def parse_error(cell: Any) -> float | None:
    """A metric cell as a number: floats as they are, msprobe's ``"12.5%"`` text as 0.125; ``N/A``,
    ``Nan``, ``unsupported`` and non-finite values as None (a log-scale chart cannot place them)."""
    if isinstance(cell, bool) or cell is None:
        return None
    if isinstance(cell, (int, float)):
        value = float(cell)
    elif isinstance(cell, str):
        text = cell.strip()
        scale = 1.0
        if text.endswith("%"):
            text, scale = text[:-1], 0.01
        try:
            value = float(text) * scale
        except ValueError:
            return None
    else:
        return None
    return abs(value) if math.isfinite(value) else None


@dataclass
class _Call:
    api: str
    first_row: int
    status: str = "pass"
    max_rel_err: float | None = None
    min_cos: float | None = None
    has_output: bool = False

    def add(self, status: str, is_output: bool, rel: float | None, cos: float | None) -> None:
        if STATUS_RANK.get(status, 0) > STATUS_RANK.get(self.status, 0):
            self.status = status
        if is_output and not self.has_output:
            # The error of a call is the error of its outputs; inputs count only for calls without any.
            self.has_output, self.max_rel_err, self.min_cos = True, None, None
        elif self.has_output and not is_output:
            return
        if rel is not None:
            self.max_rel_err = rel if self.max_rel_err is None else max(self.max_rel_err, rel)
        if cos is not None:
            self.min_cos = cos if self.min_cos is None else min(self.min_cos, cos)


def summarize_rows(
    header: Sequence[str], rows: Iterable[tuple[int, str, str, str, str]]
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """(calls in row order, row counts per status) of one rank from ``(index, api, status, name, cells
    JSON)`` rows in index order. Pure: the tests feed it rows directly."""
    rel_col = header.index("MaxRelativeErr") if "MaxRelativeErr" in header else None
    cos_col = header.index("Cosine") if "Cosine" in header else None
    calls: dict[str, _Call] = {}
    counts: dict[str, int] = {}
    for index, api, status, name, cells_json in rows:
        counts[status] = counts.get(status, 0) + 1
        call = calls.get(api)
        if call is None:
            call = calls[api] = _Call(api=api, first_row=index)
        cells = orjson.loads(cells_json) if rel_col is not None or cos_col is not None else []
        rel = parse_error(cells[rel_col]) if rel_col is not None and rel_col < len(cells) else None
        cos = cells[cos_col] if cos_col is not None and cos_col < len(cells) else None
        cos = cos if isinstance(cos, (int, float)) and not isinstance(cos, bool) and math.isfinite(cos) \
            else None  # fmt: skip
        call.add(status, ".output" in name[len(api):] if name.startswith(api) else False, rel, cos)
    out = [
        {
            "api": c.api, "backward": ".backward" in c.api, "status": c.status, "max_rel_err": c.max_rel_err,
            "one_minus_cos": None if c.min_cos is None else max(0.0, 1.0 - c.min_cos),
            "first_row": c.first_row,
        }  # fmt: skip
        for c in calls.values()
    ]
    return out, counts


def rank_calls(
    comparison_id: str, rank: int, header: Sequence[str], rows: Iterable[tuple[int, str, str, str, str]]
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """(``comparison_calls`` records, row counts per status) of one rank: what its task stores with its rows
    (``jobs/rank_store.py``), and what ``index_comparison`` builds for a comparison finished without them."""
    calls, counts = summarize_rows(header, rows)
    records = [{"comparison_id": comparison_id, "rank": rank, "seq": seq, **c} for seq, c in enumerate(calls)]
    return records, counts


def index_comparison(db: Database, comparison_id: str) -> bool:
    """Build ``comparison_id``'s calls and counts from its rows; False when it has not succeeded (or is
    gone). Idempotent: a second call (two page views racing the worker) rewrites the same rows."""
    with db.read() as session:
        c = session.get(Comparison, comparison_id)
        if c is None or c.status != "succeeded":
            return False
        headers = dict(c.headers or {})
    t = ComparisonRow.__table__.c
    records: list[dict[str, Any]] = []
    totals: dict[str, int] = {}
    with db.read_engine.connect() as conn:
        for rank_key in sorted(headers, key=int):
            rank = int(rank_key)
            result = conn.execute(
                select(t.index, t.api, t.status, t.name, t.cells)
                .where(t.comparison_id == comparison_id, t.rank == rank)
                .order_by(t.index)
            )
            calls, counts = rank_calls(comparison_id, rank, headers[rank_key], result)
            for status, n in counts.items():
                totals[status] = totals.get(status, 0) + n
            records.extend(calls)
    with db.write() as session:
        if session.get(Comparison, comparison_id) is None:
            return False
        session.execute(delete(ComparisonCall).where(ComparisonCall.comparison_id == comparison_id))
        session.execute(delete(ComparisonCounts).where(ComparisonCounts.comparison_id == comparison_id))
        for start in range(0, len(records), INSERT_BATCH):
            session.execute(insert(ComparisonCall), records[start : start + INSERT_BATCH])
        session.add(ComparisonCounts(comparison_id=comparison_id, counts=totals))
    logger.info("comparison %s: %d calls indexed", comparison_id, len(records))
    return True


def first_divergence(summary: dict[str, Any] | None, rank: int) -> str | None:
    """The API where precision is first lost on ``rank``: the localization's own answer when the summary
    has one (``first_divergence``), else the first of the advisor's suspects on that rank."""
    summary = summary or {}
    first = summary.get("first_divergence")
    # ``compare_rank`` is the process rank; ``position`` (``rank`` in older summaries) is the suspect's place.
    if isinstance(first, dict) and first.get("api") and first.get("compare_rank", rank) == rank:
        return str(first["api"])
    if isinstance(first, str) and first:
        return first
    for suspect in summary.get("top_suspects", []):
        if suspect.get("compare_rank") == rank:
            return str(suspect["api"])
    return None


@dataclass
class Heatmap:
    """Ranks x APIs: ``cells[r][a]`` is (status, max relative error) of API ``apis[a]`` on ``ranks[r]``."""

    ranks: list[int]
    apis: list[str]
    cells: list[list[tuple[str, float | None] | None]]


class CallService:
    """Reads a comparison's calls (building them on first read when the worker did not).

    A succeeded comparison never changes, so what the pages derive from its calls (counts, heatmap, the
    chart's series) is kept in a small in-memory LRU: a million-row comparison's heatmap scans some 10^5
    calls, which a second view should not pay again. A deleted comparison's entries are never served (its
    page answers 404 before asking) and age out.
    """

    CACHE_ENTRIES = 128

    def __init__(self, db: Database) -> None:
        self.db = db
        self._cache: LRUCache[tuple[Any, ...], Any] = LRUCache(maxsize=self.CACHE_ENTRIES)
        self._lock = threading.Lock()  # cachetools' caches are not thread-safe

    def cached(self, key: tuple[Any, ...], build: Callable[[], T]) -> T:
        with self._lock:
            if key in self._cache:
                return cast(T, self._cache[key])
        value = build()  # outside the lock: two threads may build one key, as before, and agree
        if value is not None:
            with self._lock:
                self._cache[key] = value
        return value

    def _ensure(self, comparison_id: str) -> dict[str, int] | None:
        return self.cached(("counts", comparison_id), lambda: self._counts(comparison_id))

    def _counts(self, comparison_id: str) -> dict[str, int] | None:
        with self.db.read() as session:
            row = session.get(ComparisonCounts, comparison_id)
            if row is not None:
                return dict(row.counts)
        if not index_comparison(self.db, comparison_id):
            return None
        with self.db.read() as session:
            row = session.get(ComparisonCounts, comparison_id)
            return dict(row.counts) if row is not None else None

    def counts(self, comparison_id: str) -> dict[str, int] | None:
        """Row counts per status, None until the comparison succeeded."""
        return self._ensure(comparison_id)

    def calls(self, comparison_id: str, rank: int) -> list[dict[str, Any]]:
        self._ensure(comparison_id)
        c = ComparisonCall.__table__.c
        with self.db.read_engine.connect() as conn:
            result = conn.execute(
                select(c.seq, c.api, c.backward, c.status, c.max_rel_err, c.one_minus_cos, c.first_row)
                .where(c.comparison_id == comparison_id, c.rank == rank)
                .order_by(c.seq)
            )
            return [dict(r._mapping) for r in result]

    def heatmap(self, comparison_id: str, max_apis: int = 40) -> Heatmap | None:
        """The APIs failing or warning on any rank (worst first, at most ``max_apis``), for several ranks."""
        if self._ensure(comparison_id) is None:
            return None
        key = ("heatmap", comparison_id, max_apis)
        return self.cached(key, lambda: self._heatmap(comparison_id, max_apis))

    def _heatmap(self, comparison_id: str, max_apis: int) -> Heatmap | None:
        c = ComparisonCall.__table__.c
        with self.db.read_engine.connect() as conn:
            ranks = [int(r) for r in conn.execute(
                select(c.rank).where(c.comparison_id == comparison_id).distinct().order_by(c.rank)
            ).scalars()]  # fmt: skip
            if len(ranks) < 2:
                return None
            result = conn.execute(
                select(c.rank, c.api, c.status, c.max_rel_err, c.seq)
                .where(c.comparison_id == comparison_id, c.status.in_(("fail", "warning", "unmatched")))
            ).all()
        worst: dict[str, tuple[int, float, int]] = {}
        by_cell: dict[tuple[int, str], tuple[str, float | None]] = {}
        for rank, api, status, err, seq in result:
            by_cell[(int(rank), api)] = (status, err)
            key = (STATUS_RANK.get(status, 0), err or 0.0, -int(seq))
            if api not in worst or key > worst[api]:
                worst[api] = key
        apis = sorted(worst, key=lambda a: worst[a], reverse=True)[:max_apis]
        apis.sort(key=lambda a: -worst[a][2])  # back in execution order
        cells = [[by_cell.get((rank, api)) for api in apis] for rank in ranks]
        return Heatmap(ranks=ranks, apis=apis, cells=cells)


def decimate(calls: list[dict[str, Any]], max_points: int, keep: str | None = None) -> list[dict[str, Any]]:
    """At most about ``max_points`` of ``calls`` for a chart a thousand pixels wide: the calls are cut into
    ``max_points // 2`` runs of neighbours, and of each run the call with the largest relative error and the
    one with the largest 1 - cosine are kept (a spike is never averaged away), plus the call named ``keep``
    (the first divergence). Order is kept; each kept call still carries its own ``seq``."""
    if len(calls) <= max_points:
        return calls
    buckets = max(1, max_points // 2)
    size = math.ceil(len(calls) / buckets)
    kept: list[dict[str, Any]] = []
    for start in range(0, len(calls), size):
        chunk = calls[start : start + size]
        chosen = {
            max(range(len(chunk)), key=lambda i: chunk[i]["max_rel_err"] or -1.0),
            max(range(len(chunk)), key=lambda i: chunk[i]["one_minus_cos"] or -1.0),
        }
        chosen.update(i for i, call in enumerate(chunk) if keep is not None and call["api"] == keep)
        kept.extend(chunk[i] for i in sorted(chosen))
    return kept
