"""`/v1/jobs/{id}/reports|events|heartbeats|ranks|nodes`: what node agents and trainers report, and what
operators read back."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Query

from api.core.errors import ApiError, responses
from api.deps import AdminDep, EventsReporterDep, HeartbeatsReporterDep, NodeReporterDep, SessionDep
from api.models import events as event_store
from api.models import liveness, nodes
from api.routes.jobs import load_job
from api.schemas.events import (
    EventBatch,
    EventBatchResult,
    EventOut,
    EventPage,
    EventType,
    HeartbeatBatch,
    HeartbeatResult,
    Instant,
    RankOut,
    utcnow,
)
from api.schemas.reports import NodeOut, NodeReport, ReportResult
from api.services import lifecycle, reporting

router = APIRouter(prefix="/v1/jobs/{job_id}", tags=["reports"])


@router.post("/reports", response_model=ReportResult, responses=responses(404, 409, 429))
def post_report(job_id: str, report: NodeReport, session: SessionDep, _: NodeReporterDep) -> ReportResult:
    """A node agent's batched report: its events (idempotent by `key`), its ranks' heartbeats and its liveness.
    The reply carries the faults for the node's ranks."""
    job = load_job(session, job_id, for_update=bool(report.events))
    if job.status in lifecycle.TERMINAL and not report.events:
        raise ApiError(409, f"job is {job.status}; it takes no more reports", field="job_id")
    return reporting.ingest_node_report(session, job, report)


@router.get("/nodes", response_model=list[NodeOut], responses=responses(404))
def list_nodes(job_id: str, session: SessionDep, _: AdminDep) -> list[NodeOut]:
    """Each node agent's newest report: launcher and rank processes, progress source, health."""
    job = load_job(session, job_id)
    timeout = lifecycle.spec_of(job).resiliency.heartbeat_timeout_s
    cutoff = utcnow() - timedelta(seconds=timeout)
    out = []
    for row in nodes.of_job(session, job_id):
        item = NodeOut.model_validate(row)
        item.stale = row.attempt == job.attempt and row.last_seen < cutoff and job.status not in lifecycle.TERMINAL
        out.append(item)
    return out


@router.post("/events", response_model=EventBatchResult, responses=responses(404, 429))
def post_events(job_id: str, batch: EventBatch, session: SessionDep, _: EventsReporterDep) -> EventBatchResult:
    """Store a batch of events. Idempotent by `key`: a resend answers 200 and stores nothing twice."""
    job = load_job(session, job_id, for_update=True)
    stored, duplicates = reporting.ingest_events(session, job, batch)
    return EventBatchResult(stored=len(stored), duplicates=duplicates)


@router.get("/events", response_model=EventPage, responses=responses(404))
def list_events(
    job_id: str,
    session: SessionDep,
    _: AdminDep,
    type_: Annotated[list[EventType], Query(alias="type")] = [],  # noqa: B006
    since: Instant | None = None,
    until: Instant | None = None,
    cursor: int = Query(default=0, ge=0, description="The next_cursor of the previous page."),
    limit: int = Query(default=100, ge=1, le=1000),
) -> EventPage:
    load_job(session, job_id)
    rows = event_store.page(
        session,
        job_id,
        types=[t.value for t in type_],
        since=since,
        until=until,
        after_id=cursor,
        limit=limit + 1,
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return EventPage(
        items=[EventOut.model_validate(r) for r in rows],
        next_cursor=str(rows[-1].id) if more and rows else None,
    )


@router.post("/heartbeats", response_model=HeartbeatResult, responses=responses(404, 409, 429))
def post_heartbeats(
    job_id: str, batch: HeartbeatBatch, session: SessionDep, _: HeartbeatsReporterDep
) -> HeartbeatResult:
    """Update per-rank liveness. The reply carries faults the trainer is asked to inject."""
    job = load_job(session, job_id)
    if job.status in lifecycle.TERMINAL:
        raise ApiError(409, f"job is {job.status}; it takes no more heartbeats", field="job_id")
    accepted, faults = reporting.ingest_heartbeats(session, job, batch)
    return HeartbeatResult(accepted=accepted, faults=faults)


@router.get("/ranks", response_model=list[RankOut], responses=responses(404))
def list_ranks(job_id: str, session: SessionDep, _: AdminDep) -> list[RankOut]:
    job = load_job(session, job_id)
    timeout = lifecycle.spec_of(job).resiliency.heartbeat_timeout_s
    cutoff = utcnow() - timedelta(seconds=timeout)
    out = []
    for row in liveness.ranks(session, job_id):
        item = RankOut.model_validate(row)
        item.stale = row.attempt == job.attempt and row.last_seen < cutoff and job.status not in lifecycle.TERMINAL
        out.append(item)
    return out
