"""Engine, sessions, and upgrading the schema to the newest migration."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import Session, sessionmaker

from api.core.config import Settings, get_settings

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
CONNECT_TIMEOUT_S = 5


def make_engine(url: str, *, pool_size: int = 10) -> Engine:
    # hide_parameters: bound values (webhook secrets among them) never reach logs or error messages.
    kwargs: dict[str, Any] = {"pool_pre_ping": True, "hide_parameters": True}
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
    else:
        kwargs.update(pool_size=pool_size, max_overflow=pool_size * 2, pool_timeout=10)
        # A database that takes connections but never answers would hold each request for the
        # driver's default (over two minutes); fail it fast instead (503, and the client retries).
        kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    engine = create_engine(url, **kwargs)
    if url.startswith("sqlite"):
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


@lru_cache
def get_engine() -> Engine:
    settings = get_settings()
    return make_engine(settings.resolved_database_url, pool_size=settings.db_pool_size)


@lru_cache
def get_sessionmaker() -> sessionmaker[Session]:
    return sessionmaker(get_engine(), expire_on_commit=False)


@contextmanager
def session_scope() -> Iterator[Session]:
    """A session committed on success and rolled back on error (for workers and the CLI)."""
    session = get_sessionmaker()()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


# Any fixed number: every process that starts migrates under this PostgreSQL advisory lock.
MIGRATION_LOCK_ID = 4_711_2026


def upgrade_to_head(settings: Settings | None = None, url: str | None = None) -> None:
    """Bring the schema to the newest migration. Safe when several processes start at once."""
    from alembic import command

    settings = settings or get_settings()
    target = url or settings.resolved_database_url
    config = alembic_config(target)
    engine = make_engine(target)  # for SQLite this also creates the parent directory
    try:
        if engine.dialect.name != "postgresql":
            command.upgrade(config, "head")
            return
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:id)"), {"id": MIGRATION_LOCK_ID})
            try:
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
                connection.commit()
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": MIGRATION_LOCK_ID})
                connection.commit()
    finally:
        engine.dispose()


def reset_caches() -> None:
    """Forget engines and settings (tests switch databases between cases)."""
    if get_engine.cache_info().currsize:
        get_engine().dispose()
    get_engine.cache_clear()
    get_sessionmaker.cache_clear()
    get_settings.cache_clear()
    from api.core import oidc

    oidc.verifier.cache_clear()
