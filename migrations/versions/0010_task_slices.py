"""Slices of a rank: a rank pair too large for one task is ``slices`` tasks (``comparison_tasks.slice``).

The task's key becomes ``(comparison_id, rank, slice)``. Tasks stored before are slice 0 of 1: one task per
rank, as they were. Downgrading keeps slice 0 of each rank (the rank's result, when sliced, sits on the
slice that joined the others, which may not be 0: such a comparison must be run again).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("comparison_tasks") as batch:
        batch.add_column(sa.Column("slice", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("slices", sa.Integer(), nullable=False, server_default="1"))
        batch.drop_constraint("pk_comparison_tasks", type_="primary")
        batch.create_primary_key("pk_comparison_tasks", ["comparison_id", "rank", "slice"])


def downgrade() -> None:
    op.execute("DELETE FROM comparison_tasks WHERE slice <> 0")
    with op.batch_alter_table("comparison_tasks") as batch:
        batch.drop_constraint("pk_comparison_tasks", type_="primary")
        batch.create_primary_key("pk_comparison_tasks", ["comparison_id", "rank"])
        batch.drop_column("slices")
        batch.drop_column("slice")
