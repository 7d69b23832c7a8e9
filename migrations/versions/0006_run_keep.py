"""Runs marked to keep (``runs.keep``): the retention sweep (``PARITY_RETENTION_DAYS``) never deletes them.

Existing runs are not marked (``false``): retention is off by default, and an operator who turns it on
marks the runs to keep first.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN on both backends: a batch rebuild of ``runs`` on SQLite would drop the table, and
    # with foreign keys on, the drop cascades to every run's files and comparisons.
    op.add_column("runs", sa.Column("keep", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("keep")
