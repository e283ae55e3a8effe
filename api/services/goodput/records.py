"""Reading a job's events into the records the accounting reads, per-rank kinds aggregated."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.database.tables import Event
from api.schemas.events import EventType
from api.schemas.rungs import RESTART_TYPES

TERMINAL_TYPES = frozenset({EventType.succeeded, EventType.failed, EventType.cancelled})
SILENCE_TYPES = frozenset({EventType.hang_detected, EventType.heartbeat_lost})
FAILURE_TYPES = frozenset({EventType.rank_failed, EventType.node_failed, EventType.preempted})
# Events whose step was current at their (onset) time.
PROGRESS_TYPES = FAILURE_TYPES | SILENCE_TYPES | {EventType.fault_injected}
# Every type the accounting reads; `running` and the silences are read aggregated (see load_records).
STRAGGLER_TYPES = frozenset({EventType.straggler_detected, EventType.straggler_cleared})
READ_TYPES = frozenset(
    {EventType.submitted, EventType.checkpoint_saved, EventType.fault_injected, EventType.queued}
    | {EventType.launcher_cycle}
    | STRAGGLER_TYPES
    | TERMINAL_TYPES
    | SILENCE_TYPES
    | RESTART_TYPES
    | FAILURE_TYPES
)


@dataclass(frozen=True)
class Record:
    """What the accounting reads of one event (a stored row, or one built by hand in a test)."""

    type: str
    ts: datetime
    attempt: int = 0
    step: int | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def number(self, key: str) -> float | None:
        """A finite number under `key` of the details, else None."""
        return number(self.details.get(key))

    def integer(self, key: str) -> int | None:
        value = self.number(key)
        return int(value) if value is not None else None


def number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def load_records(session: Session, job_id: str) -> list[Record]:
    """The job's events the accounting needs, with the per-rank kinds read aggregated: `running` one row per
    run and source (its last rank's time; a job of N ranks sends N per restart), and silences one row per detection
    pass (the supervisor stores a pass's hang_detected events with one time; a job-wide hang is one event per
    node), carrying the longest silence (`silent_s`) and the highest step."""
    per_rank = [EventType.running.value, *(t.value for t in SILENCE_TYPES)]
    rows = session.execute(
        select(Event.type, Event.ts, Event.attempt, Event.step, Event.details).where(
            Event.job_id == job_id,
            Event.type.in_([t.value for t in READ_TYPES if t.value not in per_rank]),
        )
    ).all()
    records = [Record(t, ts, attempt, step, details or {}) for t, ts, attempt, step, details in rows]
    silent_s = Event.details["silent_s"].as_float()
    passes = session.execute(
        select(Event.type, Event.ts, Event.attempt, func.max(Event.step), func.max(silent_s))
        .where(Event.job_id == job_id, Event.type.in_([t.value for t in SILENCE_TYPES]))
        .group_by(Event.type, Event.ts, Event.attempt)
    ).all()
    for t, ts, attempt, step, silent in passes:
        records.append(Record(t, _aware(ts), attempt, step, {"silent_s": silent}))
    restart_count = Event.details["restart_count"].as_integer()
    iteration = Event.details["iteration"].as_integer()
    source = Event.details["source"].as_string()  # "agent": said by the node agent for ranks that did not
    basis = Event.details["basis"].as_string()  # the agent's: "processes" (ranks up) or "progress" (their output)
    runs = session.execute(
        select(Event.attempt, restart_count, iteration, source, basis, func.max(Event.ts), func.min(Event.step))
        .where(Event.job_id == job_id, Event.type == EventType.running.value)
        .group_by(Event.attempt, restart_count, iteration, source, basis)
    ).all()
    for attempt, rc, it, said_by, on, ts, step in runs:
        details: dict[str, Any] = {"restart_count": rc or 0, "iteration": it or 0, "start_step": step}
        if said_by is not None:
            details["source"] = said_by
        if on is not None:
            details["basis"] = on
        records.append(Record(EventType.running.value, _aware(ts), attempt, step, details))
    return records


def _aware(ts: datetime | str) -> datetime:
    if isinstance(ts, str):  # aggregates over SQLite come back as text
        ts = datetime.fromisoformat(ts)
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)
