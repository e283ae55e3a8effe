"""Alembic is the only source of the schema: it matches the models and round-trips."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from api.core.db import alembic_config
from api.database.tables import Base


def test_models_and_migrations_agree(database_url: str) -> None:
    command.upgrade(alembic_config(database_url), "head")
    engine = create_engine(database_url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True, "render_as_batch": True})
        diff = compare_metadata(context, Base.metadata)
    engine.dispose()
    assert diff == [], f"models and migrations disagree; add a migration: {diff}"


def test_upgrade_downgrade_upgrade_round_trips(database_url: str) -> None:
    config = alembic_config(database_url)
    command.upgrade(config, "head")
    engine = create_engine(database_url)
    tables = set(inspect(engine).get_table_names())
    assert set(Base.metadata.tables) <= tables
    command.downgrade(config, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    command.upgrade(config, "head")
    assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
    engine.dispose()


def test_service_upgrades_to_head_at_start(env: str) -> None:
    from api.core.db import get_engine
    from api.main import create_app

    create_app()
    assert set(Base.metadata.tables) <= set(inspect(get_engine()).get_table_names())


def test_processes_starting_together_migrate_once(postgres_url: str) -> None:
    """API, worker and beat pods start at once on a fresh database: none of them fails."""
    import threading

    from api.core.config import Settings
    from api.core.db import upgrade_to_head

    errors: list[Exception] = []

    def start() -> None:
        try:
            upgrade_to_head(Settings(), url=postgres_url)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
