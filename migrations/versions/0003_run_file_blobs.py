"""Each run file records the store key of its bytes (``run_files.blob``).

Uploads are published under a key of their own (``runs/{run}/blobs/{upload id}``) and the row that wins
the (run, path) primary key names it, so two racing uploads of one path can no longer leave bytes that
disagree with the recorded sha256. Rows stored before this revision keep their old key,
``runs/{run}/{path}``, which the backfill writes out.

Revision ID: 0003
Revises: 0002
Create Date: 2025-01-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("run_files") as batch:
        batch.add_column(sa.Column("blob", sa.Text(), nullable=True))
    op.execute("UPDATE run_files SET blob = 'runs/' || run_id || '/' || path WHERE blob IS NULL")
    with op.batch_alter_table("run_files") as batch:
        batch.alter_column("blob", existing_type=sa.Text(), nullable=False)


def downgrade() -> None:
    # Files uploaded after 0003 live under blobs/ keys that 0002 cannot name: a downgrade forgets them.
    with op.batch_alter_table("run_files") as batch:
        batch.drop_column("blob")
