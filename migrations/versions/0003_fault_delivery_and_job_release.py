"""fault delivery column and job release time

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pending_faults", schema=None) as batch_op:
        batch_op.add_column(sa.Column("delivery", sa.String(length=16), nullable=True))
    # Until now the delivery was implied: no step and not an exception meant the backend injects it.
    op.execute(
        "UPDATE pending_faults SET delivery = CASE WHEN at_step IS NULL AND kind <> 'exception' "
        "THEN 'backend' ELSE 'trainer' END"
    )
    with op.batch_alter_table("pending_faults", schema=None) as batch_op:
        batch_op.alter_column("delivery", existing_type=sa.String(length=16), nullable=False)

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("released_at", sa.DateTime(timezone=True), nullable=True))
    # Jobs that ended before this release step existed were released as they ended.
    op.execute("UPDATE jobs SET released_at = finished_at WHERE finished_at IS NOT NULL")


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("released_at")
    with op.batch_alter_table("pending_faults", schema=None) as batch_op:
        batch_op.drop_column("delivery")
