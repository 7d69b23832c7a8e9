"""A succeeded comparison's plan for the next dump (``GET /comparisons/{id}/plan``).

The plan itself is ``parity.shared.plan`` (the same code ``parity plan`` runs on a summary file): this module
hands it the comparison's summary document and the target run's stored dump.json of each rank it asks for,
which the neighbours (calls that fed a suspect or read its output) are read from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from parity.server.errors import Unprocessable
from parity.server.repositories import ComparisonRepository, RunRepository
from parity.server.schemas import PlanCallPublic, PlanPublic
from parity.shared.dump.layout import DUMP_JSON, stored_prefix
from parity.shared.plan import PlanError, make_plan

if TYPE_CHECKING:
    from parity.server.services.comparisons import ComparisonService

__all__ = ["comparison_plan"]


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
        if key is None or not service.store.exists(key):
            return None
        document = json.loads(b"".join(service.store.iter_bytes(key)))
        return document if isinstance(document, dict) else None

    try:
        plan = make_plan(summary, top=top, neighbours=neighbours, step=step, load_dump=load_dump,
                         comparison=comparison_id)  # fmt: skip
    except PlanError as exc:
        raise Unprocessable(f"comparison {comparison_id}: {exc}") from None
    calls = [PlanCallPublic(api=c.api, rank=c.rank, role=c.role, score=c.score) for c in plan.calls]
    return PlanPublic(comparison_id=comparison_id, calls=calls, config=plan.config() if plan.calls else None,
                      notes=plan.notes)  # fmt: skip
