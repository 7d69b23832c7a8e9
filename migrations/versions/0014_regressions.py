"""The level an acceptance accepted, and why a run was not compared with its baseline.

``api_acceptances.level`` is the API's error when it was accepted (the newest comparison of the project that
ran it): a later comparison whose error for it grows beyond ``WORSE_FACTOR`` times that level calls it
``worse`` instead of ``known``. ``runs.auto_compare_note`` says why completing the run queued no comparison
against its project's baseline (shown on the run's page); NULL when one was queued or none was due.

Revision ID: 0014
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_acceptances") as batch:
        batch.add_column(sa.Column("level", sa.Float(), nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("auto_compare_note", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("auto_compare_note")
    with op.batch_alter_table("api_acceptances") as batch:
        batch.drop_column("level")
