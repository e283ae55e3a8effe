"""Alembic is the only source of the schema: it matches the models and round-trips."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, inspect

from api.core.db import alembic_config
from api.database.tables import Base


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database (the suite's other tests start from a migrated one)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ftplane.db'}"
    return str(request.getfixturevalue("postgres_url"))


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


def test_0007_moves_existing_data_into_default_and_makes_admin_tokens_cluster_admins(
    database_url: str, monkeypatch: Any, tmp_path: Any
) -> None:
    """Forward on a database holding data (jobs, a trainer and an admin token, a webhook), then served: the
    admin token is a cluster admin and sees the job in `default`; back down, project tokens are gone."""
    import datetime as dt

    from sqlalchemy import MetaData, Table, select

    from api.core.security import digest
    from tests.conftest import configure_env

    config = alembic_config(database_url)
    command.upgrade(config, "0005")
    engine = create_engine(database_url)
    meta = MetaData()
    jobs, tokens, hooks = (
        Table(name, meta, autoload_with=engine) for name in ("jobs", "api_tokens", "webhook_subscriptions")
    )
    now = dt.datetime.now(dt.UTC)
    spec = {"name": "old", "command": ["python", "-c", "pass"]}
    with engine.begin() as connection:
        for job_id, status in (("j-running", "RUNNING"), ("j-done", "SUCCEEDED")):
            connection.execute(
                jobs.insert().values(
                    id=job_id,
                    name="old",
                    backend="local",
                    status=status,
                    spec=spec,
                    labels={},
                    attempt=0,
                    job_restarts=0,
                    cancel_requested=False,
                    excluded_nodes=[],
                    failure_steps=[],
                    created_at=now,
                    updated_at=now,
                )
            )
        connection.execute(
            tokens.insert().values(id="t-admin", name="ops", digest=digest("old-admin"), role="admin", created_at=now)
        )
        connection.execute(
            tokens.insert().values(
                id="t-trainer",
                name="trainer",
                digest=digest("old-trainer"),
                role="trainer",
                job_id="j-running",
                created_at=now,
            )
        )
        connection.execute(
            hooks.insert().values(
                id="h1",
                url="https://example.com/h",
                event_types=["failed"],
                label_selector={},
                format="standard",
                secret="whsec_x",
                active=True,
                created_at=now,
            )
        )
    command.upgrade(config, "0007")
    meta = MetaData()
    jobs, tokens, hooks, projects = (
        Table(name, meta, autoload_with=engine) for name in ("jobs", "api_tokens", "webhook_subscriptions", "projects")
    )
    with engine.connect() as connection:
        assert set(connection.execute(select(jobs.c.id, jobs.c.project))) == {
            ("j-running", "default"),
            ("j-done", "default"),
        }
        assert list(connection.execute(select(hooks.c.project))) == [("default",)]
        assert dict(connection.execute(select(tokens.c.id, tokens.c.role)).tuples().all()) == {
            "t-admin": "cluster-admin",
            "t-trainer": "trainer",
        }
        assert [row.name for row in connection.execute(select(projects))] == ["default"]
    engine.dispose()

    configure_env(monkeypatch, tmp_path / "state", database_url)
    from api.core.db import reset_caches
    from api.main import create_app

    app = create_app()
    admin = TestClient(app, headers={"Authorization": "Bearer old-admin"})
    assert {j["id"] for j in admin.get("/v1/jobs").json()["items"]} == {"j-running", "j-done"}
    made = admin.post("/v1/tokens", json={"name": "team", "project": "default", "role": "operator"})
    assert made.status_code == 201, made.text
    trainer = TestClient(app, headers={"Authorization": "Bearer old-trainer"})
    assert (
        trainer.post("/v1/jobs/j-running/heartbeats", json={"heartbeats": [{"rank": 0, "step": 1}]}).status_code == 200
    )
    assert trainer.get("/v1/jobs").status_code == 403
    reset_caches()

    command.downgrade(config, "0005")
    engine = create_engine(database_url)
    tokens = Table("api_tokens", MetaData(), autoload_with=engine)
    with engine.connect() as connection:  # a project's token must not become an admin of everything
        assert dict(connection.execute(select(tokens.c.id, tokens.c.role)).tuples().all()) == {
            "t-admin": "admin",
            "t-trainer": "trainer",
        }
    engine.dispose()
