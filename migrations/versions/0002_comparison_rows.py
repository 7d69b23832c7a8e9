"""Comparison rows in the database (for the indexed rows endpoint) and a claim counter on comparisons.

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("comparisons") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "comparison_rows",
        sa.Column("comparison_id", sa.String(32), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("api", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("highlight", sa.String(8), nullable=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("failing", sa.Boolean(), nullable=False),
        sa.Column("cells", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["comparison_id"], ["comparisons.id"],
            name="fk_comparison_rows_comparison_id_comparisons", ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("comparison_id", "rank", "index", name="pk_comparison_rows"),
    )
    op.create_index(
        "ix_comparison_rows_failing", "comparison_rows", ["comparison_id", "failing", "rank", "index"]
    )


def downgrade() -> None:
    op.drop_table("comparison_rows")
    with op.batch_alter_table("comparisons") as batch:
        batch.drop_column("attempt")
