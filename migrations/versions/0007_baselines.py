"""Baselines and the web pages: ``runs.baseline``/``auto_compare``, ``comparisons.against_baseline``, each
finished comparison's calls and status counts, and the APIs accepted with a note.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN on both backends: a batch rebuild of ``runs`` or ``comparisons`` on SQLite drops the
    # table, and with foreign keys on, the drop would cascade to every run's files and comparisons' rows.
    op.add_column("runs", sa.Column("baseline", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("runs", sa.Column("auto_compare", sa.Boolean(), nullable=False, server_default=sa.true()))
    op.create_index("ix_runs_project_baseline", "runs", ["project", "baseline"])
    op.add_column(
        "comparisons", sa.Column("against_baseline", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.create_table(
        "comparison_calls",
        sa.Column("comparison_id", sa.String(32), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("api", sa.Text(), nullable=False),
        sa.Column("backward", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("max_rel_err", sa.Float(), nullable=True),
        sa.Column("one_minus_cos", sa.Float(), nullable=True),
        sa.Column("first_row", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["comparison_id"], ["comparisons.id"], ondelete="CASCADE",
                                name="fk_comparison_calls_comparison_id_comparisons"),
        sa.PrimaryKeyConstraint("comparison_id", "rank", "seq", name="pk_comparison_calls"),
    )
    op.create_index("ix_comparison_calls_api", "comparison_calls", ["api", "comparison_id"])
    op.create_index("ix_comparison_calls_status", "comparison_calls", ["comparison_id", "status"])
    op.create_table(
        "comparison_counts",
        sa.Column("comparison_id", sa.String(32), nullable=False),
        sa.Column("counts", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["comparison_id"], ["comparisons.id"], ondelete="CASCADE",
                                name="fk_comparison_counts_comparison_id_comparisons"),
        sa.PrimaryKeyConstraint("comparison_id", name="pk_comparison_counts"),
    )
    op.create_table(
        "api_acceptances",
        sa.Column("project", sa.String(255), nullable=False),
        sa.Column("api", sa.String(1024), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("accepted_by", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("project", "api", name="pk_api_acceptances"),
    )


def downgrade() -> None:
    op.drop_table("api_acceptances")
    op.drop_table("comparison_counts")
    op.drop_index("ix_comparison_calls_status", table_name="comparison_calls")
    op.drop_index("ix_comparison_calls_api", table_name="comparison_calls")
    op.drop_table("comparison_calls")
    with op.batch_alter_table("comparisons") as batch:
        batch.drop_column("against_baseline")
    with op.batch_alter_table("runs") as batch:
        batch.drop_index("ix_runs_project_baseline")
        batch.drop_column("auto_compare")
        batch.drop_column("baseline")
