"""`/v1/jobs/{id}/reports|events|heartbeats|ranks|nodes`: what node agents and trainers report, and what
operators read back."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from api import models
from api.core import oidc
from api.core.authz import Principal, report_refusal
from api.core.config import get_settings
from api.core.errors import ApiError, responses
from api.database.tables import Job, NodeLiveness, RankLiveness
from api.deps import (
    ANONYMOUS_ADMIN,
    EventsReporterDep,
    HeartbeatsReporterDep,
    JobViewerDep,
    SessionDep,
    bearer_token,
    refuse,
    within_limit_async,
)
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
from api.services import lifecycle
from api.services.ingest import caches, liveness_writer, node_report, reporting
from api.services.job_liveness_view import is_stale

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
    within `FTPLANE_LIVENESS_FLUSH_S` of the reply (see api/services/ingest/liveness_writer.py), with or without
    events."""
    principal = await _reporter(request, job_id)
    await within_limit_async(principal, "reports")
    try:
        report = NodeReport.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None
    outcome = await node_report.ingest(job_id, report)
    if isinstance(outcome, node_report.LivenessOnly):
        body = f'{{"stored":0,"duplicates":0,"accepted":{outcome.accepted},"faults":[]}}'
    else:
        body = outcome.model_dump_json()
    return Response(body, media_type="application/json")


async def _reporter(request: Request, job_id: str) -> Principal:
    """Who sends the report: the job's own trainer token (or an admin), from the cache when it is there."""
    if not get_settings().auth_enabled:
        return ANONYMOUS_ADMIN
    token = bearer_token(request)
    if not token:
        raise ApiError(401, "missing bearer token: send 'Authorization: Bearer <token>'", headers=_CHALLENGE)
    try:
        principal = await caches.principal(token)
    except oidc.ProviderUnavailable as exc:
        raise ApiError(503, f"the identity provider's keys cannot be read now ({exc}); retry shortly") from None
    if principal is None:
        raise ApiError(401, "invalid or revoked token", headers=_CHALLENGE)
    project = None
    if principal.job_id != job_id and not principal.is_trainer:  # an operator reporting for a job: its project
        state = await caches.job_state(job_id)
        project = state.project if state is not None else None
    refusal = report_refusal(principal, job_id, project)
    if refusal is not None:
        raise refuse(refusal, "job_id")
    return principal


_CHALLENGE = {"WWW-Authenticate": "Bearer"}


# A job of 16,384 nodes and 131,072 ranks: all of its ranks are 25 MB of JSON and seconds of the API's CPU.
PAGE_LIMIT = Query(
    default=None, ge=1, le=100_000, description="At most this many (all when absent); the next page is after the last."
)


@router.get("/nodes", response_model=list[NodeOut], responses=responses(404))
def list_nodes(
    job_id: str,
    session: SessionDep,
    _: JobViewerDep,
    after: str = Query(default="", max_length=253, description="The name of the last node of the previous page."),
    limit: int | None = PAGE_LIMIT,
) -> list[NodeOut]:
    """Each node agent's newest report: launcher and rank processes, progress source, health; by node name."""
    liveness_writer.flush()
    job = load_job(session, job_id)
    stale = _staleness(job)
    return [
        NodeOut.model_validate(row).model_copy(update={"stale": stale(row)})
        for row in models.nodes.of_job(session, job_id, after=after, limit=limit)
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
    _: JobViewerDep,
    type_: Annotated[list[EventType], Query(alias="type")] = [],  # noqa: B006
    since: Instant | None = None,
    until: Instant | None = None,
    cursor: int = Query(default=0, ge=0, le=2**63 - 1, description="The next_cursor of the previous page."),
    limit: int = Query(default=100, ge=1, le=1000),
) -> EventPage:
    load_job(session, job_id)
    rows = models.events.page(
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
    accepted, faults = reporting.ingest_heartbeats(session, job, batch)
    return HeartbeatResult(accepted=accepted, faults=faults)


@router.get("/ranks", response_model=list[RankOut], responses=responses(404))
def list_ranks(
    job_id: str,
    session: SessionDep,
    _: JobViewerDep,
    after: int = Query(default=-1, ge=-1, le=2**31 - 1, description="The last rank of the previous page."),
    limit: int | None = PAGE_LIMIT,
) -> list[RankOut]:
    """Each rank's newest heartbeat, by rank."""
    liveness_writer.flush()
    job = load_job(session, job_id)
    stale = _staleness(job)
    return [
        RankOut.model_validate(row).model_copy(update={"stale": stale(row)})
        for row in models.liveness.ranks(session, job_id, after=after, limit=limit)
    ]


def _staleness(job: Job) -> Callable[[RankLiveness | NodeLiveness], bool]:
    """Whether a liveness row of the job is stale (`is_stale`, the heartbeat timeout ago from now)."""
    cutoff = utcnow() - timedelta(seconds=lifecycle.spec_of(job).resiliency.heartbeat_timeout_s)
    return lambda row: is_stale(job, row, cutoff)


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
