"""Baselines and regressions over REST: ``PATCH /runs/{id or name}`` (name, tags, baseline), a comparison's
calls, its failing APIs judged new, worse, known or fixed and its environment difference, a project's
accepted APIs (accepted and revoked) and an API's history across the project's comparisons."""

from __future__ import annotations

from typing import Annotated

import parity.server.api.convertors  # noqa: F401 - registers {run_id:ref}
from fastapi import APIRouter, Query, Request, Response, status
from parity.server.api.deps import (
    JSON_BODY_LIMIT,
    BaselineServiceDep,
    CallServiceDep,
    ComparisonServiceDep,
    identity,
)
from parity.server.errors import BadRequest
from parity.server.schemas import (
    MAX_INDEX,
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


@router.patch("/runs/{run_id:ref}", summary="Rename or retag a run (by id or name), or make it its "
              "project's baseline", max_body_size=JSON_BODY_LIMIT)  # fmt: skip
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


@router.get("/comparisons/{comparison_id}/regressions",
            summary="Failing APIs judged new, worse, known or fixed (new and worse first), errors before and "
                    "after")
def get_regressions(comparison_id: str, baselines: BaselineServiceDep) -> RegressionsPublic:
    return baselines.with_stack_lines(baselines.regressions(comparison_id), comparison_id)


@router.get("/comparisons/{comparison_id}/environment", summary="What differs between the runs' environments")
def get_environment(comparison_id: str, baselines: BaselineServiceDep) -> EnvironmentDiff:
    return baselines.environment(comparison_id)


@router.get("/projects/{project}/acceptances", summary="The failing APIs accepted in a project, with notes",
            responses={404: {"description": "No run has this project"}})
def list_acceptances(project: str, baselines: BaselineServiceDep) -> AcceptancesPublic:
    return baselines.acceptances(project)


@router.post("/projects/{project}/acceptances", status_code=status.HTTP_201_CREATED,
             summary="Accept a failing API with a note: known from now on, unless its error grows",
             max_body_size=JSON_BODY_LIMIT,
             responses={404: {"description": "No run has this project"},
                        422: {"description": "The API is in none of the project's comparisons"}})  # fmt: skip
def accept_api(
    project: str, body: AcceptanceCreate, request: Request, baselines: BaselineServiceDep
) -> AcceptancePublic:
    return baselines.accept(project, body, identity(request))


@router.delete("/projects/{project}/acceptances/{api:ref}", status_code=status.HTTP_204_NO_CONTENT,
               summary="Revoke an API's acceptance: it is judged by its history again",
               responses={404: {"description": "No run has this project, or it has not accepted the API"}},
               )  # fmt: skip
def revoke_acceptance(project: str, api: str, baselines: BaselineServiceDep) -> Response:
    baselines.revoke(project, api)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/projects/{project}/api-history",
            summary="One API's error across the project's comparisons, one series per step and mode",
            responses={404: {"description": "No run has this project"},
                       422: {"description": "The API is in none of the project's comparisons"}})  # fmt: skip
def api_history(
    project: str, baselines: BaselineServiceDep, api: Annotated[str, Query(min_length=1, max_length=1024)],
    step: Annotated[int | None, Query(ge=0, le=MAX_INDEX)] = None,
    mode: Annotated[str | None, Query(max_length=32, description="tensor, statistics or md5")] = None,
    rank: Annotated[int | None, Query(ge=0, le=MAX_INDEX)] = None,
) -> ApiHistoryPublic:
    return baselines.api_history(project, api, step=step, mode=mode, rank=rank)
