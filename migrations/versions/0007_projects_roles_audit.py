"""projects, roles, role bindings and the audit log: existing tokens become cluster admins, existing jobs and
webhooks go to the project `default`

Revision ID: 0007
Revises: 0005
Create Date: 2026-12-14 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from api.database.tables import UtcDateTime

revision: str = "0007"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("gpu_limit", sa.Integer(), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.execute(
        sa.text("INSERT INTO projects (name, gpu_limit, created_at) VALUES ('default', NULL, CURRENT_TIMESTAMP)")
    )
    op.create_table(
        "role_bindings",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("project", sa.String(length=63), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("value", sa.String(length=256), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["project"], ["projects.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("project", "kind", "value", name="uq_role_bindings_project_kind_value"),
    )
    op.create_index("ix_role_bindings_project", "role_bindings", ["project"], unique=False)
    op.create_index("ix_role_bindings_value", "role_bindings", ["value"], unique=False)
    op.create_table(
        "audit_log",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("ts", UtcDateTime(), nullable=False),
        sa.Column("actor", sa.String(length=300), nullable=False),
        sa.Column("actor_kind", sa.String(length=16), nullable=False),
        sa.Column("actor_name", sa.String(length=300), nullable=False),
        sa.Column("issuer", sa.String(length=300), nullable=True),
        sa.Column("action", sa.String(length=120), nullable=False),
        sa.Column("object_type", sa.String(length=32), nullable=False),
        sa.Column("object_id", sa.String(length=253), nullable=True),
        sa.Column("project", sa.String(length=63), nullable=True),
        sa.Column("address", sa.String(length=64), nullable=True),
        sa.Column("outcome", sa.Integer(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_audit_log_ts", "audit_log", ["ts"], unique=False)
    op.create_index("ix_audit_log_project_id", "audit_log", ["project", "id"], unique=False)
    op.create_index("ix_audit_log_actor_id", "audit_log", ["actor", "id"], unique=False)
    # Every job and webhook so far belonged to the one team there was: the project `default`.
    for table in ("jobs", "webhook_subscriptions"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("project", sa.String(length=63), nullable=False, server_default="default"))
            batch_op.create_index(f"ix_{table}_project", ["project"], unique=False)
            batch_op.create_foreign_key(f"fk_{table}_project", "projects", ["project"], ["name"])
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("admitted_at", UtcDateTime(), nullable=True))
    # Every token so far could do everything: admin tokens become cluster admins (trainer tokens stay as they are).
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("project", sa.String(length=63), nullable=True))
        batch_op.create_index("ix_api_tokens_project", ["project"], unique=False)
        batch_op.create_foreign_key("fk_api_tokens_project", "projects", ["project"], ["name"])
    op.execute(sa.text("UPDATE api_tokens SET role = 'cluster-admin' WHERE role = 'admin'"))


def downgrade() -> None:
    # Before projects a token could do everything: a token of one project must not become an admin of all.
    op.execute(sa.text("DELETE FROM api_tokens WHERE project IS NOT NULL"))
    op.execute(sa.text("UPDATE api_tokens SET role = 'admin' WHERE role = 'cluster-admin'"))
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_constraint("fk_api_tokens_project", type_="foreignkey")
        batch_op.drop_index("ix_api_tokens_project")
        batch_op.drop_column("project")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("admitted_at")
    for table in ("webhook_subscriptions", "jobs"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_constraint(f"fk_{table}_project", type_="foreignkey")
            batch_op.drop_index(f"ix_{table}_project")
            batch_op.drop_column("project")
    op.drop_index("ix_audit_log_actor_id", table_name="audit_log")
    op.drop_index("ix_audit_log_project_id", table_name="audit_log")
    op.drop_index("ix_audit_log_ts", table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_index("ix_role_bindings_value", table_name="role_bindings")
    op.drop_index("ix_role_bindings_project", table_name="role_bindings")
    op.drop_table("role_bindings")
    op.drop_table("projects")
