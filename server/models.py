"""The database tables (SQLAlchemy 2.0 ORM), portable between SQLite and PostgreSQL.

Only portable types are used (``String``, ``Text``, ``JSON``, ``BigInteger``, ``DateTime``) so that one
migration tree serves both backends. Row cells are kept as JSON *text* rather than ``JSON`` so the rows
endpoint can splice them into its response without decoding and re-encoding 100,000 rows.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    false,
    true,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

# Named constraints, so Alembic's batch mode on SQLite can find and rebuild them.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime on both backends (SQLite hands timestamps back naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Run(Base):
    """One uploaded dump (every step and rank of one training run).

    Status: ``uploading`` → (complete asked) ``validating`` → ``complete`` | ``invalid`` (``error`` names the
    file and entry); an ``invalid`` run may take more files and be completed again.
    """

    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), index=True)
    project: Mapped[str] = mapped_column(String(255), index=True)
    device: Mapped[str] = mapped_column(String(16))
    tags: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), index=True, default="uploading")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # Revision 0007: the project's known-good run (at most one per project, kept so by the service), and
    # whether completing this run queues a comparison against that baseline.
    baseline: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    auto_compare: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    # Never deleted by the retention sweep (revision 0006).
    keep: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The validation that ``complete`` queues is a job (``jobs``, kind ``validate``, subject the run id).
    # Revision 0013: the comparison whose plan this run's dump followed (``parity plan``); no foreign key,
    # so the provenance outlives a deleted comparison.
    planned_by: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    # Revision 0014: why completing the run queued no comparison against the baseline (its page says so).
    auto_compare_note: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Revision 0015: what its dump holds (``shared.dump.sidecar.dump_task``), recorded at validation; NULL
    # before. Auto-compare skips a baseline whose dump cannot be compared with it.
    dump_task: Mapped[str | None] = mapped_column(String(32), nullable=True)

    __table_args__ = (Index("ix_runs_project_baseline", "project", "baseline"),)


class RunTag(Base):
    """A run's tags again, one row each, so ``tag=k:v`` filters are indexed on both backends."""

    __tablename__ = "run_tags"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    value: Mapped[str] = mapped_column(String(1024))

    __table_args__ = (Index("ix_run_tags_key_value", "key", "value"),)


class RunFile(Base):
    """One stored file of a run; ``step``/``rank`` are parsed from ``stepN/rankR/...`` paths.

    The primary key (run, path) is what decides a race between two uploads of one path: exactly one insert
    wins. ``blob`` is the store key of the winner's bytes (revision 0003), so the row alone says which bytes
    are the file; rows from before 0003 point at the old layout, ``runs/{run}/{path}``.
    """

    __tablename__ = "run_files"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    blob: Mapped[str] = mapped_column(Text)
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rank: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Comparison(Base):
    """A comparison and, once it succeeded, its summary. Its work is one job per rank pair (``Job``, kind
    ``rank``, subject the comparison id); the last job to finish merges the ranks into this row."""

    __tablename__ = "comparisons"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    target_run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    bench_run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    ranks: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)
    options: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), index=True, default="queued")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # rank (as a string key) -> column header of that rank's rows; the ranks that have reports.
    headers: Mapped[dict[str, list[str]] | None] = mapped_column(JSON, nullable=True)
    # Revision 0007: the bench run was its project's baseline when the comparison was queued; such
    # comparisons are the ones whose failing APIs are judged new or known.
    against_baseline: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class ComparisonRow(Base):
    """One row of a finished comparison's table (revision 0002)."""

    __tablename__ = "comparison_rows"

    comparison_id: Mapped[str] = mapped_column(
        ForeignKey("comparisons.id", ondelete="CASCADE"), primary_key=True
    )
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    idx: Mapped[int] = mapped_column("index", Integer, primary_key=True)
    api: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    highlight: Mapped[str | None] = mapped_column(String(8), nullable=True)
    name: Mapped[str] = mapped_column(Text)
    failing: Mapped[bool] = mapped_column(Boolean)
    cells: Mapped[str] = mapped_column(Text)  # JSON text of the cell list
    # The localization score of the row's call (revision 0008); NULL: not judged or identical.
    score: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (
        Index("ix_comparison_rows_failing", "comparison_id", "failing", "rank", "index"),
        Index("ix_comparison_rows_score", "comparison_id", "score"),
    )


class Job(Base):
    """One unit of work on the job backends (revision 0012): claimed under a lease, renewed, finished.

    Two kinds share the table and the protocol (``JobRepository``):

    * ``rank``: one rank pair of a comparison (``subject`` the comparison id), or one slice of it: a rank
      pair over ``PARITY_TASK_MAX_BYTES`` is ``slices`` jobs, slice k comparing the k-th share of its calls,
      and the slice that finds the others done joins them and holds the rank's result (``rows``,
      ``summary``, ``header``);
    * ``validate``: the validation of a run's dump.json files (``subject`` the run id), queued by
      ``complete``; it makes the run ``complete`` or ``invalid``.

    ``id`` is the job id the backends carry (``jobs.base``: ``{comparison}:{rank}[.{slice}]``,
    ``validate:{run}``). A claim is one conditional UPDATE (``attempt`` + 1, a lease until
    ``lease_expires_at``), so exactly one claimant wins; a worker that dies loses its job once the lease has
    passed, and every write of an attempt is guarded by its number, so a stale worker cannot overwrite a newer
    attempt. Status: queued → running → succeeded | failed | skipped (a side has no dump.json for the rank).
    """

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(96), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    subject: Mapped[str] = mapped_column(String(32))
    rank: Mapped[int | None] = mapped_column(Integer, nullable=True)
    slice: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    slices: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    status: Mapped[str] = mapped_column(String(16), default="queued")
    attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    worker: Mapped[str | None] = mapped_column(String(255), nullable=True)  # host:pid of the claimant
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # A rank job's result: its rows' count, its summary document and its column header.
    rows: Mapped[int | None] = mapped_column(Integer, nullable=True)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    header: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    queued_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    __table_args__ = (
        Index("ix_jobs_subject", "kind", "subject", "rank", "slice"),
        Index("ix_jobs_queue", "status", "queued_at"),
        Index("ix_jobs_worker", "worker"),
    )


class ComparisonCall(Base):
    """One API call of a finished comparison (revision 0007): the error of its outputs, in execution order.

    Built once from the rows (``services/calls.py``), so the chart, the rank x API heatmap and an API's
    history across comparisons read a few thousand small rows instead of re-parsing a million cells.
    """

    __tablename__ = "comparison_calls"

    comparison_id: Mapped[str] = mapped_column(
        ForeignKey("comparisons.id", ondelete="CASCADE"), primary_key=True
    )
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)  # execution order within the rank
    api: Mapped[str] = mapped_column(Text)
    backward: Mapped[bool] = mapped_column(Boolean)
    status: Mapped[str] = mapped_column(String(16))  # the worst of its rows
    max_rel_err: Mapped[float | None] = mapped_column(Float, nullable=True)
    one_minus_cos: Mapped[float | None] = mapped_column(Float, nullable=True)
    first_row: Mapped[int] = mapped_column(Integer)

    __table_args__ = (
        Index("ix_comparison_calls_api", "api", "comparison_id"),
        # The heatmap reads only the failing and warning calls of a comparison.
        Index("ix_comparison_calls_status", "comparison_id", "status"),
    )


class ComparisonCounts(Base):
    """Row counts per status of a finished comparison, written with its calls (revision 0007)."""

    __tablename__ = "comparison_counts"

    comparison_id: Mapped[str] = mapped_column(
        ForeignKey("comparisons.id", ondelete="CASCADE"), primary_key=True
    )
    counts: Mapped[dict[str, int]] = mapped_column(JSON)


class ApiAcceptance(Base):
    """A failing API accepted in a project with a note: it counts as known from then on (revision 0007)."""

    __tablename__ = "api_acceptances"

    project: Mapped[str] = mapped_column(String(255), primary_key=True)
    api: Mapped[str] = mapped_column(String(1024), primary_key=True)
    note: Mapped[str] = mapped_column(Text)
    # Who accepted: the signed-in identity (a token's name or fingerprint; "anonymous" without tokens).
    # Rows from before revision 0011 hold the free ``author`` field here when one was given.
    accepted_by: Mapped[str] = mapped_column(String(255))
    # Revision 0011: the free-text author the request named, shown as such, never as who accepted.
    author: Mapped[str | None] = mapped_column(String(255), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Revision 0014: the API's error when it was accepted; beyond WORSE_FACTOR times it, it is ``worse``.
    level: Mapped[float | None] = mapped_column(Float, nullable=True)


class WebSession(Base):
    """A web sign-in (revision 0011). The cookie holds a random id; the row is keyed by its SHA-256, so a
    copy of the database signs no one in. Deleting the row ends the session everywhere at once."""

    __tablename__ = "web_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 hex of the cookie's id
    # HMAC-SHA256 of the token under the server key (``security.tokens``): which token signed in, so that
    # "sign out everywhere" and a token's removal from the settings end its sessions.
    token_key: Mapped[str] = mapped_column(String(64), index=True)
    can_write: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ServerSecret(Base):
    """Keys the server makes once and every process shares (revision 0011): ``session-key`` fingerprints
    tokens when ``PARITY_SESSION_SECRET`` is unset."""

    __tablename__ = "server_secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(255))
