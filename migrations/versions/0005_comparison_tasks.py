"""One task per rank of a comparison (``comparison_tasks``).

A comparison fans out into one task per rank pair, each claimed, leased, retried and stored on its own;
the comparison row keeps the aggregate status and the merged summary. Comparisons queued or running at
upgrade time get their tasks here (one per rank of their step in both runs, as creating them now does) and
go back to ``queued``, so they run again under the new workers; nothing is lost.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "comparison_tasks",
        sa.Column("comparison_id", sa.String(32), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("rows", sa.Integer(), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=True),
        sa.Column("header", sa.JSON(), nullable=True),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["comparison_id"], ["comparisons.id"],
            name="fk_comparison_tasks_comparison_id_comparisons", ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("comparison_id", "rank", name="pk_comparison_tasks"),
    )  # fmt: skip
    op.create_index("ix_comparison_tasks_status", "comparison_tasks", ["status"])
    _fan_out_unfinished()


def _fan_out_unfinished() -> None:
    conn = op.get_bind()
    pending = conn.execute(sa.text(
        "SELECT id, target_run_id, bench_run_id, step, ranks, created_at FROM comparisons "
        "WHERE status IN ('queued', 'running')"
    )).all()  # fmt: skip
    ranks_of = sa.text("SELECT DISTINCT rank FROM run_files WHERE run_id = :run AND step = :step "
                       "AND rank IS NOT NULL")  # fmt: skip
    for cid, target, bench, step, wanted, created in pending:
        step = step if step is not None else 0
        ranks = {r for (r,) in conn.execute(ranks_of, {"run": target, "step": step})}
        ranks &= {r for (r,) in conn.execute(ranks_of, {"run": bench, "step": step})}
        if isinstance(wanted, str):  # JSON comes back as text on SQLite
            import json

            wanted = json.loads(wanted)
        if wanted is not None:
            ranks &= set(wanted)
        for rank in sorted(ranks):
            conn.execute(sa.text(
                "INSERT INTO comparison_tasks (comparison_id, rank, status, attempt, progress, queued_at) "
                "VALUES (:cid, :rank, 'queued', 0, 0, :at)"
            ), {"cid": cid, "rank": rank, "at": created})  # fmt: skip
        status = "queued" if ranks else "failed"
        conn.execute(
            sa.text("UPDATE comparisons SET status = :status, lease_expires_at = NULL, error = :error "
                    "WHERE id = :cid"),
            {"cid": cid, "status": status, "error": None if ranks else f"step {step}: no rank in both runs"},
        )  # fmt: skip


def downgrade() -> None:
    op.drop_index("ix_comparison_tasks_status", table_name="comparison_tasks")
    op.drop_table("comparison_tasks")
