"""``/runs``: create, list, read, delete, upload files, complete.

Wherever a path holds ``{run_id}``, a run name does too, as on the command line (URL-escaped: ``%20`` for a
space); a name that several runs have answers 409 with their ids.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

import parity.server.api.convertors  # noqa: F401 - registers {run_id:ref}
from fastapi import APIRouter, Header, Query, Request, Response, status
from fastapi.responses import JSONResponse
from parity.server.api.deps import (
    JSON_BODY_LIMIT,
    MAX_OFFSET,
    BaselineServiceDep,
    ComparisonServiceDep,
    RunServiceDep,
)
from parity.server.errors import BadRequest
from parity.server.schemas import Device, FilePublic, FilesPublic, RunCreate, RunPublic, RunsPublic, RunStatus
from parity.server.services.paths import SHA256_PATTERN
from starlette.requests import ClientDisconnect

router = APIRouter(prefix="/runs", tags=["runs"])

_RAW_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    summary="Create a run (names are unique in a project)",
    max_body_size=JSON_BODY_LIMIT,
)
def create_run(body: RunCreate, runs: RunServiceDep) -> RunPublic:
    return runs.create(body)


@router.get("", summary="List runs")
def list_runs(
    runs: RunServiceDep,
    baselines: BaselineServiceDep,
    project: str | None = None,
    name: Annotated[str | None, Query(description="the exact run name")] = None,
    name_contains: Annotated[str | None, Query(description="a substring of the run name, any case")] = None,
    device: Device | None = None,
    tag: Annotated[list[str], Query(description="KEY=VALUE; repeat to require several")] = [],  # noqa: B006
    run_status: Annotated[RunStatus | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    verdicts: Annotated[bool, Query(description="each run's verdict against its project's baseline "
                                    "(new, worse, clean, not compared): a few reads a run")] = False,
) -> RunsPublic:
    found = runs.search(project=project, name=name, name_contains=name_contains, device=device,
                        status=run_status, tags=tag, limit=limit, offset=offset)  # fmt: skip
    if verdicts:
        found = RunsPublic(data=baselines.with_verdicts(found.data), count=found.count)
    return found


@router.get("/{run_id}/files", summary="List a run's stored files (to resume an upload)")
def list_files(run_id: str, runs: RunServiceDep) -> FilesPublic:
    return runs.files(run_id)


@router.put(
    "/{run_id}/files/{path:path}",
    status_code=status.HTTP_201_CREATED,
    summary="Upload one dump file (streamed; sha256 verified; idempotent)",
    openapi_extra=_RAW_BODY,
    responses={200: {"model": FilePublic, "description": "Already stored with the same sha256"}},
)
async def put_file(
    run_id: str,
    path: str,
    request: Request,
    runs: RunServiceDep,
    x_content_sha256: Annotated[
        str, Header(alias="X-Content-SHA256", description="sha256 of the body, hex", pattern=SHA256_PATTERN)
    ],
    # Read to refuse an oversized upload before its body; not a parameter a client sets by hand.
    content_length: Annotated[str | None, Header(alias="Content-Length", include_in_schema=False)] = None,
) -> FilePublic:
    result = await runs.upload(run_id, path, x_content_sha256, content_length, _body(request, path))
    if not result.created:
        return JSONResponse(result.file.model_dump(), status_code=status.HTTP_200_OK)  # type: ignore[return-value]
    return result.file


async def _body(request: Request, path: str) -> AsyncIterator[bytes]:
    """The request body chunk by chunk; a client that goes away mid-upload is a one-line 400, not a 500."""
    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect:
        raise BadRequest(f"{path}: the client disconnected before the body was complete") from None


@router.post(
    "/{run_id}/complete", summary="Queue the validation of every dump.json (complete once it passes)",
    status_code=status.HTTP_202_ACCEPTED,
    responses={200: {"model": RunPublic, "description": "the run was already complete"}},
)  # fmt: skip
def complete_run(run_id: str, runs: RunServiceDep, response: Response) -> RunPublic:
    """202 with the run ``validating`` (a worker validates it: ``GET /runs/{id}`` shows ``complete``, or
    ``invalid`` with ``error`` naming the file and entry); 200 when it was already complete."""
    run = runs.complete(run_id)
    if run.status == "complete":
        response.status_code = status.HTTP_200_OK
    return run


# Read and delete take ``{run_id:ref}``: a name holding an escaped "/" (``%2F``, from before names were
# checked) reaches them too. Declared after the routes below ``/{run_id}/``, which match first.
@router.get("/{run_id:ref}", summary="Read a run (by id or name)")
def get_run(run_id: str, runs: RunServiceDep) -> RunPublic:
    return runs.get(run_id)


@router.delete(
    "/{run_id:ref}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Delete a run and its files (and its comparisons, when asked)",
)
def delete_run(
    run_id: str,
    runs: RunServiceDep,
    comparisons: ComparisonServiceDep,
    with_comparisons: Annotated[
        bool, Query(description="also delete the comparisons that use the run, and their reports")
    ] = False,
) -> Response:
    comparisons.forget(runs.delete(run_id, with_comparisons=with_comparisons))
    return Response(status_code=status.HTTP_204_NO_CONTENT)
