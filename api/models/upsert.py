"""Dialect-aware INSERT ... ON CONFLICT, the building block of idempotent ingest."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sqlalchemy import JSON, ColumnElement, String, Table, TextClause, text
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


@dataclass(frozen=True)
class LivenessUpsert:
    """The upsert of one liveness table's rows, newest wins (`newest_wins`). On PostgreSQL the rows travel as one
    JSON array per column, zipped back into rows by the database (`ROWS FROM`) and taken in key order, as by every
    writer: one statement and one parse whatever their number, no bound parameter per value and no key name per
    row. On SQLite an executemany."""

    table: Table
    keys: tuple[str, ...]
    columns: tuple[str, ...]  # written over an older row's

    @classmethod
    def of(cls, model: type[Any], keys: tuple[str, ...], columns: tuple[str, ...]) -> LivenessUpsert:
        """Of a mapped class's table."""
        table = model.__table__
        assert isinstance(table, Table)
        return cls(table, keys, columns)

    @cached_property
    def on_postgresql(self) -> TextClause:
        names = (*self.keys, *self.columns)
        dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
        sources, values = [], []
        for name in names:
            column_type = self.table.c[name].type
            if isinstance(column_type, JSON):  # kept as sent
                sources.append(f"json_array_elements(CAST(:{name} AS json))")
                values.append(f"u.{name}")
            else:  # text as text: the column's length is checked on insert, never truncated by a cast
                sql_type = "text" if isinstance(column_type, String) else column_type.compile(dialect=dialect)
                sources.append(f"json_array_elements_text(CAST(:{name} AS json))")
                values.append(f"CAST(u.{name} AS {sql_type})")
        excluded = self.table.alias("excluded")
        rule: ColumnElement[bool] = newest_wins(self.table.c, excluded.c)
        newer = rule.compile(dialect=dialect, compile_kwargs={"literal_binds": True})
        return text(
            f"INSERT INTO {self.table.name} ({', '.join(names)})\n"
            f"SELECT {', '.join(values)}\n"
            f"FROM ROWS FROM ({', '.join(sources)}) AS u({', '.join(names)})\n"
            f"ORDER BY {', '.join(str(place) for place in range(1, len(self.keys) + 1))}\n"
            f"ON CONFLICT ({', '.join(self.keys)}) DO UPDATE SET "
            f"{', '.join(f'{name} = excluded.{name}' for name in self.columns)}\n"
            f"WHERE {newer}"
        )

    @cached_property
    def on_sqlite(self) -> Any:
        return upsert("sqlite", self.table, list(self.keys), self.columns, newest_wins)

    def write(self, session: Session, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        if session.get_bind().dialect.name != "postgresql":
            session.connection().execute(self.on_sqlite, rows)
            return
        params = {}
        for name in (*self.keys, *self.columns):
            values = [row[name] for row in rows]
            if name == "last_seen":
                values = [at.isoformat() for at in values]
            params[name] = json.dumps(values)
        session.execute(self.on_postgresql, params)
