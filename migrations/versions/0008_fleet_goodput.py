"""fleet goodput: per-job summaries (segments by hour, hourly and daily sums, faults), the summarizer's mark,
goodput counters, ETTR objectives and their breaches; webhook deliveries of no job's event (an objective's breach)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06 00:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from api.database.tables import UtcDateTime

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
# goodput_hours and goodput_days have a column per goodput bucket (as of this revision; a new bucket is a new
# revision's column)
BUCKETS = (
    "productive",
    "initialization",
    "queued",
    "checkpoint_stall",
    "fault_detection",
    "restart",
    "recompute",
    "straggler",
    "shutdown",
)


def _job_fk() -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE")


def upgrade() -> None:
    op.create_table(
        "goodput_summaries",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("last_event_id", sa.BigInteger(), nullable=False),
        sa.Column("computed_at", UtcDateTime(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("start_s", sa.Float(), nullable=True),
        sa.Column("end_s", sa.Float(), nullable=True),
        sa.Column("open_attempt", sa.Integer(), nullable=True),
        sa.Column("open_bucket", sa.String(length=20), nullable=True),
        sa.Column("open_start_s", sa.Float(), nullable=True),
        sa.Column("counted", sa.JSON(), nullable=False),
        _job_fk(),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_index("ix_goodput_summaries_open_bucket", "goodput_summaries", ["open_bucket"], unique=False)
    op.create_table(
        "goodput_segments",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.String(length=20), nullable=False),
        sa.Column("hour_s", sa.Float(), nullable=False),
        sa.Column("start_s", sa.Float(), nullable=False),
        sa.Column("end_s", sa.Float(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        _job_fk(),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_goodput_segments_hour_s", "goodput_segments", ["hour_s"], unique=False)
    op.create_index("ix_goodput_segments_job_id", "goodput_segments", ["job_id"], unique=False)
    op.create_table(
        "goodput_hours",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("hour_s", sa.Float(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        *(sa.Column(bucket, sa.Float(), nullable=False) for bucket in BUCKETS),
        _job_fk(),
        sa.PrimaryKeyConstraint("job_id", "hour_s"),
    )
    op.create_index("ix_goodput_hours_hour_s", "goodput_hours", ["hour_s"], unique=False)
    op.create_table(
        "goodput_days",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("day_s", sa.Float(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        *(sa.Column(bucket, sa.Float(), nullable=False) for bucket in BUCKETS),
        _job_fk(),
        sa.PrimaryKeyConstraint("job_id", "day_s"),
    )
    op.create_index("ix_goodput_days_day_s", "goodput_days", ["day_s"], unique=False)
    op.create_table(
        "goodput_faults",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("ts_s", sa.Float(), nullable=False),
        sa.Column("cause", sa.String(length=16), nullable=False),
        _job_fk(),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_goodput_faults_ts_s", "goodput_faults", ["ts_s"], unique=False)
    op.create_index("ix_goodput_faults_job_id", "goodput_faults", ["job_id"], unique=False)
    op.create_table(
        "goodput_marks",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("settled_id", sa.BigInteger(), nullable=False),
        sa.Column("seen_id", sa.BigInteger(), nullable=False),
        sa.Column("seen_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "goodput_counters",
        sa.Column("label_key", sa.String(length=253), nullable=False),
        sa.Column("label_value", sa.String(length=63), nullable=False),
        sa.Column("bucket", sa.String(length=20), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("label_key", "label_value", "bucket"),
    )
    op.create_table(
        "objectives",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("project", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("selector", sa.JSON(), nullable=False),
        sa.Column("target", sa.Float(), nullable=False),
        sa.Column("window", sa.String(length=16), nullable=False),
        sa.Column("burn_rate", sa.Float(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("breached_since", UtcDateTime(), nullable=True),
        sa.Column("evaluated_at", UtcDateTime(), nullable=True),
        sa.Column("last", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["project"], ["projects.name"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_objectives_project", "objectives", ["project"], unique=False)
    op.create_table(
        "objective_breaches",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("objective_id", sa.String(length=32), nullable=False),
        sa.Column("started_at", UtcDateTime(), nullable=False),
        sa.Column("recovered_at", UtcDateTime(), nullable=True),
        sa.Column("reason", sa.String(length=16), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["objective_id"], ["objectives.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_objective_breaches_objective_id", "objective_breaches", ["objective_id"], unique=False)
    # An objective's breach is announced through the same outbox as jobs' events, with no event or job of its own.
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.alter_column("event_id", existing_type=BigId, nullable=True)
        batch_op.alter_column("job_id", existing_type=sa.String(length=32), nullable=True)


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM webhook_deliveries WHERE event_id IS NULL OR job_id IS NULL"))
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.alter_column("job_id", existing_type=sa.String(length=32), nullable=False)
        batch_op.alter_column("event_id", existing_type=BigId, nullable=False)
    for index, table in (
        ("ix_objective_breaches_objective_id", "objective_breaches"),
        ("ix_objectives_project", "objectives"),
        ("ix_goodput_faults_job_id", "goodput_faults"),
        ("ix_goodput_faults_ts_s", "goodput_faults"),
        ("ix_goodput_days_day_s", "goodput_days"),
        ("ix_goodput_hours_hour_s", "goodput_hours"),
        ("ix_goodput_segments_job_id", "goodput_segments"),
        ("ix_goodput_segments_hour_s", "goodput_segments"),
        ("ix_goodput_summaries_open_bucket", "goodput_summaries"),
    ):
        op.drop_index(index, table_name=table)
    for table in (
        "objective_breaches",
        "objectives",
        "goodput_counters",
        "goodput_marks",
        "goodput_faults",
        "goodput_days",
        "goodput_hours",
        "goodput_segments",
        "goodput_summaries",
    ):
        op.drop_table(table)
