"""A lease on running comparisons (``comparisons.lease_expires_at``).

A worker that claims a job records until when it holds it and renews that while it works; a job still
``running`` after its lease has passed lost its worker (a Celery worker killed mid-job) and may be claimed
again. Jobs already ``running`` at upgrade time get no lease (NULL), which counts as expired: they were
claimed by a worker that knew nothing of leases, so nothing would ever renew them.

Revision ID: 0004
Revises: 0003
Create Date: 2025-01-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("comparisons") as batch:
        batch.add_column(sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("comparisons") as batch:
        batch.drop_column("lease_expires_at")
