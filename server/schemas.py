"""The REST contract's bodies (pydantic); the ORM models never leave the services."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Device = Literal["npu", "gpu", "cpu", "other"]
RunStatus = Literal["uploading", "complete", "invalid"]
JobStatus = Literal["queued", "running", "succeeded", "failed"]


#: The largest step or rank number (they are stored as 32-bit integers).
MAX_INDEX = 2**31 - 1
#: How deep a run's metadata may nest. Deeper documents are refused: 300 levels stored once made every
#: later read of the run list fail (the encoders recurse), for every user.
MAX_METADATA_DEPTH = 32
#: A printable single-line text: names and tags end up in log lines and file names, where a newline or an
#: escape sequence would forge a line or garble a terminal.
_ONE_LINE = r"^[^\x00-\x1f\x7f-\x9f]*$"


def _nesting(value: Any, limit: int) -> int:
    """How deep ``value`` nests (a scalar is 0), counted without recursion; stops past ``limit``."""
    depth, level = 0, [value]
    while level and depth <= limit:
        children: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                children.extend(item.values())
            elif isinstance(item, list):
                children.extend(item)
        if children:
            depth += 1
        level = children
    return depth


class RunCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=255, pattern=_ONE_LINE)
    project: str = Field(default="default", min_length=1, max_length=255, pattern=_ONE_LINE)
    device: Device
    tags: dict[
        Annotated[str, Field(min_length=1, max_length=255, pattern=_ONE_LINE)],
        Annotated[str, Field(max_length=1024, pattern=_ONE_LINE)],
    ] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(
        default_factory=dict, description=f"free JSON, nested at most {MAX_METADATA_DEPTH} levels"
    )
    keep: bool = Field(default=False, description="never deleted by the retention sweep")

    @field_validator("metadata")
    @classmethod
    def _shallow(cls, value: dict[str, Any]) -> dict[str, Any]:
        if _nesting(value, MAX_METADATA_DEPTH) > MAX_METADATA_DEPTH:
            raise ValueError(f"nests deeper than {MAX_METADATA_DEPTH} levels")
        return value


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
    keep: bool
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

    target_run: str
    bench_run: str
    step: int | None = Field(default=None, ge=0, le=MAX_INDEX)
    ranks: list[Annotated[int, Field(ge=0, le=MAX_INDEX)]] | None = None
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


class ErrorPublic(BaseModel):
    """Every error answer: one line naming the run, file, field or comparison it is about."""

    detail: str


class Health(BaseModel):
    status: Literal["ok"]
