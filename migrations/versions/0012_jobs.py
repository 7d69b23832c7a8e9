"""One jobs table (``jobs``) for the rank tasks and the runs' validations, and the dead columns dropped.

The claim/lease protocol was written twice: on ``comparison_tasks`` (one row per rank, or slice of a rank,
of a comparison) and on the run row (``validation_attempt``, ``validation_lease_expires_at``,
``validation_worker``). Both become rows of ``jobs``: ``kind`` ``rank`` (``subject`` the comparison,
``rank``/``slice``/``slices`` and the rank's result as before) and ``validate`` (``subject`` the run), keyed
by the job id the backends carry. Every task row moves over as it is (status, attempt, lease, result); a run
``validating`` gets its validation job, queued, or running under the lease it had. ``comparisons.attempt``
and ``comparisons.lease_expires_at`` were never read since the rank tasks (0005): dropped.

Downgrading moves the rank jobs back to ``comparison_tasks`` and the validations back onto their runs.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_RANK_ID = (
    "comparison_id || ':' || CAST(rank AS VARCHAR(12)) "
    "|| CASE WHEN slice = 0 THEN '' ELSE '.' || CAST(slice AS VARCHAR(12)) END"
)
_RESULT = "status, attempt, lease_expires_at, worker, progress, error, rows, summary, header, queued_at, " \
    "started_at, finished_at"  # fmt: skip


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(96), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("subject", sa.String(32), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("slice", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("slices", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("rows", sa.Integer(), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=True),
        sa.Column("header", sa.JSON(), nullable=True),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
    )
    op.create_index("ix_jobs_subject", "jobs", ["kind", "subject", "rank", "slice"])
    op.create_index("ix_jobs_queue", "jobs", ["status", "queued_at"])
    op.create_index("ix_jobs_worker", "jobs", ["worker"])
    op.execute(
        f"INSERT INTO jobs (id, kind, subject, rank, slice, slices, {_RESULT}) "
        f"SELECT {_RANK_ID}, 'rank', comparison_id, rank, slice, slices, {_RESULT} FROM comparison_tasks"
    )
    op.execute(
        "INSERT INTO jobs (id, kind, subject, slice, slices, status, attempt, lease_expires_at, worker, "
        "progress, queued_at) "
        "SELECT 'validate:' || id, 'validate', id, 0, 1, "
        "CASE WHEN validation_lease_expires_at IS NULL THEN 'queued' ELSE 'running' END, validation_attempt, "
        "validation_lease_expires_at, validation_worker, 0, created_at FROM runs WHERE status = 'validating'"
    )
    op.drop_index("ix_comparison_tasks_status", table_name="comparison_tasks")
    op.drop_table("comparison_tasks")
    for table, column in (("runs", "validation_worker"), ("runs", "validation_lease_expires_at"),
                          ("runs", "validation_attempt"), ("comparisons", "lease_expires_at"),
                          ("comparisons", "attempt")):  # fmt: skip
        _drop_column(table, column)


def _drop_column(table: str, column: str) -> None:
    """SQLite (3.35+) drops an unindexed column in place: Alembic's batch mode would copy the table, and
    dropping the old ``runs`` with foreign keys on (the server's engines turn them on) deletes every
    comparison of every run through ``ON DELETE CASCADE``."""
    if op.get_bind().dialect.name == "sqlite":
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    else:
        op.drop_column(table, column)


def downgrade() -> None:
    op.add_column("comparisons", sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("comparisons", sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("runs", sa.Column("validation_attempt", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("runs", sa.Column("validation_lease_expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("runs", sa.Column("validation_worker", sa.String(255), nullable=True))
    op.create_table(
        "comparison_tasks",
        sa.Column("comparison_id", sa.String(32), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("slice", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("slices", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("rows", sa.Integer(), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=True),
        sa.Column("header", sa.JSON(), nullable=True),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["comparison_id"], ["comparisons.id"],
            name="fk_comparison_tasks_comparison_id_comparisons", ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("comparison_id", "rank", "slice", name="pk_comparison_tasks"),
    )  # fmt: skip
    op.create_index("ix_comparison_tasks_status", "comparison_tasks", ["status"])
    op.execute(
        f"INSERT INTO comparison_tasks (comparison_id, rank, slice, slices, {_RESULT}) "
        f"SELECT subject, rank, slice, slices, {_RESULT} FROM jobs WHERE kind = 'rank' "
        "AND subject IN (SELECT id FROM comparisons)"
    )
    op.execute(
        "UPDATE runs SET validation_attempt = (SELECT attempt FROM jobs WHERE jobs.id = 'validate:' || runs.id), "
        "validation_lease_expires_at = (SELECT lease_expires_at FROM jobs WHERE jobs.id = 'validate:' || runs.id), "
        "validation_worker = (SELECT worker FROM jobs WHERE jobs.id = 'validate:' || runs.id) "
        "WHERE status = 'validating' AND EXISTS (SELECT 1 FROM jobs WHERE jobs.id = 'validate:' || runs.id)"
    )
    op.drop_index("ix_jobs_worker", table_name="jobs")
    op.drop_index("ix_jobs_queue", table_name="jobs")
    op.drop_index("ix_jobs_subject", table_name="jobs")
    op.drop_table("jobs")
