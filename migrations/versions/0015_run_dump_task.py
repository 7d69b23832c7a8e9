"""What a run's dump holds, recorded when it is validated.

``runs.dump_task`` is ``tensor``, ``statistics``, ``md5`` (statistics with checksums, msprobe's
``summary_mode: md5``), another task msprobe names, or ``mixed`` when its dump.json files disagree; NULL for
a run validated before this revision (or not yet). The comparison against the project's baseline is skipped
up front, with the reason on the run, when the two could not be compared (an ``md5`` run against a
``statistics`` baseline), instead of failing in a worker.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("dump_task", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("dump_task")
