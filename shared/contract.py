"""The REST contract of ``/api/v1``: every request and response body, defined once.

The server validates requests and serialises responses with these models (``parity.server.schemas``
re-exports them for its routes and services); the client builds its requests and parses the server's answers
with the same models (``parity.client.rest``). A field added here is therefore seen by both sides at once,
and a body outside the contract fails on the side that reads it, with the field named.

This module needs pydantic only: a training job's light install (``pip install parity``) imports it without
FastAPI, SQLAlchemy or the compare engine. Requests forbid unknown fields (a typo in a client is a 422, not
a silently dropped option); responses ignore them, so an older client keeps reading a newer server's answers.

Example::

    body = RunCreate(name="llama-npu", device="npu").model_dump(mode="json")
    run = RunPublic.model_validate_json(response.content)
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "API_PREFIX",
    "ComparisonCreate",
    "ComparisonOptions",
    "ComparisonPublic",
    "ComparisonsPublic",
    "ComparisonSummary",
    "Device",
    "FilePublic",
    "FilesPublic",
    "Health",
    "JobStatus",
    "RowPublic",
    "RowsPublic",
    "RunCreate",
    "RunPublic",
    "RunStatus",
    "RunsPublic",
    "SuspectPublic",
]

#: Where the versioned API is mounted; ``/healthz`` sits outside it.
API_PREFIX = "/api/v1"

Device = Literal["npu", "gpu", "cpu", "other"]
RunStatus = Literal["uploading", "complete", "invalid"]
JobStatus = Literal["queued", "running", "succeeded", "failed"]


class _Request(BaseModel):
    """A request body: unknown fields are refused, so a misspelt option never passes unnoticed."""

    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    """A response body: unknown fields are ignored, so a client reads the answers of a newer server."""

    model_config = ConfigDict(extra="ignore")


# -- runs ---------------------------------------------------------------------------------------------------


class RunCreate(_Request):
    """``POST /runs``: a new run, in status ``uploading`` until ``POST /runs/{id}/complete``."""

    name: str = Field(min_length=1, max_length=255)
    project: str = Field(default="default", min_length=1, max_length=255)
    device: Device
    tags: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("tags")
    @classmethod
    def _tag_keys_filterable(cls, tags: dict[str, str]) -> dict[str, str]:
        # Filters and the CLI write a tag as KEY=VALUE, split at the first "=": a key holding one could
        # never be asked for.
        for key in tags:
            if not key or "=" in key:
                raise ValueError(f"tag key {key!r}: must be non-empty and hold no '=' (tags read KEY=VALUE)")
        return tags


class RunPublic(_Response):
    """A run as the server describes it; ``steps`` and ``ranks`` are read from its stored paths."""

    id: str
    name: str
    project: str
    device: str
    tags: dict[str, str]
    metadata: dict[str, Any]
    status: RunStatus
    error: str | None
    created_at: datetime
    completed_at: datetime | None
    file_count: int
    total_bytes: int
    steps: list[int]
    ranks: list[int]


class RunsPublic(_Response):
    """One page of ``GET /runs`` and the count of every run matching the filters."""

    data: list[RunPublic]
    count: int


class FilePublic(_Response):
    """One stored file of a run: its path under the dump root (``step{N}/rank{R}/...``), size and sha256."""

    path: str
    size: int
    sha256: str


class FilesPublic(_Response):
    """``GET /runs/{id}/files``: what the server holds already (an upload resumes from it)."""

    data: list[FilePublic]
    count: int


# -- comparisons --------------------------------------------------------------------------------------------


class ComparisonOptions(_Request):
    """The compare options a client may set (msprobe's ``-f`` and ``-s``)."""

    fuzzy_match: bool = False
    stack_mode: bool = False


class ComparisonCreate(_Request):
    """``POST /comparisons``: compare ``target_run`` (e.g. NPU) against ``bench_run`` at one step. Runs are
    named by id or name; ``project`` narrows the names."""

    target_run: str = Field(description="id or name of the run under test")
    bench_run: str = Field(description="id or name of the reference run")
    project: str | None = Field(default=None, description="project the run names are looked up in")
    step: int | None = Field(default=None, ge=0)
    ranks: list[int] | None = None
    options: ComparisonOptions = Field(default_factory=ComparisonOptions)


class SuspectPublic(_Response):
    """An API where precision is first lost, as the advisor ranks it."""

    rank: int
    api: str
    direction: str
    row_index: int
    reason: str
    stack: str | None
    compare_rank: int


class ComparisonSummary(_Response):
    """The verdict of a succeeded comparison, over every compared rank."""

    rows: int
    failing_rows: int
    failing_apis: list[str]
    top_suspects: list[SuspectPublic]
    ranks: list[int]
    mode: str


class ComparisonPublic(_Response):
    """A comparison job: its status, progress in [0, 1] and, once succeeded, its summary."""

    id: str
    status: JobStatus
    error: str | None
    progress: float
    target_run: str
    bench_run: str
    step: int | None
    ranks: list[int] | None
    options: ComparisonOptions
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    summary: ComparisonSummary | None


class ComparisonsPublic(_Response):
    """One page of ``GET /comparisons`` and the total count."""

    data: list[ComparisonPublic]
    count: int


class RowPublic(_Response):
    """One row of a comparison's table; ``cells`` follow :attr:`RowsPublic.header`."""

    index: int
    rank: int
    api: str
    status: str
    highlight: str | None
    cells: list[Any]


class RowsPublic(_Response):
    """One page of ``GET /comparisons/{id}/rows``."""

    header: list[str]
    data: list[RowPublic]
    count: int


class Health(_Response):
    """``GET /healthz``."""

    status: Literal["ok"]
