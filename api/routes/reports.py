"""`/v1/jobs/{id}/reports|events|heartbeats|ranks|nodes`: what node agents and trainers report, and what
operators read back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from api.core.config import get_settings
from api.core.errors import ApiError, responses
from api.database.tables import Job, NodeLiveness, RankLiveness
from api.deps import (
    ANONYMOUS_ADMIN,
    AdminDep,
    EventsReporterDep,
    HeartbeatsReporterDep,
    SessionDep,
    bearer_token,
    require_reporter,
    within_limit_async,
)
from api.models import events as event_store
from api.models import liveness, nodes
from api.models.tokens import Principal
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
from api.services import (
    group_commit,
    lifecycle,
    liveness_writer,
    notifications,
    report_admission,
    report_gate,
    reporting,
)

router = APIRouter(prefix="/v1/jobs/{job_id}", tags=["reports"])


@router.post(
    "/reports",
    response_model=ReportResult,
    responses=responses(404, 409, 429),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NodeReport"}}},
        }
    },
)
async def post_report(job_id: str, request: Request) -> Response:
    """A node agent's batched report: its events (idempotent by `key`), its ranks' heartbeats and its liveness.
    The reply carries the faults for the node's ranks.

    Events are stored before the reply (an acknowledged event is stored). Liveness is soft state: it is written
    within `FTPLANE_LIVENESS_FLUSH_S` of the reply (see api/services/liveness_writer.py), with or without events."""
    principal = await _reporter(request, job_id)
    await within_limit_async(principal, "reports")
    try:
        report = NodeReport.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None
    state = await report_gate.job_state(job_id)
    if state is None:
        raise ApiError(404, f"no job with id {job_id!r}", field="job_id")
    if state.ended and not report.events:
        raise ApiError(409, f"job is {state.status}; it takes no more reports", field="job_id")
    writer = liveness_writer.writer()
    if not writer.healthy:
        raise ApiError(503, "the database is unavailable; retry shortly", headers={"Retry-After": "1"})
    ranks = {r.rank for r in report.agent.ranks} | {b.rank for b in report.heartbeats}
    total = reporting.total_steps(report)
    new_total = total is not None and total != state.total_steps
    if report.events or report.attempt > state.attempt or state.fault_ranks & ranks or new_total:
        exclusive = bool(
            report.attempt > state.attempt
            or state.fault_ranks & ranks
            or new_total
            or lifecycle.changes_job(state.status, (e.type for e in report.events))
        )
        # faults of a new attempt are not in the cached state; else a fault asked for meanwhile waits for the next
        # report, as it does on the fast path (report_gate.JOB_STATE_TTL_S)
        look_for_faults = bool(state.fault_ranks & ranks) or report.attempt != state.attempt
        # stored with other nodes' reports in one transaction; alone where the batch could not take it
        outcome = await _admitted(
            "grouped", GROUPED_LIMIT, writer, job_id, report, state.attempt, _store_grouped, look_for_faults, exclusive
        )
        if outcome is None:
            outcome = await _admitted(
                "alone",
                get_settings().db_pool_size,
                writer,
                job_id,
                report,
                state.attempt,
                _store_alone,
                look_for_faults,
            )
        assert outcome is not None  # stored alone: a result or an error
        result, attempt = outcome
        result.accepted = await _take_liveness(writer, job_id, report, attempt)
        return Response(result.model_dump_json(), media_type="application/json")
    accepted = await _take_liveness(writer, job_id, report, state.attempt)
    return Response(f'{{"stored":0,"duplicates":0,"accepted":{accepted},"faults":[]}}', media_type="application/json")


GROUPED_LIMIT = 4 * group_commit.MAX_REPORTS  # reports waiting for a group commit per process, past that shed


async def _admitted(
    kind: str,
    limit: int,
    writer: liveness_writer.LivenessWriter,
    job_id: str,
    report: NodeReport,
    attempt: int,
    store: Callable[..., Awaitable[group_commit.Outcome]],
    *args: Any,
) -> group_commit.Outcome:
    """`store(job_id, report, *args)` in one of the process's slots of `kind`; with none free the report is shed: its
    liveness taken now, 503 with Retry-After, its events sent again by the agent (api/services/report_admission.py).
    The 503 says whether the liveness was taken (`liveness_taken`, and `accepted` heartbeats), so that the agent
    resends only the events."""
    slots = report_admission.slots(kind, limit)
    if not slots.take():
        accepted = await _take_liveness(writer, job_id, report, attempt)
        raise ApiError(
            503,
            f"{slots.limit} reports with events are being stored by this server; resend the events after Retry-After",
            headers={"Retry-After": str(slots.retry_after(report.agent.interval_s))},
            details={"liveness_taken": _takes_liveness(report, attempt), "accepted": accepted},
        )
    try:
        return await store(job_id, report, *args)
    finally:
        slots.give_back()


async def _store_grouped(
    job_id: str, report: NodeReport, look_for_faults: bool, exclusive: bool
) -> group_commit.Outcome:
    answer = group_commit.group_commit().submit(job_id, report, look_for_faults=look_for_faults, exclusive=exclusive)
    return await asyncio.wrap_future(answer)


async def _store_alone(job_id: str, report: NodeReport, look_for_faults: bool) -> tuple[ReportResult, int]:
    """In a transaction of its own, under the exclusive lock (it is the fallback: its view may be stale)."""
    return await run_in_threadpool(group_commit.store_alone, job_id, report, look_for_faults=look_for_faults)


def _takes_liveness(report: NodeReport, attempt: int) -> bool:
    """Whether a report's liveness counts: not when it is of an attempt older than the job's `attempt`."""
    return report.attempt >= attempt


async def _take_liveness(writer: liveness_writer.LivenessWriter, job_id: str, report: NodeReport, attempt: int) -> int:
    """The report's liveness and heartbeats into the coalescing writer (soft state), where `_takes_liveness`."""
    if not _takes_liveness(report, attempt):
        return 0
    if writer.period_s <= 0:  # written at once (no coalescing): a database write, off the event loop
        accepted = await run_in_threadpool(writer.add, job_id, report)
    else:
        accepted = writer.add(job_id, report)
    notifications.heartbeats_ingested(accepted)
    return accepted


async def _reporter(request: Request, job_id: str) -> Principal:
    """Who sends the report: the job's own trainer token (or an admin), from the cache when it is there."""
    if not get_settings().auth_enabled:
        return ANONYMOUS_ADMIN
    token = bearer_token(request)
    if not token:
        raise ApiError(401, "missing bearer token: send 'Authorization: Bearer <token>'", headers=_CHALLENGE)
    principal = await report_gate.principal(token)
    if principal is None:
        raise ApiError(401, "invalid or revoked token", headers=_CHALLENGE)
    return require_reporter(job_id, principal)


_CHALLENGE = {"WWW-Authenticate": "Bearer"}


@router.get("/nodes", response_model=list[NodeOut], responses=responses(404))
def list_nodes(job_id: str, session: SessionDep, _: AdminDep) -> list[NodeOut]:
    """Each node agent's newest report: launcher and rank processes, progress source, health."""
    liveness_writer.flush()
    job = load_job(session, job_id)
    stale = _staleness(job)
    return [
        NodeOut.model_validate(row).model_copy(update={"stale": stale(row)}) for row in nodes.of_job(session, job_id)
    ]


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
    cursor: int = Query(default=0, ge=0, le=2**63 - 1, description="The next_cursor of the previous page."),
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
    liveness_writer.flush()
    job = load_job(session, job_id)
    stale = _staleness(job)
    return [
        RankOut.model_validate(row).model_copy(update={"stale": stale(row)}) for row in liveness.ranks(session, job_id)
    ]


def _staleness(job: Job) -> Callable[[RankLiveness | NodeLiveness], bool]:
    """Whether a liveness row of the job is stale: its current attempt's, silent past the heartbeat timeout."""
    cutoff = utcnow() - timedelta(seconds=lifecycle.spec_of(job).resiliency.heartbeat_timeout_s)
    running = job.status not in lifecycle.TERMINAL
    return lambda row: running and row.attempt == job.attempt and row.last_seen < cutoff


def document(app: FastAPI) -> None:
    """Put NodeReport in the OpenAPI components: the report route reads its body itself (no model parameter), so
    FastAPI would not list it."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        extra = NodeReport.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(extra.pop("$defs", {}))
        components["NodeReport"] = extra
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
