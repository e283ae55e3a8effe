"""Ingest of what nodes, trainers and backends report: events (idempotent), heartbeats and node liveness."""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy.orm import Session

from api.database.tables import Event, Job, PendingFault
from api.models import events as event_store
from api.models import faults as fault_outbox
from api.models import liveness
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
    stored = event_store.store(session, job, batch.events)
    by_key = {e.key: e for e in batch.events}
    for row in stored:
        reported = by_key[row.key]
        lifecycle.apply_reported_event(session, job, reported)
        if row.type == EventType.fault_injected:
            fault_id = reported.details.get("fault_id") or reported.details.get("id")
            if isinstance(fault_id, str):
                fault_outbox.mark_fired(session, job.id, fault_id)
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
    attempt = job.attempt if batch.attempt is None else batch.attempt
    if attempt < job.attempt:
        return 0, []  # a straggler of an attempt already replaced: nothing to learn from it
    accepted = liveness.record_heartbeats(session, job.id, attempt, batch.heartbeats)
    notifications.heartbeats_ingested(accepted)
    ranks = {b.rank for b in batch.heartbeats}
    pending = fault_outbox.undelivered(session, job.id, attempt, fault_outbox.Delivery.trainer, ranks=ranks)
    faults = [FaultDirective.model_validate(directive(f)) for f in pending]
    return accepted, faults


def total_steps(report: NodeReport) -> int | None:
    """The job's total steps as the report's ranks know it, if they say."""
    return max((b.total_steps for b in report.heartbeats if b.total_steps), default=None)


def faults_to_hand_over(session: Session, job: Job, report: NodeReport) -> list[NodeDirective]:
    """The faults waiting for the report's ranks: the agent's are marked delivered as they are handed over (at most
    once), the ranks' own ride on every reply until a rank reports one injected."""
    ranks = {r.rank for r in report.agent.ranks} | {b.rank for b in report.heartbeats}
    if not ranks or report.attempt < job.attempt:
        return []
    pending = fault_outbox.undelivered(
        session, job.id, report.attempt, (fault_outbox.Delivery.agent, fault_outbox.Delivery.trainer), ranks=ranks
    )
    fault_outbox.mark_delivered([f for f in pending if f.delivery == fault_outbox.Delivery.agent])
    return [NodeDirective(**directive(f), delivery=_DELIVERED_BY[f.delivery]) for f in pending]


_DELIVERED_BY: dict[str, Literal["agent", "trainer"]] = {
    fault_outbox.Delivery.agent.value: "agent",
    fault_outbox.Delivery.trainer.value: "trainer",
}


def directive(fault: PendingFault) -> dict[str, Any]:
    """What a fault's injector is told of it (a slowdown's fraction and duration only where it has them)."""
    out: dict[str, Any] = {"id": fault.id, "kind": fault.kind, "rank": fault.rank, "at_step": fault.at_step}
    if fault.fraction is not None:
        out["fraction"] = fault.fraction
    if fault.duration_steps is not None:
        out["duration_steps"] = fault.duration_steps
    return out
