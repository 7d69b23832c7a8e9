"""Validation of a run's dump.json files as a job on the workers: the ``validating`` run state and its claim.

``POST /runs/{id}/complete`` moves a run to ``validating`` and returns; a worker of the job backend claims
the validation under a lease (the rank tasks' protocol, on the run row): ``validation_attempt`` counts the
claims, ``validation_lease_expires_at`` says until when the claimant holds it (NULL: waiting for a worker),
``validation_worker`` who it is. The run ends ``complete`` or ``invalid`` (with ``error`` naming the file and
entry). Runs stored before this revision are ``uploading``, ``complete`` or ``invalid`` and need nothing.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("validation_attempt", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("validation_lease_expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("validation_worker", sa.String(255), nullable=True))


def downgrade() -> None:
    # A run left validating goes back to uploading: completing it again validates it again.
    op.execute("UPDATE runs SET status = 'uploading' WHERE status = 'validating'")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("validation_worker")
        batch.drop_column("validation_lease_expires_at")
        batch.drop_column("validation_attempt")
