"""The node ledger: reads the events past its cursor, records the nodes, runs and faults they show, then judges the
nodes whose faults changed and those whose state may change with time.

Incremental: events are append-only, so a pass reads only those past its cursor (by id, the primary key's
index), at most MAX_BATCHES batches of BATCH. Nothing is added to the report path: node reports are stored
as before, and the ledger reads them after.

Ids are handed out before their transactions commit, so an event of a slow transaction may become visible
after one with a higher id. The cursor therefore moves only past events received SETTLE ago or earlier (every
transaction that stores events has committed or failed by then); the newer ones are read again on the next
pass. Reading an event again changes nothing: a run only moves forward, a fault is recorded once per key. So a
process skips the events it recorded past the cursor, while the cursor is as it left it (`Recorded`): a job of
16,384 nodes stores thousands of events in SETTLE, and recording them again took a pass over a second.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from api.core.config import get_settings
from api.database.tables import NodeFault
from api.models import fleet_nodes, node_ledger
from api.models.node_ledger import EventHead
from api.schemas.events import EventType, utcnow
from api.schemas.fleet_nodes import FaultKind, fleet_name
from api.services.node_reputation import standing
from api.services.node_reputation.blame import (
    BLAMING_TYPES,
    EXCLUSION_PRIORITY,
    NOT_RUNS,
    PRIORITY,
    Blame,
    blame,
)
from api.services.node_reputation.rule import Rule

log = logging.getLogger(__name__)

BATCH = 5000
MAX_BATCHES = 20
SETTLE = timedelta(seconds=30)
_BLAMING = frozenset(t.value for t in BLAMING_TYPES)


@dataclass(frozen=True)
class Recorded:
    """The events past the cursor that this process recorded, and the cursor (position, updated_at) as it left it.
    Valid while the cursor is unchanged: another worker's pass moves it, and everything past it is read again."""

    cursor: tuple[int, datetime] | None = None
    ids: frozenset[int] = frozenset()


# per engine: a process's database (a test's own database is another engine)
_recorded: weakref.WeakKeyDictionary[Any, Recorded] = weakref.WeakKeyDictionary()


def run_once(session: Session, now: datetime | None = None) -> int:
    """One pass: read what is new, then judge; the number of nodes judged."""
    now = now or utcnow()
    touched: set[str] = set()
    bind = session.get_bind()
    for _ in range(MAX_BATCHES):
        more, recorded = read_batch(session, now, touched, _recorded.get(bind, Recorded()))
        session.commit()
        _recorded[bind] = recorded
        if not more:
            break
    rule = Rule.of(get_settings())
    names = sorted(touched | set(fleet_nodes.not_healthy(session)))
    for name in names:
        try:
            standing.judge_node(session, name, now, rule)
            session.commit()
        except Exception:
            session.rollback()
            log.exception("node ledger: judging node %s failed; it is judged again on the next pass", name)
    return len(names)


def read_batch(session: Session, now: datetime, touched: set[str], recorded: Recorded) -> tuple[bool, Recorded]:
    """Record one batch past the cursor, less what `recorded` says is (nodes whose faults changed go to
    `touched`); whether more are waiting, and what is recorded past the cursor once this commits."""
    cursor = node_ledger.cursor(session)
    heads = node_ledger.events_after(session, cursor.position, BATCH)
    if not heads:
        return False, recorded
    skipped = recorded.ids if recorded.cursor == (cursor.position, cursor.updated_at) else frozenset()
    new = [h for h in heads if h.id not in skipped]
    blaming = [h.id for h in new if h.type in _BLAMING and fleet_name(h.node) is not None]
    blames = [b for b in (blame(e) for e in node_ledger.events(session, blaming)) if b is not None]
    _record_runs(session, new, blames)
    touched.update(record_faults(session, blames))
    settled = now - SETTLE
    position = cursor.position
    for head in heads:
        if head.received_at > settled:
            break
        position = head.id
    cursor.position, cursor.updated_at = position, now
    unsettled = frozenset(h.id for h in heads if h.id > position)
    return len(heads) == BATCH and position == heads[-1].id, Recorded((position, now), unsettled)


def _record_runs(session: Session, heads: Iterable[EventHead], blames: Iterable[Blame]) -> None:
    """The nodes the events name (those a fault is blamed on included), and the runs they show."""
    nodes: dict[str, tuple[datetime, datetime]] = {}
    runs: dict[tuple[str, str, int], tuple[datetime, datetime]] = {}
    for head in heads:
        name = fleet_name(head.node)
        if name is None or head.type in NOT_RUNS:
            continue
        nodes[name] = _span(nodes.get(name), head.ts)
        runs[(name, head.job_id, head.attempt)] = _span(runs.get((name, head.job_id, head.attempt)), head.ts)
    for found in blames:
        nodes[found.node] = _span(nodes.get(found.node), found.event.ts)
    node_ledger.ensure_nodes(session, nodes)
    node_ledger.record_runs(session, runs)


def _span(span: tuple[datetime, datetime] | None, ts: datetime) -> tuple[datetime, datetime]:
    return (ts, ts) if span is None else (min(span[0], ts), max(span[1], ts))


def record_faults(session: Session, blames: list[Blame]) -> set[str]:
    """Record each fault once per key, the most telling blame winning (blame.py); the nodes whose faults changed."""
    best: dict[tuple[str, str], Blame] = {}
    for found in blames:
        key = (found.node, found.key)
        held = best.get(key)
        if held is None or found.priority > held.priority:
            best[key] = found
    existing = node_ledger.faults_by_key(session, best)
    changed: set[str] = set()
    for key, found in sorted(best.items()):
        found = _as_injected(session, found)
        old = existing.get(key)
        if old is None:
            if node_ledger.add_fault(session, _row(found)):
                changed.add(found.node)
        elif found.priority > _priority(old):
            earliest = min(old.ts, found.event.ts)
            for field, value in _row(found).items():
                setattr(old, field, value)
            old.ts = earliest
            changed.add(found.node)
    return changed


def _as_injected(session: Session, found: Blame) -> Blame:
    """The blame as `injected` when ftplane injected what it stands for (blame.py)."""
    on_node = None if found.kind == FaultKind.straggler else found.node
    rank = found.rank if found.kind == FaultKind.straggler else None
    if found.kind == FaultKind.straggler and rank is None:
        return found
    if node_ledger.injected(session, found.job_id, found.attempt, found.injection_kind, node=on_node, rank=rank):
        return found.injected()
    return found


def _row(found: Blame) -> dict[str, object]:
    return {
        "node": found.node,
        "key": found.key,
        "job_id": found.job_id,
        "attempt": found.attempt,
        "kind": found.kind.value,
        "counted": found.counted,
        "ts": found.event.ts,
        "reason": found.reason,
        "details": found.details,
        "event_id": found.event.id,
    }


def _priority(fault: NodeFault) -> int:
    """The priority of the blame a recorded fault came from (blame.PRIORITY)."""
    details = fault.details or {}
    if details.get("event") == EventType.node_excluded.value:
        return EXCLUSION_PRIORITY
    kind = details.get("as", fault.kind) if fault.kind == FaultKind.injected.value else fault.kind
    try:
        return PRIORITY.get(FaultKind(kind), 0)
    except ValueError:
        return 0
