"""Dialect-aware INSERT ... ON CONFLICT, the building block of idempotent ingest."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sqlalchemy import JSON, ColumnElement, DateTime, String, Table, TextClause, text
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
class ColumnarUpsert:
    """The upsert of one table's rows, the held row's `columns` written over where `newer(held, sent)` holds. On
    PostgreSQL the rows travel as one JSON array per column, zipped back into rows by the database (`ROWS FROM`)
    and taken in key order, as by every writer: one statement and one parse whatever their number, no bound
    parameter per value and no key name per row. On SQLite an executemany."""

    table: Table
    keys: tuple[str, ...]
    columns: tuple[str, ...]  # written over a held row's where `newer`
    newer: Callable[[Any, Any], ColumnElement[bool]]
    inserted_only: tuple[str, ...] = ()  # a new row's, never written over

    @classmethod
    def of(
        cls,
        model: type[Any],
        keys: tuple[str, ...],
        columns: tuple[str, ...],
        newer: Callable[[Any, Any], ColumnElement[bool]],
        inserted_only: tuple[str, ...] = (),
    ) -> ColumnarUpsert:
        """Of a mapped class's table."""
        table = model.__table__
        assert isinstance(table, Table)
        return cls(table, keys, columns, newer, inserted_only)

    @property
    def names(self) -> tuple[str, ...]:
        return (*self.keys, *self.columns, *self.inserted_only)

    @cached_property
    def _instants(self) -> frozenset[str]:
        """The columns sent as ISO 8601 text (JSON has no datetime)."""
        types = {name: self.table.c[name].type for name in self.names}
        return frozenset(name for name, type_ in types.items() if isinstance(getattr(type_, "impl", type_), DateTime))

    @cached_property
    def on_postgresql(self) -> TextClause:
        dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
        sources, values = [], []
        for name in self.names:
            column_type = self.table.c[name].type
            if isinstance(column_type, JSON):  # kept as sent
                sources.append(f"json_array_elements(CAST(:{name} AS json))")
                values.append(f"u.{name}")
            else:  # text as text: the column's length is checked on insert, never truncated by a cast
                sql_type = "text" if isinstance(column_type, String) else column_type.compile(dialect=dialect)
                sources.append(f"json_array_elements_text(CAST(:{name} AS json))")
                values.append(f"CAST(u.{name} AS {sql_type})")
        excluded = self.table.alias("excluded")
        rule = self.newer(self.table.c, excluded.c)
        newer = rule.compile(dialect=dialect, compile_kwargs={"literal_binds": True})
        return text(
            f"INSERT INTO {self.table.name} ({', '.join(self.names)})\n"
            f"SELECT {', '.join(values)}\n"
            f"FROM ROWS FROM ({', '.join(sources)}) AS u({', '.join(self.names)})\n"
            f"ORDER BY {', '.join(str(place) for place in range(1, len(self.keys) + 1))}\n"
            f"ON CONFLICT ({', '.join(self.keys)}) DO UPDATE SET "
            f"{', '.join(f'{name} = excluded.{name}' for name in self.columns)}\n"
            f"WHERE {newer}"
        )

    @cached_property
    def on_sqlite(self) -> Any:
        return upsert("sqlite", self.table, list(self.keys), self.columns, self.newer)

    def write(self, session: Session, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        if session.get_bind().dialect.name != "postgresql":
            session.connection().execute(self.on_sqlite, rows)
            return
        params = {}
        for name in self.names:
            values = [row[name] for row in rows]
            if name in self._instants:
                values = [at.isoformat() if at is not None else None for at in values]
            params[name] = json.dumps(values)
        session.execute(self.on_postgresql, params)
