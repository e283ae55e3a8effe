"""What nodes, trainers and the control plane's own duties report, stored: events (idempotent, what they mean
applied to the job), heartbeats of `POST /heartbeats`, and the faults handed over in the replies."""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy.orm import Session

from api import models
from api.core.errors import ApiError
from api.database.tables import Event, Job, PendingFault
from api.schemas.events import (
    MAX_EVENTS_PER_BATCH,
    EventBatch,
    EventIn,
    EventType,
    FaultDirective,
    HeartbeatBatch,
)
from api.schemas.reports import NodeDirective, NodeReport
from api.services import lifecycle, notifications


def ingest_events(session: Session, job: Job, batch: EventBatch) -> tuple[list[Event], int]:
    """Store new events, apply what they mean to the job; returns (new rows, duplicates)."""
    stored = models.events.store(session, job, batch.events)
    by_key = {e.key: e for e in batch.events}
    for row in stored:
        reported = by_key[row.key]
        lifecycle.apply_reported_event(session, job, reported)
        if row.type == EventType.fault_injected:
            fault_id = reported.details.get("fault_id") or reported.details.get("id")
            if isinstance(fault_id, str):
                models.faults.mark_fired(session, job.id, fault_id)
    notifications.events_stored(session, job, stored)
    return stored, len({e.key for e in batch.events}) - len(stored)


def record_events(session: Session, job: Job, events: list[EventIn]) -> list[Event]:
    """The control plane's own reports (supervisor, backends) go through the same path, in batches of the
    API's size (a hang of a 16k-rank job is 16k hang_detected events)."""
    stored: list[Event] = []
    for start in range(0, len(events), MAX_EVENTS_PER_BATCH):
        new, _ = ingest_events(session, job, EventBatch(events=events[start : start + MAX_EVENTS_PER_BATCH]))
        stored.extend(new)
    return stored


def ingest_heartbeats(session: Session, job: Job, batch: HeartbeatBatch) -> tuple[int, list[FaultDirective]]:
    """Store a batch's heartbeats (accepted, faults to inject); an ended job takes none (409)."""
    if job.status in lifecycle.TERMINAL:
        raise ApiError(409, f"job is {job.status}; it takes no more heartbeats", field="job_id")
    attempt = job.attempt if batch.attempt is None else batch.attempt
    if attempt < job.attempt:
        return 0, []  # a straggler of an attempt already replaced: nothing to learn from it
    accepted = models.liveness.record_heartbeats(session, job.id, attempt, batch.heartbeats)
    notifications.heartbeats_ingested(accepted)
    ranks = {b.rank for b in batch.heartbeats}
    pending = models.faults.undelivered(session, job.id, attempt, models.faults.Delivery.trainer, ranks=ranks)
    faults = [FaultDirective.model_validate(directive(f)) for f in pending]
    return accepted, faults


def faults_to_hand_over(session: Session, job: Job, report: NodeReport) -> list[NodeDirective]:
    """The faults waiting for the report's ranks: the agent's are marked delivered as they are handed over (at most
    once), the ranks' own ride on every reply until a rank reports one injected."""
    ranks = {r.rank for r in report.agent.ranks} | {b.rank for b in report.heartbeats}
    if not ranks or report.attempt < job.attempt:
        return []
    pending = models.faults.undelivered(
        session, job.id, report.attempt, (models.faults.Delivery.agent, models.faults.Delivery.trainer), ranks=ranks
    )
    models.faults.mark_delivered([f for f in pending if f.delivery == models.faults.Delivery.agent])
    return [NodeDirective(**directive(f), delivery=_DELIVERED_BY[f.delivery]) for f in pending]


_DELIVERED_BY: dict[str, Literal["agent", "trainer"]] = {
    models.faults.Delivery.agent.value: "agent",
    models.faults.Delivery.trainer.value: "trainer",
}


def directive(fault: PendingFault) -> dict[str, Any]:
    """What a fault's injector is told of it (a slowdown's fraction and duration only where it has them)."""
    out: dict[str, Any] = {"id": fault.id, "kind": fault.kind, "rank": fault.rank, "at_step": fault.at_step}
    if fault.fraction is not None:
        out["fraction"] = fault.fraction
    if fault.duration_steps is not None:
        out["duration_steps"] = fault.duration_steps
    return out
