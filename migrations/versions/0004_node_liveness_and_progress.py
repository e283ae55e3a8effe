"""node liveness, per-rank step time, a job's total steps, faults delivered by the node agent

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 11:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from api.database.tables import UtcDateTime

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_liveness",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("last_seen", UtcDateTime(), nullable=False),
        sa.Column("launcher_alive", sa.Boolean(), nullable=False),
        sa.Column("progress", sa.String(length=8), nullable=False),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("unhealthy_reason", sa.Text(), nullable=True),
        sa.Column("ranks", sa.JSON(), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "node"),
    )
    with op.batch_alter_table("rank_liveness", schema=None) as batch_op:
        batch_op.add_column(sa.Column("step_time_s", sa.Float(), nullable=True))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("total_steps", sa.BigInteger(), nullable=True))
    # Faults injected from outside the ranks are now carried out by the node agent, not the backend.
    op.execute("UPDATE pending_faults SET delivery = 'agent' WHERE delivery = 'backend'")


def downgrade() -> None:
    op.execute("UPDATE pending_faults SET delivery = 'backend' WHERE delivery = 'agent'")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("total_steps")
    with op.batch_alter_table("rank_liveness", schema=None) as batch_op:
        batch_op.drop_column("step_time_s")
    op.drop_table("node_liveness")
