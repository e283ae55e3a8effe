"""node reputation: nodes, their blamed faults and quarantine

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 00:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from api.database.tables import UtcDateTime

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "fleet_nodes",
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("state_since", UtcDateTime(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("quarantined_until", UtcDateTime(), nullable=True),
        sa.Column("forgiven_before", UtcDateTime(), nullable=True),
        sa.Column("quarantines", sa.Integer(), nullable=False),
        sa.Column("announced_job_id", sa.String(length=32), nullable=True),
        sa.Column("first_seen", UtcDateTime(), nullable=False),
        sa.Column("last_seen", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_index("ix_fleet_nodes_state", "fleet_nodes", ["state"], unique=False)
    op.create_table(
        "node_faults",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("key", sa.String(length=300), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("counted", sa.Boolean(), nullable=False),
        sa.Column("ts", UtcDateTime(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["node"], ["fleet_nodes.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node", "key", name="uq_node_faults_node_key"),
    )
    op.create_index("ix_node_faults_node_ts", "node_faults", ["node", "ts"], unique=False)
    op.create_index("ix_node_faults_job_id", "node_faults", ["job_id"], unique=False)
    op.create_table(
        "node_runs",
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("first_seen", UtcDateTime(), nullable=False),
        sa.Column("last_seen", UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["node"], ["fleet_nodes.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("node", "job_id", "attempt"),
    )
    op.create_index("ix_node_runs_node_last_seen", "node_runs", ["node", "last_seen"], unique=False)
    op.create_index("ix_node_runs_job_id", "node_runs", ["job_id"], unique=False)
    op.create_table(
        "node_history",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("ts", UtcDateTime(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("actor", sa.String(length=300), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["node"], ["fleet_nodes.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_node_history_node_id", "node_history", ["node", "id"], unique=False)
    op.create_table(
        "node_ledger_cursor",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("node_ledger_cursor")
    op.drop_index("ix_node_history_node_id", table_name="node_history")
    op.drop_table("node_history")
    op.drop_index("ix_node_runs_job_id", table_name="node_runs")
    op.drop_index("ix_node_runs_node_last_seen", table_name="node_runs")
    op.drop_table("node_runs")
    op.drop_index("ix_node_faults_job_id", table_name="node_faults")
    op.drop_index("ix_node_faults_node_ts", table_name="node_faults")
    op.drop_table("node_faults")
    op.drop_index("ix_fleet_nodes_state", table_name="fleet_nodes")
    op.drop_table("fleet_nodes")
