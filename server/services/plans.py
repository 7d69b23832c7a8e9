"""A succeeded comparison's plan for the next dump (``GET /comparisons/{id}/plan``), and the chain the pages
show: statistics runs, their comparison, the tensor re-dump it planned, that re-dump's comparisons.

The plan itself is ``parity.shared.plan`` (the same code ``parity plan`` runs on a summary file): this module
hands it the comparison's summary document and, for each rank it asks for, the data flow of the target run's
dump (the neighbours: calls that fed a suspect or read its output). That flow is read from the columns the
validation stored beside the dump.json (its sidecar), never from the dump.json itself (issue 37: eight plans
of an 86 MB dump parsed it eight times in the API process, 3.9 GiB, ``/healthz`` 18 s), and kept for the
next request: one build at a time, the last ``FLOW_CACHE`` flows kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.server.errors import ServiceError, Unprocessable
from parity.server.models import Run
from parity.server.repositories import ComparisonRepository, RunRepository
from parity.server.schemas import ComparisonPublic, PlanCallPublic, PlanPublic, RunPublic
from parity.server.store import BlobStore, sidecar_key
from parity.shared.dump.layout import DUMP_JSON, stored_prefix
from parity.shared.dump.sidecar import decode_sidecar
from parity.shared.errors import DumpError
from parity.shared.plan import PlanError, make_plan
from parity.shared.plan.dataflow import DataFlow
from sqlalchemy import select

if TYPE_CHECKING:
    from parity.server.services.comparisons import ComparisonService
    from parity.server.services.runs import RunService

__all__ = ["PlanChain", "comparison_plan", "plan_chain"]


def comparison_plan(service: ComparisonService, comparison_id: str, *, top: int,
                    neighbours: int) -> PlanPublic:  # fmt: skip
    """The plan of ``comparison_id`` (404 unknown, 409 not succeeded, 422 a summary no plan reads)."""
    summary = service.summary_document(comparison_id)  # raises 404 / 409
    with service.db.read() as session:
        c = ComparisonRepository(session).get(comparison_id)
        assert c is not None  # summary_document found it; a delete in between reads as no dump below
        step, target = c.step, c.target_run_id
        blobs = {f.path: f.blob for f in RunRepository(session).files(target) if f.path.endswith(DUMP_JSON)}

    def load_dump(rank: int | None, _npu_path: str | None) -> Mapping[str, Any] | None:
        key = blobs.get(f"{stored_prefix(step or 0, rank or 0)}/{DUMP_JSON}")
        return stored_flow(service.store, key) if key is not None else None

    try:
        plan = make_plan(summary, top=top, neighbours=neighbours, step=step, load_dump=load_dump,
                         comparison=comparison_id)  # fmt: skip
    except PlanError as exc:
        raise Unprocessable(f"comparison {comparison_id}: {exc}") from None
    calls = [PlanCallPublic(api=c.api, rank=c.rank, role=c.role, score=c.score) for c in plan.calls]
    return PlanPublic(comparison_id=comparison_id, calls=calls, config=plan.config() if plan.calls else None,
                      notes=plan.notes)  # fmt: skip


#: how many dumps' flows the API process keeps (each a few bytes per call edge; the columns are dropped)
FLOW_CACHE = 16
_flows: OrderedDict[str, dict[str, Any]] = OrderedDict()
_flows_lock = threading.Lock()


def stored_flow(store: BlobStore, blob: str) -> dict[str, Any] | None:
    """``{"level", "data": DataFlow}`` of the dump.json stored at ``blob``, from its sidecar (None: none
    stored, or of an earlier format; the plan then says the dump is not at hand). Built by one request at a
    time, so concurrent plans of one big dump wait for the first instead of each holding its columns."""
    with _flows_lock:
        found = _flows.get(blob)
        if found is not None:
            _flows.move_to_end(blob)
            return found
        key = sidecar_key(blob)
        if not store.exists(key):
            return None
        try:
            dump = decode_sidecar(b"".join(store.iter_bytes(key)), Path(blob))  # the path names it in errors
        except DumpError:  # StaleSidecar included: an earlier format, not re-parsed here
            return None
        found = {"level": dump.level, "data": DataFlow.from_columns(dump.columns)}
        del dump
        _flows[blob] = found
        while len(_flows) > FLOW_CACHE:
            _flows.popitem(last=False)
        return found


@dataclass(frozen=True)
class PlanChain:
    """Statistics runs → their comparison → the tensor re-dump it planned → the tensor comparisons of that
    re-dump (with their replay verdicts): what the pages show around any comparison or run of the chain."""

    planning: ComparisonPublic  # the statistics comparison whose plan was followed
    statistics_runs: list[RunPublic | None]  # its target and bench (None: deleted)
    planned_runs: list[RunPublic]  # the runs whose dump followed its plan
    tensor_comparisons: list[ComparisonPublic]  # comparisons between two planned runs


def plan_chain(comparisons: ComparisonService, runs: RunService, *, comparison_id: str | None = None,
               run_id: str | None = None) -> PlanChain | None:  # fmt: skip
    """The chain a comparison (or a run) belongs to, or None when it belongs to none. A comparison belongs
    as the planning one (runs name it in ``planned_by``) or as a comparison of planned runs; a run as a
    planned run or a run of the planning comparison."""
    candidates: list[str] = []
    if comparison_id is not None:
        c = comparisons.get(comparison_id)
        candidates += [comparison_id]
        candidates += [p for p in (_planned_by(runs, c.target_run), _planned_by(runs, c.bench_run)) if p]
    if run_id is not None:
        planned_by = _planned_by(runs, run_id)
        candidates += [planned_by] if planned_by else []
        candidates += [c.id for c in comparisons.search(run=run_id, project=None, status=None, limit=20,
                                                        offset=0).data]  # fmt: skip
    for root in candidates:
        with comparisons.db.read() as session:
            query = select(Run.id).where(Run.planned_by == root).order_by(Run.created_at)
            planned_ids = list(session.scalars(query))
        if not planned_ids:
            continue
        try:
            planning = comparisons.get(root)
        except ServiceError:
            continue
        planned = [r for r in (_run(runs, i) for i in planned_ids) if r is not None]
        ids = {r.id for r in planned}
        seen: dict[str, ComparisonPublic] = {}
        for run in planned:
            for other in comparisons.search(run=run.id, project=None, status=None, limit=50, offset=0).data:
                if other.target_run in ids and other.bench_run in ids:
                    seen.setdefault(other.id, other)
        stats_runs = [_run(runs, planning.target_run), _run(runs, planning.bench_run)]
        return PlanChain(planning, stats_runs, planned, sorted(seen.values(), key=lambda x: x.created_at))
    return None


def _run(runs: RunService, run_id: str) -> RunPublic | None:
    try:
        return runs.get(run_id)
    except ServiceError:
        return None


def _planned_by(runs: RunService, run_id: str) -> str | None:
    run = _run(runs, run_id)
    return run.planned_by if run is not None else None
