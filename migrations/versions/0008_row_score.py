"""A localization score on each comparison row (``comparison_rows.score``), for ``GET .../rows?sort=score``.

The score of the API call a row belongs to: how many decades its output error stands above what its inputs
and the run pair's background explain (``parity.shared.compare.localization``). NULL where the call was not
judged or agrees exactly; rows stored before this revision have none.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("comparison_rows") as batch:
        batch.add_column(sa.Column("score", sa.Float(), nullable=True))
        batch.create_index("ix_comparison_rows_score", ["comparison_id", "score"])


def downgrade() -> None:
    with op.batch_alter_table("comparison_rows") as batch:
        batch.drop_index("ix_comparison_rows_score")
        batch.drop_column("score")
