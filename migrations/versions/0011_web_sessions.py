"""Server-side web sessions, the shared server key, and the acceptances' free-text author.

``web_sessions`` holds one row per sign-in (keyed by the SHA-256 of the cookie's random id); the signed
cookies of before carried no session and stop working: people sign in once more. ``server_secrets`` keeps the
key that fingerprints tokens when ``PARITY_SESSION_SECRET`` is unset. ``api_acceptances.author`` is the free
text a request named; existing rows keep whatever ``accepted_by`` held.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("token_key", sa.String(64), nullable=False),
        sa.Column("can_write", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_web_sessions"),
    )
    op.create_index("ix_web_sessions_token_key", "web_sessions", ["token_key"])
    op.create_index("ix_web_sessions_expires_at", "web_sessions", ["expires_at"])
    op.create_table(
        "server_secrets",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_server_secrets"),
    )
    with op.batch_alter_table("api_acceptances") as batch:
        batch.add_column(sa.Column("author", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_acceptances") as batch:
        batch.drop_column("author")
    op.drop_table("server_secrets")
    op.drop_index("ix_web_sessions_expires_at", table_name="web_sessions")
    op.drop_index("ix_web_sessions_token_key", table_name="web_sessions")
    op.drop_table("web_sessions")
