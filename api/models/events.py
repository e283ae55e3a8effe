"""Event store: append-only, idempotent by (job, sender-supplied key)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from api.database.tables import Event, Job
from api.models.upsert import insert_for, max_rows_per_statement
from api.schemas.events import EventIn, utcnow


def _row(job: Job, event: EventIn, received_at: datetime) -> dict[str, object]:
    return {
        "job_id": job.id,
        "attempt": job.attempt if event.attempt is None else event.attempt,
        "type": event.type.value,
        "ts": event.ts or received_at,
        "received_at": received_at,
        "rank": event.rank,
        "node": event.node,
        "step": event.step,
        "details": event.details,
        "key": event.key,
    }


def store(session: Session, job: Job, events: Sequence[EventIn]) -> list[Event]:
    """Store the events not stored before; returns the new rows (a resend returns none)."""
    unique: dict[str, EventIn] = {}
    for event in events:
        unique.setdefault(event.key, event)
    if not unique:
        return []
    received_at = utcnow()
    if session.get_bind().dialect.name == "postgresql":
        return _store_postgresql(session, job, list(unique.values()), received_at)
    rows = [_row(job, e, received_at) for e in unique.values()]
    new_keys: list[str] = []
    chunk = max_rows_per_statement(session, len(rows[0]))
    for start in range(0, len(rows), chunk):
        stmt = (
            insert_for(session, Event)
            .values(rows[start : start + chunk])
            .on_conflict_do_nothing(index_elements=["job_id", "key"])
            .returning(Event.key)
        )
        new_keys.extend(session.execute(stmt).scalars())
    if not new_keys:
        return []
    stored = session.scalars(select(Event).where(Event.job_id == job.id, Event.key.in_(new_keys))).all()
    return sorted(stored, key=lambda e: e.id)


# One statement per batch on PostgreSQL: the events travel as one JSON array (json, not jsonb: details keep their
# text), where a multi-VALUES insert cost a SQL compilation and 10 bound parameters per event. It returns the new
# rows whole, so they need no second query.
_INSERT_POSTGRESQL = text(
    """
    INSERT INTO events (job_id, attempt, type, ts, received_at, rank, node, step, details, key)
    SELECT :job_id, u.attempt, u.type, u.ts, :received_at, u.rank, u.node, u.step, u.details, u.key
    FROM ROWS FROM (
        json_to_recordset(CAST(:rows AS json)) AS (
            attempt integer, type varchar, ts timestamptz, rank integer, node varchar, step bigint, details json,
            key varchar
        )
    ) WITH ORDINALITY AS u(attempt, type, ts, rank, node, step, details, key, n)
    ORDER BY u.n
    ON CONFLICT (job_id, key) DO NOTHING
    RETURNING events.*
    """
)


def _store_postgresql(session: Session, job: Job, events: Sequence[EventIn], received_at: datetime) -> list[Event]:
    rows = [
        {
            "attempt": job.attempt if e.attempt is None else e.attempt,
            "type": e.type.value,
            "ts": (e.ts or received_at).isoformat(),
            "rank": e.rank,
            "node": e.node,
            "step": e.step,
            "details": e.details,
            "key": e.key,
        }
        for e in events
    ]
    params = {"job_id": job.id, "received_at": received_at, "rows": json.dumps(rows)}
    stored = session.scalars(select(Event).from_statement(_INSERT_POSTGRESQL), params).all()
    return sorted(stored, key=lambda e: e.id)


def record(session: Session, job: Job, event: EventIn) -> Event | None:
    """Store one event; None when its key was already stored."""
    stored = store(session, job, [event])
    return stored[0] if stored else None


def page(
    session: Session,
    job_id: str,
    *,
    types: Sequence[str] = (),
    since: datetime | None = None,
    until: datetime | None = None,
    after_id: int = 0,
    limit: int = 100,
) -> list[Event]:
    query = select(Event).where(Event.job_id == job_id, Event.id > after_id)
    if types:
        query = query.where(Event.type.in_(list(types)))
    if since is not None:
        query = query.where(Event.ts >= since)
    if until is not None:
        query = query.where(Event.ts < until)
    return list(session.scalars(query.order_by(Event.id).limit(limit)))


def newest(session: Session, job_id: str, limit: int) -> list[Event]:
    """The job's newest `limit` events by time (the index on job and ts: a job of 131,072 ranks stores hundreds of
    thousands), oldest first."""
    query = select(Event).where(Event.job_id == job_id).order_by(Event.ts.desc(), Event.id.desc()).limit(limit)
    return list(session.scalars(query))[::-1]


def latest_ts(session: Session, job_id: str, attempt: int, types: Sequence[str]) -> datetime | None:
    return session.scalar(
        select(func.max(Event.ts)).where(Event.job_id == job_id, Event.attempt == attempt, Event.type.in_(list(types)))
    )


def latest(session: Session, job_id: str, attempt: int, types: Sequence[str]) -> Event | None:
    query = select(Event).where(Event.job_id == job_id, Event.attempt == attempt, Event.type.in_(list(types)))
    return session.scalar(query.order_by(Event.ts.desc(), Event.id.desc()).limit(1))


def nodes_named(session: Session, job_id: str, attempt: int, types: Sequence[str]) -> list[str]:
    """The nodes of an attempt's events of these types, first named first."""
    query = select(Event.node).where(
        Event.job_id == job_id, Event.attempt == attempt, Event.type.in_(list(types)), Event.node.is_not(None)
    )
    return list(dict.fromkeys(n for n in session.scalars(query.order_by(Event.id)) if n))


def keys_of_type(session: Session, job_id: str, attempt: int, type_: str) -> set[str]:
    """The keys of an attempt's events of one type (to skip re-reporting what is stored)."""
    query = select(Event.key).where(Event.job_id == job_id, Event.type == type_, Event.attempt == attempt)
    return set(session.scalars(query))


def of_job(session: Session, job_id: str, *, types: Sequence[str] = ()) -> list[Event]:
    query = select(Event).where(Event.job_id == job_id)
    if types:
        query = query.where(Event.type.in_(list(types)))
    return list(session.scalars(query.order_by(Event.ts, Event.id)))


def last_ts_of_job(
    session: Session, job_id: str, types: Sequence[str], *, before: datetime | None = None
) -> datetime | None:
    """The newest time of the job's events of these types (over every attempt), before `before` if given."""
    query = select(func.max(Event.ts)).where(Event.job_id == job_id, Event.type.in_(list(types)))
    if before is not None:
        query = query.where(Event.ts <= before)
    return session.scalar(query)


def max_step(session: Session, job_id: str, attempt: int, type_: str) -> int | None:
    """The highest step of an attempt's events of one type."""
    query = select(func.max(Event.step)).where(Event.job_id == job_id, Event.attempt == attempt, Event.type == type_)
    return session.scalar(query)


def max_step_of_job(session: Session, job_id: str, type_: str, *, before: datetime) -> int | None:
    """The highest step of the job's events of one type at or before `before` (e.g. the newest checkpoint then)."""
    query = select(func.max(Event.step)).where(Event.job_id == job_id, Event.type == type_, Event.ts <= before)
    return session.scalar(query)
