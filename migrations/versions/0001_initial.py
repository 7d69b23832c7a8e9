"""Runs, their tags and files, and comparisons.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("project", sa.String(255), nullable=False),
        sa.Column("device", sa.String(16), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
    )
    op.create_index("ix_runs_name", "runs", ["name"])
    op.create_index("ix_runs_project", "runs", ["project"])
    op.create_index("ix_runs_status", "runs", ["status"])
    op.create_table(
        "run_tags",
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("value", sa.String(1024), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_run_tags_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "key", name="pk_run_tags"),
    )
    op.create_index("ix_run_tags_key_value", "run_tags", ["key", "value"])
    op.create_table(
        "run_files",
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("path", sa.String(1024), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_run_files_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "path", name="pk_run_files"),
    )
    op.create_table(
        "comparisons",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("target_run_id", sa.String(32), nullable=False),
        sa.Column("bench_run_id", sa.String(32), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("ranks", sa.JSON(), nullable=True),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=True),
        sa.Column("headers", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["target_run_id"], ["runs.id"], name="fk_comparisons_target_run_id_runs", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["bench_run_id"], ["runs.id"], name="fk_comparisons_bench_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_comparisons"),
    )
    op.create_index("ix_comparisons_target_run_id", "comparisons", ["target_run_id"])
    op.create_index("ix_comparisons_bench_run_id", "comparisons", ["bench_run_id"])
    op.create_index("ix_comparisons_status", "comparisons", ["status"])


def downgrade() -> None:
    op.drop_table("comparisons")
    op.drop_table("run_files")
    op.drop_table("run_tags")
    op.drop_table("runs")
