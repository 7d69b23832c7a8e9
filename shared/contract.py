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
from typing import Annotated, Any, Literal

from parity.shared.naming import (
    MAX_NAME_LENGTH,
    MAX_TAG_KEY_LENGTH,
    MAX_TAG_VALUE_LENGTH,
    NameRefused,
    check_name,
    check_tags,
)
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

__all__ = [
    "API_PREFIX",
    "AcceptanceCreate",
    "AcceptancePublic",
    "AcceptancesPublic",
    "ApiHistoryPoint",
    "ApiHistoryPublic",
    "ApiVerdict",
    "BaselineVerdict",
    "BaselineVerdictKind",
    "Verdict",
    "CallPublic",
    "CallsPublic",
    "EnvironmentChange",
    "EnvironmentDiff",
    "RegressionsPublic",
    "RunUpdate",
    "ComparisonCreate",
    "ComparisonOptions",
    "ComparisonPublic",
    "ComparisonsPublic",
    "ComparisonSummary",
    "Device",
    "ErrorPublic",
    "FilePublic",
    "FilesPublic",
    "Health",
    "JobStatus",
    "MAX_INDEX",
    "MAX_METADATA_DEPTH",
    "PlanCallPublic",
    "PlanPublic",
    "RankTaskPublic",
    "ReplaySidePublic",
    "ReplayVerdictPublic",
    "SystematicPublic",
    "ReplayVerdictsPublic",
    "RowPublic",
    "RowsPublic",
    "RunCreate",
    "RunPublic",
    "RunStatus",
    "RunsPublic",
    "SuspectPublic",
    "TaskStatus",
    "split_tag",
]

#: Where the versioned API is mounted; ``/healthz`` sits outside it.
API_PREFIX = "/api/v1"

Device = Literal["npu", "gpu", "cpu", "other"]
RunStatus = Literal["uploading", "validating", "complete", "invalid"]
JobStatus = Literal["queued", "running", "succeeded", "failed"]
#: A rank task: ``skipped`` when the rank is in both runs but a side has no dump.json for it.
TaskStatus = Literal["queued", "running", "succeeded", "failed", "skipped"]

#: The largest step or rank number (they are stored as 32-bit integers).
MAX_INDEX = 2**31 - 1
#: How deep a run's metadata may nest. Deeper documents are refused: 300 levels stored once made every
#: later read of the run list fail (the encoders recurse), for every user.
MAX_METADATA_DEPTH = 32
#: A tag as the schema describes it; :func:`parity.shared.naming.check_tags` is the rule that applies.
_TagKey = Annotated[str, Field(min_length=1, max_length=MAX_TAG_KEY_LENGTH)]
_TagValue = Annotated[str, Field(max_length=MAX_TAG_VALUE_LENGTH)]


def _named(value: str, field: str) -> str:
    """``check_name`` in a validator: the problem alone, since pydantic's error names the field."""
    try:
        return check_name(value, field)
    except NameRefused as exc:
        raise ValueError(exc.problem) from None


def _tagged(tags: dict[str, str]) -> dict[str, str]:
    try:
        return check_tags(tags)
    except NameRefused as exc:
        raise ValueError(exc.problem) from None


def split_tag(text: str) -> tuple[str, str]:
    """One tag written as ``KEY=VALUE`` (the CLI's ``--tag``, the REST ``tag=`` filter, the web forms), split
    at the first ``=`` so a value may hold ``=`` or ``:``. A text with no ``=`` or an empty key is a
    ``ValueError`` that names it."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"tag {text!r}: expected KEY=VALUE")
    return key.strip(), value.strip()


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


class _Request(BaseModel):
    """A request body: unknown fields are refused, so a misspelt option never passes unnoticed."""

    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    """A response body: unknown fields are ignored, so a client reads the answers of a newer server."""

    model_config = ConfigDict(extra="ignore")


# -- runs ---------------------------------------------------------------------------------------------------


class RunCreate(_Request):
    """``POST /runs``: a new run, in status ``uploading`` until ``POST /runs/{id}/complete``."""

    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH, description="trimmed; no '/' nor control "
                      "characters (parity.shared.naming)")  # fmt: skip
    project: str = Field(default="default", min_length=1, max_length=MAX_NAME_LENGTH)
    device: Device
    tags: dict[_TagKey, _TagValue] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(
        default_factory=dict, description=f"free JSON, nested at most {MAX_METADATA_DEPTH} levels"
    )
    keep: bool = Field(default=False, description="never deleted by the retention sweep")
    planned_by: str | None = Field(
        default=None, max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
        description="the comparison whose plan this run's dump followed (parity plan)",
    )

    @field_validator("name", "project")
    @classmethod
    def _addressable(cls, value: str, info: ValidationInfo) -> str:
        return _named(value, info.field_name or "name")

    @field_validator("tags")
    @classmethod
    def _filterable(cls, tags: dict[str, str]) -> dict[str, str]:
        return _tagged(tags)

    @field_validator("metadata")
    @classmethod
    def _shallow(cls, value: dict[str, Any]) -> dict[str, Any]:
        if _nesting(value, MAX_METADATA_DEPTH) > MAX_METADATA_DEPTH:
            raise ValueError(f"nests deeper than {MAX_METADATA_DEPTH} levels")
        return value

    auto_compare: bool = Field(
        default=True, description="compare against the project's baseline on complete (if it has one)"
    )


class RunUpdate(_Request):
    """``PATCH /runs/{id}``: only the fields given change; ``tags`` replaces the whole set."""

    name: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH)
    tags: dict[str, str] | None = None
    baseline: bool | None = Field(default=None, description="true: the project's baseline from now on")

    @field_validator("name")
    @classmethod
    def _addressable(cls, name: str | None) -> str | None:
        return None if name is None else _named(name, "name")

    @field_validator("tags")
    @classmethod
    def _filterable(cls, tags: dict[str, str] | None) -> dict[str, str] | None:
        # the rule of a new run's tags (parity.shared.naming); ``null`` means "leave the tags as they are"
        return None if tags is None else _tagged(tags)


#: A run against its project's baseline, as every list shows it: ``worse`` or ``new`` (its latest
#: comparison against the baseline has an API worse or new), ``clean`` (nothing new nor worse), ``pending``
#: (that comparison is queued or running), ``failed`` (it failed), ``not compared`` (none; ``note`` says
#: why where the server knows), ``baseline`` (the run is the baseline).
BaselineVerdictKind = Literal["worse", "new", "clean", "pending", "failed", "not compared", "baseline"]


class BaselineVerdict(_Response):
    """A run's verdict against its project's baseline (``GET /runs?verdicts=true``): the counts are the
    verdicts of the APIs of its latest comparison against the baseline (``.../regressions``)."""

    verdict: BaselineVerdictKind
    baseline_run: str | None = None  # the project's baseline (None: the project has none)
    baseline_name: str | None = None
    comparison: str | None = None  # the comparison judged
    new: int = 0
    worse: int = 0
    known: int = 0
    fixed: int = 0
    note: str | None = None  # why it was not compared, where known

    @property
    def failing(self) -> bool:
        """Whether a gate fails on it: something new or worse."""
        return self.verdict in ("worse", "new")

    def text(self) -> str:
        """The verdict in a few words, as the lists show it: ``WORSE (2 worse, 3 known)``, ``clean``."""
        counted = (("worse", self.worse), ("new", self.new), ("known", self.known), ("fixed", self.fixed))
        counts = ", ".join(f"{n} {k}" for k, n in counted if n)
        word = self.verdict.upper() if self.failing else self.verdict
        return f"{word} ({counts})" if counts and self.verdict in ("worse", "new", "clean") else word


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
    keep: bool = False  # absent from servers before revision 0006
    file_count: int
    total_bytes: int
    steps: list[int]
    ranks: list[int]
    baseline: bool = False
    auto_compare: bool = True
    planned_by: str | None = None  # the comparison whose plan this run followed (revision 0013)
    # Why completing it queued no comparison against the project's baseline (None: one was, or none was due).
    auto_compare_note: str | None = None
    # What its dump holds: tensor, statistics, md5 (statistics with checksums), another msprobe task, or
    # mixed; None until validated (or validated before revision 0015).
    dump_task: str | None = None
    # Against the project's baseline: filled by ``GET /runs?verdicts=true`` only (None otherwise).
    verdict: BaselineVerdict | None = None
    # Rank folders (``step{N}/rank{R}``) whose step was cut short: the process raised or ended before
    # ``step()`` (``parity.shared.incomplete``); their comparisons are not of whole steps.
    incomplete: list[str] = Field(default_factory=list)

    def incomplete_in(self, step: int | None, ranks: list[int] | None) -> list[str]:
        """The rank folders of ``step`` (of ``ranks``, None: any) that are marked incomplete."""
        prefix = f"step{step if step is not None else 0}/rank"
        return [p for p in self.incomplete
                if p.startswith(prefix) and (ranks is None or int(p[len(prefix):]) in ranks)]  # fmt: skip


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
    step: int | None = Field(default=None, ge=0, le=MAX_INDEX)
    ranks: list[Annotated[int, Field(ge=0, le=MAX_INDEX)]] | None = None
    options: ComparisonOptions = Field(default_factory=ComparisonOptions)


class SuspectPublic(_Response):
    """An API where precision is first lost, as the advisor ranks it: ``position`` in that list (1 = first),
    ``compare_rank`` the process rank it ran on. Summaries stored before ``position`` was named so call it
    ``rank``, which is read as ``position``."""

    position: int = Field(validation_alias=AliasChoices("position", "rank"))
    api: str
    direction: str
    row_index: int
    reason: str
    stack: str | None
    compare_rank: int
    score: float = 0.0  # decades above what the call's inputs and the run pair's background explain
    excel_row: int | None = None  # the row as Excel numbers it in that rank's report
    collectives_before: int = 0  # collectives the rank ran before this call (who diverged first)
    gap: str | None = None  # a gap judged as one call (``api``: its target's first call): its two sides


class ReplaySidePublic(_Response):
    """One side of a float64 replay: how far its recorded output is from the replay, or why not replayed."""

    distance: float | str | None = None  # ||recorded - replay|| / ||replay||; "inf" / "nan" as text
    allowance: float | None = None  # what rounding (and, target side, its class's level) explains
    dtype: str | None = None
    reduction_length: int | None = None
    refusal: str | None = None
    level: float | None = None  # the level its API class differs by on this device (within the allowance)
    held: str | None = None  # a coarser format all its output values fit (``float16``): computed in it


class ReplayVerdictPublic(_Response):
    """The float64 replay of one call (a suspect, the first divergence, a systematic finding's first call):
    whose kernel is wrong."""

    entry: str
    direction: str
    verdict: str  # target, bench, both, neither, undecided, not-replayed
    text: str
    target: ReplaySidePublic
    bench: ReplaySidePublic
    compare_rank: int = 0


class ReplayVerdictsPublic(_Response):
    """``GET /comparisons/{id}/replay``: the verdicts stored with the comparison, and why a rank has none."""

    data: list[ReplayVerdictPublic]
    count: int
    notes: list[str] = Field(default_factory=list)


class PlanCallPublic(_Response):
    """One call of a comparison's plan: a suspect, the first divergence or a neighbour of one."""

    api: str
    rank: int | None
    role: str
    score: float | None = None


class PlanPublic(_Response):
    """``GET /comparisons/{id}/plan``: the next dump's msprobe config.json (task ``tensor``, ``list`` of the
    planned calls' entries), or ``config`` null when the comparison has no suspects (``notes`` say so)."""

    comparison_id: str
    calls: list[PlanCallPublic]
    config: dict[str, Any] | None
    notes: list[str] = Field(default_factory=list)


class SystematicPublic(_Response):
    """One API class the target computes another way (TF32, a lower precision, bfloat16 autocast): a
    finding for the pair, not a suspect."""

    api_class: str
    text: str
    first: str  # the class's first call: where it shows on identical inputs
    level: float = 0.0
    calls: int = 0
    differing: int = 0


class ComparisonSummary(_Response):
    """The verdict of a succeeded comparison, over every compared rank."""

    rows: int
    failing_rows: int
    failing_apis: list[str]
    top_suspects: list[SuspectPublic]  # ranked by score, highest first, across ranks
    first_divergence: SuspectPublic | None = None  # in the rank that diverged first
    ranks: list[int]
    mode: str
    status_counts: dict[str, int] = Field(default_factory=dict)
    skipped_ranks: list[int] = Field(default_factory=list)  # in both runs, but a side has no dump.json
    npu_only_ranks: list[int] = Field(default_factory=list)  # in the target run's step only: not compared
    bench_only_ranks: list[int] = Field(default_factory=list)  # in the bench run's step only: not compared
    replay: list[ReplayVerdictPublic] = Field(default_factory=list)  # the top suspects' float64 replays
    replay_notes: list[str] = Field(default_factory=list)  # why a rank has no replay (statistics mode)
    systematic: list[SystematicPublic] = Field(default_factory=list)  # each finding once, across ranks


class RankTaskPublic(_Response):
    """One rank of a comparison, a task of its own: status, progress, claims (a failed rank is retried
    alone with ``POST /comparisons/{id}/retry``)."""

    rank: int
    slice: int = 0  # of ``slices``: a rank past PARITY_TASK_MAX_BYTES is compared as slices of its calls
    slices: int = 1
    status: TaskStatus
    progress: float
    attempt: int
    error: str | None
    rows: int | None
    started_at: datetime | None
    finished_at: datetime | None


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
    tasks: list[RankTaskPublic] = Field(default_factory=list)  # one per rank, in rank order
    against_baseline: bool = False


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
    score: float | None = None  # the localization score of the row's call (None: not judged or identical)
    cells: list[Any]


class RowsPublic(_Response):
    """One page of ``GET /comparisons/{id}/rows``."""

    header: list[str]
    data: list[RowPublic]
    count: int


# -- baselines and regressions ------------------------------------------------------------------------------


#: An API against a baseline, judged by its error: ``new`` (failing, and passing in the previous comparison
#: against the same baseline, or there was none), ``worse`` (failing before or accepted, and its error grew
#: beyond the stated factor, passing msprobe's thresholds now or not), ``fixed`` (passing now, its error
#: dropped below the level accepted or the error before by that factor), ``known`` (the rest).
Verdict = Literal["new", "worse", "known", "fixed"]


class ApiVerdict(_Response):
    """One API of a comparison against a baseline, judged against the project's previous comparison against
    the same baseline and the notes that accepted it. ``before`` and ``after`` are its error (the largest
    max relative error of its calls over the ranks) then and now; ``growth`` is ``after`` over what it is
    judged against (the error before, or the level accepted); ``reason`` says it in words; ``failing``
    whether it fails now; ``stack`` the line of the user's code that called it, where the comparison's
    suspects name it."""

    api: str
    verdict: Verdict
    failed_before: bool
    before: float | None = None
    after: float | None = None
    growth: float | None = None
    accepted_level: float | None = None  # the error it had when it was accepted
    reason: str = ""
    note: str | None = None
    accepted_by: str | None = None  # the signed-in identity (token name or fingerprint)
    author: str | None = None  # free text the acceptance named, not checked
    failing: bool = True
    stack: str | None = None


class RegressionsPublic(_Response):
    """``GET /comparisons/{id}/regressions``: ``new`` and ``worse`` first, then ``known``, then ``fixed``,
    each group in execution order. ``worse_factor`` is the growth past which a failing API is ``worse``."""

    against_baseline: bool
    previous_comparison: str | None
    data: list[ApiVerdict]
    new: int
    known: int
    worse: int = 0
    fixed: int = 0
    worse_factor: float = 0.0
    metric: str = "max relative error"

    def overall(self) -> Literal["worse", "new", "clean"]:
        """The comparison's verdict as a whole: ``worse`` when an API is worse, else ``new`` when one is
        new, else ``clean`` (what a gate passes)."""
        return "worse" if self.worse else "new" if self.new else "clean"


class AcceptanceCreate(_Request):
    """``POST /projects/{project}/acceptances``: accept a failing API with a note (again: replaces it)."""

    api: str = Field(min_length=1, max_length=1024)
    note: str = Field(min_length=1, max_length=4000)
    #: Free text kept beside the note; who accepted is the signed-in identity, recorded by the server.
    author: str | None = Field(default=None, max_length=255)


class AcceptancePublic(_Response):
    project: str
    api: str
    note: str
    accepted_by: str  # the signed-in identity: a token's name or fingerprint, or "anonymous"
    author: str | None = None  # free text the request named, shown as such
    created_at: datetime
    level: float | None = None  # the API's error when accepted; WORSE_FACTOR times it makes it ``worse``


class AcceptancesPublic(_Response):
    data: list[AcceptancePublic]
    count: int


class ApiHistoryPoint(_Response):
    """One API's error in one comparison (one rank of it), at the comparison's step and in its mode."""

    comparison_id: str
    created_at: datetime
    step: int | None = None
    mode: str | None = None  # tensor, statistics, md5: errors of different modes are different measures
    target_run: str
    target_name: str
    bench_run: str
    rank: int
    status: str
    max_rel_err: float | None
    one_minus_cos: float | None


class ApiHistoryPublic(_Response):
    """``GET /projects/{project}/api-history?api=[&step=][&mode=][&rank=]``, oldest first. One series per
    (step, mode) in ``series``: a line never joins two steps or two modes."""

    project: str
    api: str
    data: list[ApiHistoryPoint]
    series: list[str] = Field(default_factory=list)  # "step 0, statistics", in order of first appearance
    steps: list[int] = Field(default_factory=list)  # every step and mode the API has, to filter by
    modes: list[str] = Field(default_factory=list)


class CallPublic(_Response):
    """One API call of a comparison, in execution order, with the error of its outputs."""

    seq: int
    api: str
    backward: bool
    status: str
    max_rel_err: float | None
    one_minus_cos: float | None
    first_row: int


class CallsPublic(_Response):
    """``GET /comparisons/{id}/calls?rank=``: the calls, row counts per status, the first divergence."""

    rank: int
    data: list[CallPublic]
    counts: dict[str, int]
    first_divergence: str | None


class EnvironmentChange(_Response):
    key: str
    target: Any
    bench: Any


class EnvironmentDiff(_Response):
    """What differs between the two runs' recorded environments; packages are listed apart."""

    changed: list[EnvironmentChange]
    packages_changed: list[EnvironmentChange]
    same: int
class ErrorPublic(_Response):
    """Every error answer (4xx, 5xx): one line naming the run, file, field or comparison it is about."""

    detail: str


class Health(_Response):
    """``GET /healthz``."""

    status: Literal["ok"]
