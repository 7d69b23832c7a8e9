"""``/comparisons``: queue a compare job, follow it, page its rows, download its reports."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response, status
from fastapi.responses import StreamingResponse
from parity.server.api.deps import JSON_BODY_LIMIT, MAX_OFFSET, ComparisonServiceDep
from parity.server.schemas import (
    MAX_INDEX,
    ComparisonCreate,
    ComparisonPublic,
    ComparisonsPublic,
    JobStatus,
    PlanPublic,
    ReplayVerdictsPublic,
    RowsPublic,
)
from parity.server.services.comparisons import RowFilter
from parity.server.services.plans import comparison_plan
from parity.shared.plan import DEFAULT_NEIGHBOURS, DEFAULT_TOP

router = APIRouter(prefix="/comparisons", tags=["comparisons"])

XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Queue a comparison of two complete runs (by id or name)",
    max_body_size=JSON_BODY_LIMIT,
    responses={
        200: {"model": ComparisonPublic, "description": "The same comparison exists and has succeeded"},
        202: {"description": "Queued or running: new, the same one asked for again, or a failed one retried"},
    },
)
def create_comparison(
    body: ComparisonCreate, comparisons: ComparisonServiceDep, response: Response
) -> ComparisonPublic:
    comparison = comparisons.create(body)
    if comparison.status == "succeeded":  # asked for again: nothing was accepted, the answer is here
        response.status_code = status.HTTP_200_OK
    return comparison


@router.get("", summary="List comparisons")
def list_comparisons(
    comparisons: ComparisonServiceDep,
    run: Annotated[str | None, Query(description="id or name of a run the comparison uses")] = None,
    project: str | None = None,
    job_status: Annotated[JobStatus | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> ComparisonsPublic:
    return comparisons.search(run=run, project=project, status=job_status, limit=limit, offset=offset)


@router.post(
    "/{comparison_id}/retry",
    summary="Run the failed ranks of a failed comparison again (the others keep their results)",
    responses={409: {"description": "The comparison has not failed, or no rank of it failed"}},
)
def retry_comparison(comparison_id: str, comparisons: ComparisonServiceDep) -> ComparisonPublic:
    return comparisons.retry(comparison_id)


@router.post(
    "/{comparison_id}/cancel",
    summary="Stop a queued or running comparison (its unfinished ranks fail as cancelled; retry runs them)",
    responses={409: {"description": "The comparison is not queued or running"}},
)
def cancel_comparison(comparison_id: str, comparisons: ComparisonServiceDep) -> ComparisonPublic:
    return comparisons.cancel(comparison_id)


@router.get("/{comparison_id}", summary="Read a comparison: status, progress and state of each rank, summary")
def get_comparison(comparison_id: str, comparisons: ComparisonServiceDep) -> ComparisonPublic:
    return comparisons.get(comparison_id)


@router.delete(
    "/{comparison_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Delete a comparison, its rows and reports (its runs stay)",
)
def delete_comparison(comparison_id: str, comparisons: ComparisonServiceDep) -> Response:
    comparisons.delete(comparison_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/{comparison_id}/rows",
    summary="Page a succeeded comparison's rows",
    response_model=RowsPublic,
    responses={409: {"description": "The comparison has not succeeded"}},
)
async def get_rows(
    comparison_id: str,
    comparisons: ComparisonServiceDep,
    failing: Annotated[
        bool | None, Query(description="true: fail, warning, unmatched rows (red, yellow); false: the others")
    ] = None,
    row_status: Annotated[
        list[str], Query(alias="status", description="row statuses, comma-separated or repeated")
    ] = [],  # noqa: B006
    name: Annotated[str | None, Query(description="substring of the NPU (or bench) name, any case")] = None,
    rank: Annotated[int | None, Query(ge=0, le=MAX_INDEX)] = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    sort: Annotated[
        Literal["index", "score"],
        Query(description="index: table order (rank, row); score: the localization score, highest first"),
    ] = "index",
) -> Response:
    rows = RowFilter.parse(failing=failing, status=row_status, name=name)
    # Assembled from stored JSON text (no model validation): this is the hot endpoint.
    body = await comparisons.rows_json_async(comparison_id, rows, rank=rank, limit=limit, offset=offset,
                                             sort=sort)  # fmt: skip
    return Response(body, media_type="application/json")


@router.get(
    "/{comparison_id}/replay",
    summary="Read the float64 replay verdicts of a comparison's top suspects: whose kernel is wrong",
    response_model=ReplayVerdictsPublic,
    responses={409: {"description": "The comparison has not succeeded"}},
)
def get_replay(
    comparison_id: str,
    comparisons: ComparisonServiceDep,
    rank: Annotated[int | None, Query(ge=0, le=MAX_INDEX)] = None,
    entry: Annotated[str | None, Query(max_length=1000, description="one dump entry name")] = None,
) -> ReplayVerdictsPublic:
    return comparisons.replay(comparison_id, rank=rank, entry=entry)


@router.get(
    "/{comparison_id}/plan",
    summary="The next dump's plan: an msprobe config.json that dumps the suspects' tensors (parity plan)",
    responses={409: {"description": "The comparison has not succeeded"},
               422: {"description": "The comparison's summary holds no plan, or a dump it needs is gone"}},
)
def get_plan(
    comparison_id: str,
    comparisons: ComparisonServiceDep,
    top: Annotated[int, Query(ge=1, le=1000, description="how many suspects, by score")] = DEFAULT_TOP,
    neighbours: Annotated[
        int, Query(ge=0, le=16, description="also the calls this many data-flow steps from a suspect")
    ] = DEFAULT_NEIGHBOURS,
) -> PlanPublic:
    return comparison_plan(comparisons, comparison_id, top=top, neighbours=neighbours)


def _download(comparisons: ComparisonServiceDep, comparison_id: str, file_name: str, rank: int | None,
              media_type: str) -> StreamingResponse:  # fmt: skip
    return _attachment(comparisons.report(comparison_id, file_name, rank), media_type)


def _attachment(download: tuple[str, Iterator[bytes]], media_type: str) -> StreamingResponse:
    name, chunks = download
    return StreamingResponse(
        chunks, media_type=media_type, headers={"Content-Disposition": f'attachment; filename="{name}"'}
    )


@router.get(
    "/{comparison_id}/report.xlsx",
    summary="Download one rank's xlsx report",
    response_class=StreamingResponse,
    responses={200: {"content": {XLSX: {}}}},
)
def get_report(
    comparison_id: str, comparisons: ComparisonServiceDep,
    rank: Annotated[int | None, Query(ge=0, le=MAX_INDEX)] = None,
) -> StreamingResponse:
    return _download(comparisons, comparison_id, "report.xlsx", rank, XLSX)


@router.get(
    "/{comparison_id}/advisor.txt",
    summary="Download one rank's advisor text",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/plain": {}}}},
)
def get_advisor(
    comparison_id: str, comparisons: ComparisonServiceDep,
    rank: Annotated[int | None, Query(ge=0, le=MAX_INDEX)] = None,
) -> StreamingResponse:
    return _download(comparisons, comparison_id, "advisor.txt", rank, "text/plain; charset=utf-8")


@router.get(
    "/{comparison_id}/summary.json",
    summary="Download the summary JSON (each rank's counts, verdict, suspects), as parity compare writes it",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/json": {}}}},
)
def get_summary_file(comparison_id: str, comparisons: ComparisonServiceDep) -> StreamingResponse:
    return _attachment(comparisons.summary_file(comparison_id), "application/json")
