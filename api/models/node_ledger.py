"""The node ledger's writes: its cursor over the events, the nodes and runs it finds in them, the faults it records."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from api.database.tables import Event, FleetNode, NodeFault, NodeLedgerCursor, NodeRun
from api.models.upsert import ColumnarUpsert, insert_for
from api.schemas.events import utcnow

CURSOR = "events"


@dataclass(frozen=True)
class EventHead:
    """What the ledger reads of every event (its details only for those that may blame a node)."""

    id: int
    received_at: datetime
    job_id: str
    attempt: int
    type: str
    ts: datetime
    node: str | None


def cursor(session: Session) -> NodeLedgerCursor:
    """The cursor's row, locked (made at 0 the first time)."""
    row = session.scalar(select(NodeLedgerCursor).where(NodeLedgerCursor.name == CURSOR).with_for_update())
    if row is None:
        session.execute(
            insert_for(session, NodeLedgerCursor)
            .values(name=CURSOR, position=0, updated_at=utcnow())
            .on_conflict_do_nothing(index_elements=["name"])
        )
        row = session.scalar(select(NodeLedgerCursor).where(NodeLedgerCursor.name == CURSOR).with_for_update())
    assert row is not None
    return row


def events_after(session: Session, position: int, limit: int) -> list[EventHead]:
    """The next `limit` events after `position`, in id order (the primary key's index: no scan)."""
    query = (
        select(Event.id, Event.received_at, Event.job_id, Event.attempt, Event.type, Event.ts, Event.node)
        .where(Event.id > position)
        .order_by(Event.id)
        .limit(limit)
    )
    return [EventHead(*row) for row in session.execute(query)]


def events(session: Session, ids: Sequence[int]) -> list[Event]:
    return list(session.scalars(select(Event).where(Event.id.in_(ids)).order_by(Event.id))) if ids else []


def injected(session: Session, job_id: str, attempt: int, kind: str, *, node: str | None, rank: int | None) -> bool:
    """Whether a `fault_injected` of `kind` was reported in that attempt, on that node (or for that rank)."""
    query = select(Event.node, Event.rank, Event.details).where(
        Event.job_id == job_id, Event.type == "fault_injected", Event.attempt == attempt
    )
    for found_node, found_rank, details in session.execute(query):
        if not isinstance(details, dict) or details.get("kind") != kind:
            continue
        if (node is not None and (found_node or "").lower() == node) or (rank is not None and found_rank == rank):
            return True
    return False


def _seen_later(old: Any, new: Any) -> Any:
    """A node or run seen again only moves its `last_seen` forward."""
    return old.last_seen < new.last_seen


# A new node is healthy (its state is the rule's); one seen again keeps all but its `last_seen`.
_NODES_SEEN = ColumnarUpsert.of(
    FleetNode, ("name",), ("last_seen",), _seen_later, ("state", "state_since", "quarantines", "first_seen")
)
_RUNS_SEEN = ColumnarUpsert.of(NodeRun, ("node", "job_id", "attempt"), ("last_seen",), _seen_later, ("first_seen",))


def ensure_nodes(session: Session, seen: dict[str, tuple[datetime, datetime]]) -> None:
    """Make the nodes not known yet (healthy), and move `last_seen` of those known forward."""
    now = utcnow()
    rows = [
        {"name": name, "state": "healthy", "state_since": now, "quarantines": 0, "first_seen": first, "last_seen": last}
        for name, (first, last) in seen.items()
    ]
    _NODES_SEEN.write(session, rows)


def record_runs(session: Session, runs: dict[tuple[str, str, int], tuple[datetime, datetime]]) -> None:
    """Each (node, job, attempt) seen, first and last (a run seen again only moves its `last_seen` forward)."""
    rows = [
        {"node": node, "job_id": job, "attempt": attempt, "first_seen": first, "last_seen": last}
        for (node, job, attempt), (first, last) in runs.items()
    ]
    _RUNS_SEEN.write(session, rows)


def faults_by_key(session: Session, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], NodeFault]:
    """The faults already recorded under these (node, key) pairs, locked."""
    wanted = sorted(set(keys))
    if not wanted:
        return {}
    query = select(NodeFault).where(tuple_(NodeFault.node, NodeFault.key).in_(wanted)).with_for_update()
    return {(f.node, f.key): f for f in session.scalars(query)}


def add_fault(session: Session, row: dict[str, Any]) -> bool:
    """Record a fault once (a second writer of the same key leaves the first); whether this one was new."""
    stmt = insert_for(session, NodeFault).values(**row).on_conflict_do_nothing(index_elements=["node", "key"])
    return bool(session.execute(stmt.returning(NodeFault.id)).first())
