"""Dialect-aware INSERT ... ON CONFLICT, the building block of idempotent ingest."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import TextClause
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session


def insert_for(session: Session, table: Any) -> Any:
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"unsupported database dialect {dialect!r}: use PostgreSQL or SQLite")


def max_rows_per_statement(session: Session, columns: int) -> int:
    """Rows per multi-VALUES statement that stay under the driver's bound-parameter limit."""
    limit = 65_000 if session.get_bind().dialect.name == "postgresql" else 32_000
    return max(1, limit // max(1, columns))


def upsert(dialect: str, table: Any, keys: list[str], columns: tuple[str, ...], newer: Any) -> Any:
    """One INSERT ... ON CONFLICT DO UPDATE for a whole list of rows (executemany: compiled once, then cached)."""
    stmt = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)
    return stmt.on_conflict_do_update(
        index_elements=keys, set_={c: stmt.excluded[c] for c in columns}, where=newer(table.c, stmt.excluded)
    )


def newest_wins(old: Any, new: Any) -> Any:
    """The liveness rows' rule: a newer attempt wins, then within one attempt the later `last_seen`."""
    return (old.attempt < new.attempt) | ((old.attempt == new.attempt) & (old.last_seen <= new.last_seen))


def write_liveness(session: Session, rows: list[dict[str, Any]], on_postgresql: TextClause, on_sqlite: Any) -> None:
    """Upsert liveness rows. PostgreSQL: one statement whose rows travel as one JSON array (`:rows`, `last_seen` in
    ISO 8601): one parse, no bound parameter per value, whatever their number. SQLite: an executemany."""
    if not rows:
        return
    if session.get_bind().dialect.name == "postgresql":
        payload = [{**row, "last_seen": row["last_seen"].isoformat()} for row in rows]
        session.execute(on_postgresql, {"rows": json.dumps(payload)})
    else:
        session.connection().execute(on_sqlite, rows)
