"""The REST contract's bodies (pydantic); the ORM models never leave the services."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Device = Literal["npu", "gpu", "cpu", "other"]
RunStatus = Literal["uploading", "complete", "invalid"]
JobStatus = Literal["queued", "running", "succeeded", "failed"]


class RunCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

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


class RunPublic(BaseModel):
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


class RunsPublic(BaseModel):
    data: list[RunPublic]
    count: int


class FilePublic(BaseModel):
    path: str
    size: int
    sha256: str


class FilesPublic(BaseModel):
    data: list[FilePublic]
    count: int


class CompareOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fuzzy_match: bool = False
    stack_mode: bool = False


class ComparisonCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target_run: str = Field(description="id or name of the run under test")
    bench_run: str = Field(description="id or name of the reference run")
    project: str | None = Field(default=None, description="project the run names are looked up in")
    step: int | None = Field(default=None, ge=0)
    ranks: list[int] | None = None
    options: CompareOptions = Field(default_factory=CompareOptions)


class SuspectPublic(BaseModel):
    rank: int
    api: str
    direction: str
    row_index: int
    reason: str
    stack: str | None
    compare_rank: int


class ComparisonSummary(BaseModel):
    rows: int
    failing_rows: int
    failing_apis: list[str]
    top_suspects: list[SuspectPublic]
    ranks: list[int]
    mode: str


class ComparisonPublic(BaseModel):
    id: str
    status: JobStatus
    error: str | None
    progress: float
    target_run: str
    bench_run: str
    step: int | None
    ranks: list[int] | None
    options: CompareOptions
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    summary: ComparisonSummary | None


class ComparisonsPublic(BaseModel):
    data: list[ComparisonPublic]
    count: int


class RowPublic(BaseModel):
    index: int
    rank: int
    api: str
    status: str
    highlight: str | None
    cells: list[Any]


class RowsPublic(BaseModel):
    header: list[str]
    data: list[RowPublic]
    count: int


class Health(BaseModel):
    status: Literal["ok"]
