"""Baselines and regressions over REST: ``PATCH /runs/{id}`` (name, tags, baseline), a comparison's calls,
its new and known failing APIs and its environment difference, a project's accepted APIs and an API's
history across the project's comparisons."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, status
from parity.server.api.deps import (
    JSON_BODY_LIMIT,
    BaselineServiceDep,
    CallServiceDep,
    ComparisonServiceDep,
    identity,
)
from parity.server.errors import BadRequest
from parity.server.schemas import (
    AcceptanceCreate,
    AcceptancePublic,
    AcceptancesPublic,
    ApiHistoryPublic,
    CallPublic,
    CallsPublic,
    EnvironmentDiff,
    RegressionsPublic,
    RunPublic,
    RunUpdate,
)
from parity.server.services.calls import first_divergence

router = APIRouter(tags=["baselines"])


@router.patch("/runs/{run_id}", summary="Rename or retag a run, or make it its project's baseline",
              max_body_size=JSON_BODY_LIMIT)  # fmt: skip
def update_run(run_id: str, body: RunUpdate, baselines: BaselineServiceDep) -> RunPublic:
    return baselines.update_run(run_id, body)


@router.get("/comparisons/{comparison_id}/calls", summary="A succeeded comparison's calls in execution order")
def get_calls(
    comparison_id: str, comparisons: ComparisonServiceDep, calls: CallServiceDep, rank: int | None = None
) -> CallsPublic:
    c = comparisons.get(comparison_id)
    ranks = c.summary.ranks if c.summary else []
    if rank is None:
        rank = ranks[0] if ranks else 0
    elif ranks and rank not in ranks:
        raise BadRequest(f"rank: {rank} is not in comparison {comparison_id} (ranks: {ranks})")
    counts = calls.counts(comparison_id) or {}
    data = [CallPublic(**row) for row in calls.calls(comparison_id, rank)]
    summary = c.summary.model_dump() if c.summary else None
    return CallsPublic(rank=rank, data=data, counts=counts, first_divergence=first_divergence(summary, rank))


@router.get("/comparisons/{comparison_id}/regressions", summary="Failing APIs judged new or known")
def get_regressions(comparison_id: str, baselines: BaselineServiceDep) -> RegressionsPublic:
    return baselines.regressions(comparison_id)


@router.get("/comparisons/{comparison_id}/environment", summary="What differs between the runs' environments")
def get_environment(comparison_id: str, baselines: BaselineServiceDep) -> EnvironmentDiff:
    return baselines.environment(comparison_id)


@router.get("/projects/{project}/acceptances", summary="The failing APIs accepted in a project, with notes")
def list_acceptances(project: str, baselines: BaselineServiceDep) -> AcceptancesPublic:
    return baselines.acceptances(project)


@router.post("/projects/{project}/acceptances", status_code=status.HTTP_201_CREATED,
             summary="Accept a failing API with a note: it counts as known from now on",
             max_body_size=JSON_BODY_LIMIT)  # fmt: skip
def accept_api(
    project: str, body: AcceptanceCreate, request: Request, baselines: BaselineServiceDep
) -> AcceptancePublic:
    return baselines.accept(project, body, identity(request))


@router.get("/projects/{project}/api-history", summary="One API's error across the project's comparisons")
def api_history(
    project: str, baselines: BaselineServiceDep, api: Annotated[str, Query(min_length=1, max_length=1024)]
) -> ApiHistoryPublic:
    return baselines.api_history(project, api)
