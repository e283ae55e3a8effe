"""Shared fixtures: a fresh database per test (SQLite, and PostgreSQL when configured), the app, tokens,
a fake webhook receiver.

PostgreSQL and Redis tests run when FTPLANE_TEST_DATABASE_URL / FTPLANE_TEST_REDIS_URL are set;
under CI=true their absence is an error, never a skip. Under pytest-xdist each worker uses its own Redis
database (the configured one plus the worker's number), so brokers, Celery workers and rate limits of
tests running side by side never see each other's tasks or keys.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.support.ports import free_port, worker_index
from tests.support.receivers import Receiver
from tests.support.scheduling import deal


def this_workers_redis(url: str | None) -> str | None:
    """`url` with its database number moved up by this xdist worker's number (redis://h:p/4 -> /6 on gw2)."""
    if not url:
        return url
    parsed = make_url(url)
    database = int(parsed.database or 0) + worker_index()
    return parsed.set(database=str(database)).render_as_string(hide_password=False)


IN_CI = os.environ.get("CI", "").lower() == "true"
PG_URL = os.environ.get("FTPLANE_TEST_DATABASE_URL")
REDIS_URL = this_workers_redis(os.environ.get("FTPLANE_TEST_REDIS_URL"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests spread over the workers' starting shares (tests/support/scheduling.py)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    items[:] = deal(
        items,
        workers,
        lambda item: item.get_closest_marker("slow") is not None,
        lambda item: item.nodeid.split("::")[0],
    )


def require(value: str | None, what: str) -> str:
    if value:
        return value
    if IN_CI:
        pytest.fail(f"{what} is not set: CI must run these tests")
    pytest.skip(f"{what} not set")


@contextmanager
def postgres_database(template: str | None = None) -> Iterator[str]:
    """A fresh PostgreSQL database, empty or a copy of `template`'s, dropped afterwards."""
    base = make_url(require(PG_URL, "FTPLANE_TEST_DATABASE_URL"))
    name = f"ftplane_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")))
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """An empty PostgreSQL database."""
    with postgres_database() as url:
        yield url


# Each test's database starts as a copy of one migrated at the start of its test process: migrating anew for
# every test was a tenth of the suite's CPU (tests/api/test_migrations.py migrates empty ones).


@pytest.fixture(scope="session")
def migrated_postgres() -> Iterator[str]:
    """The name of this test process's migrated PostgreSQL database (a template: nothing connects to it)."""
    from api.core.config import Settings
    from api.core.db import upgrade_to_head

    with postgres_database() as url:
        upgrade_to_head(Settings(), url=url)  # not get_settings(): nothing of the test's environment is cached
        yield str(make_url(url).database)


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from api.core.config import Settings
    from api.core.db import upgrade_to_head

    path = tmp_path_factory.mktemp("migrated") / "ftplane.db"
    upgrade_to_head(Settings(), url=f"sqlite:///{path}")
    return path


def copy_sqlite(source: Path, target: Path) -> None:
    """SQLite's own online backup: the copy holds what is committed, in the WAL or not."""
    with contextlib.closing(sqlite3.connect(source)) as src, contextlib.closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database at the newest migration, on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        path = tmp_path / "ftplane.db"
        copy_sqlite(request.getfixturevalue("migrated_sqlite"), path)
        yield f"sqlite:///{path}"
        return
    with postgres_database(template=request.getfixturevalue("migrated_postgres")) as url:
        yield url


def configure_env(monkeypatch: pytest.MonkeyPatch, data_dir: Path, database_url: str, **extra: str) -> None:
    """Point every settings-driven part (DB, broker, runs dir) at this test's own state."""
    from api.core.config import get_settings
    from api.core.db import reset_caches
    from workers.celery_app import celery_app, configure

    monkeypatch.setenv("FTPLANE_DATA_DIR", str(data_dir))
    monkeypatch.setenv("FTPLANE_DATABASE_URL", database_url)
    monkeypatch.delenv("FTPLANE_REDIS_URL", raising=False)
    monkeypatch.delenv("FTPLANE_AUTH", raising=False)
    for key, value in extra.items():
        monkeypatch.setenv(key, value)
    reset_caches()
    configure(celery_app, get_settings())
    from workers.backends import get_backend

    get_backend.cache_clear()


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, database_url: str) -> Iterator[str]:
    configure_env(monkeypatch, tmp_path / "state", database_url)
    yield database_url
    from api.core.db import reset_caches
    from api.services.ingest import liveness_writer

    liveness_writer.reset()  # what this test's reports left pending goes to its own database, before it is dropped
    reset_caches()


@pytest.fixture
def app(env: str) -> Any:
    from api.main import create_app

    return create_app()


@pytest.fixture
def client(app: Any) -> Iterator[TestClient]:
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def admin_token(app: Any) -> str:
    from api.core.db import session_scope
    from api.models import tokens

    with session_scope() as session:
        _, token = tokens.create_admin(session, "tests")
    return token


@pytest.fixture
def admin(client: TestClient, admin_token: str) -> TestClient:
    client.headers["Authorization"] = f"Bearer {admin_token}"
    return client


def tiny_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "tiny",
        "backend": "local",
        "command": ["python", "-c", "pass"],
        "procs_per_node": 2,
        "labels": {"team": "research"},
    }
    spec.update(overrides)
    return spec


@pytest.fixture
def make_job(admin: TestClient) -> Callable[..., dict[str, Any]]:
    def make(**overrides: Any) -> dict[str, Any]:
        response = admin.post("/v1/jobs", json=tiny_spec(**overrides))
        assert response.status_code == 201, response.text
        return dict(response.json())

    return make


def row_counts() -> dict[str, int]:
    """Rows per table, but the audit log's (it records refused requests too: tests/api/test_audit.py). Node
    liveness an earlier report left pending in this process is written first, so it counts as that report's."""
    from api.core.db import get_engine
    from api.database.tables import Base
    from api.services.ingest import liveness_writer

    liveness_writer.flush()
    with get_engine().connect() as connection:
        return {
            name: int(connection.execute(text(f"SELECT COUNT(*) FROM {name}")).scalar_one())
            for name in Base.metadata.tables
            if name != "audit_log"
        }


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A fake webhook receiver on 127.0.0.1 (subscriptions to it need FTPLANE_WEBHOOK_ALLOW_PRIVATE)."""
    with Receiver() as running:
        yield running


@contextmanager
def ftplane_server(workdir: Path, **extra_env: str) -> Iterator[dict[str, str]]:
    """A real `ftplane serve` in `workdir`; yields its environment (FTPLANE_URL, FTPLANE_TOKEN, WORKDIR)."""
    from ftplane.devserver import ftplane_server as serve

    with serve(workdir, port=free_port(), **extra_env) as server:
        yield {**server.env, "WORKDIR": str(workdir)}
