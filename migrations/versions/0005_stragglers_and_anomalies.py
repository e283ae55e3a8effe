"""stragglers and restart anomalies: per-rank own work and NVRx score, slowdown faults, the watching duties' state

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-10 11:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from api.database.tables import UtcDateTime

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("rank_liveness", schema=None) as batch_op:
        batch_op.add_column(sa.Column("compute_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("perf_score", sa.Float(), nullable=True))
    with op.batch_alter_table("pending_faults", schema=None) as batch_op:
        batch_op.add_column(sa.Column("fraction", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("duration_steps", sa.BigInteger(), nullable=True))
    op.create_table(
        "job_watch",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("stragglers", sa.JSON(), nullable=False),
        sa.Column("open_stragglers", sa.Integer(), nullable=False),
        sa.Column("anomalies", sa.JSON(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_index("ix_job_watch_open_stragglers", "job_watch", ["open_stragglers"], unique=False)
    op.create_table(
        "straggler_samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("ts", UtcDateTime(), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("pace_s", sa.Float(), nullable=False),
        sa.Column("reference_s", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_straggler_samples_job_ts", "straggler_samples", ["job_id", "ts"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_straggler_samples_job_ts", table_name="straggler_samples")
    op.drop_table("straggler_samples")
    op.drop_index("ix_job_watch_open_stragglers", table_name="job_watch")
    op.drop_table("job_watch")
    with op.batch_alter_table("pending_faults", schema=None) as batch_op:
        batch_op.drop_column("duration_steps")
        batch_op.drop_column("fraction")
    with op.batch_alter_table("rank_liveness", schema=None) as batch_op:
        batch_op.drop_column("perf_score")
        batch_op.drop_column("compute_s")
