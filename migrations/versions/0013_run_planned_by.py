"""Run provenance (``runs.planned_by``): the comparison whose plan a run's dump followed (``parity plan``).

A plain string, not a foreign key: a run keeps saying which comparison planned it after that comparison is
deleted (the pages then say so). Indexed, so a comparison's page finds the runs it planned.

Revision ID: 0013
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN on both backends (a batch rebuild of ``runs`` on SQLite would cascade its drop).
    op.add_column("runs", sa.Column("planned_by", sa.String(64), nullable=True))
    op.create_index("ix_runs_planned_by", "runs", ["planned_by"])


def downgrade() -> None:
    op.drop_index("ix_runs_planned_by", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("planned_by")
