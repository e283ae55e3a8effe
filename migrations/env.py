"""Alembic environment: the only way ftplane's schema changes."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from api.core.db import make_engine
from api.database.tables import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is not None:
        _run(connectable)
        return
    url = config.get_main_option("sqlalchemy.url")
    assert url
    engine = make_engine(url)
    with engine.connect() as connection:
        _run(connection)
    engine.dispose()


def _run(connection: Connection) -> None:
    # On SQLite a batch migration that must rebuild a table (a new foreign key, say) copies it and drops the old
    # one: with foreign keys enforced, that drop would cascade and delete every row that references the table
    # (a job's attempts, events and tokens). Enforcement is off while migrating (it can only change outside a
    # transaction), and on again after.
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        connection.commit()
    try:
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True, compare_type=True
        )
        with context.begin_transaction():
            context.run_migrations()
    finally:
        if sqlite:
            connection.exec_driver_sql("PRAGMA foreign_keys=ON")
            connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
