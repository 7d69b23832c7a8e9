"""The REST contract's bodies (pydantic); the ORM models never leave the services."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
    auto_compare: bool = Field(
        default=True, description="compare against the project's baseline on complete (if it has one)"
    )


class RunUpdate(BaseModel):
    """``PATCH /runs/{id}``: only the fields given change; ``tags`` replaces the whole set."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, min_length=1, max_length=255)
    tags: dict[str, str] | None = None
    baseline: bool | None = Field(default=None, description="true: the project's baseline from now on")


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
    baseline: bool = False
    auto_compare: bool = True


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

    target_run: str
    bench_run: str
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
    against_baseline: bool = False


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


class ApiVerdict(BaseModel):
    """A failing API of a comparison against a baseline: ``new``, or ``known`` (it failed in the project's
    previous comparison against the same baseline too, or someone accepted it with a note)."""

    api: str
    verdict: Literal["new", "known"]
    failed_before: bool
    note: str | None = None
    accepted_by: str | None = None


class RegressionsPublic(BaseModel):
    against_baseline: bool
    previous_comparison: str | None
    data: list[ApiVerdict]
    new: int
    known: int


class AcceptanceCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api: str = Field(min_length=1, max_length=1024)
    note: str = Field(min_length=1, max_length=4000)
    author: str | None = Field(default=None, max_length=255)


class AcceptancePublic(BaseModel):
    project: str
    api: str
    note: str
    accepted_by: str
    created_at: datetime


class AcceptancesPublic(BaseModel):
    data: list[AcceptancePublic]
    count: int


class ApiHistoryPoint(BaseModel):
    comparison_id: str
    created_at: datetime
    target_run: str
    target_name: str
    bench_run: str
    rank: int
    status: str
    max_rel_err: float | None
    one_minus_cos: float | None


class ApiHistoryPublic(BaseModel):
    project: str
    api: str
    data: list[ApiHistoryPoint]


class CallPublic(BaseModel):
    seq: int
    api: str
    backward: bool
    status: str
    max_rel_err: float | None
    one_minus_cos: float | None
    first_row: int


class CallsPublic(BaseModel):
    rank: int
    data: list[CallPublic]
    counts: dict[str, int]
    first_divergence: str | None


class EnvironmentChange(BaseModel):
    key: str
    target: Any
    bench: Any


class EnvironmentDiff(BaseModel):
    """What differs between the two runs' recorded environments; packages are listed apart."""

    changed: list[EnvironmentChange]
    packages_changed: list[EnvironmentChange]
    same: int
