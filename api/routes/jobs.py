"""`/v1/jobs`: submit, list, describe, cancel, inject faults."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Query, Request, status

from api import models
from api.core import queue
from api.core.authz import Role
from api.core.errors import ApiError, responses
from api.core.openapi import CURSOR_DESCRIPTION, CURSOR_PATTERN, link, links
from api.database.tables import Job
from api.deps import AuditDep, JobOperatorDep, JobViewerDep, MemberDep, SessionDep, project_for
from api.schemas.events import EventOut
from api.schemas.jobs import AttemptOut, FaultIn, FaultOut, JobCreated, JobDetail, JobOut, JobPage
from api.schemas.spec import JobSpec
from api.services import jobs as job_service
from api.services import lifecycle, progress
from api.services.ingest import caches, liveness_writer

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def load_job(session: SessionDep, job_id: str, *, for_update: bool = False) -> Job:
    job = models.jobs.get(session, job_id, for_update=for_update)
    if job is None:
        raise ApiError(404, f"no job with id {job_id!r}", field="job_id")
    return job


RECENT_EVENTS = 20  # a job's newest events, in its detail

# Where a new job's id leads: every route of the job.
_JOB = "$response.body#/id"
JOB_LINKS = links(
    201,
    GetJob=link("GET", "/v1/jobs/{job_id}", "The job, its attempts and recent events.", job_id=_JOB),
    CancelJob=link("POST", "/v1/jobs/{job_id}/cancel", "Cancel the job.", job_id=_JOB),
    InjectFault=link("POST", "/v1/jobs/{job_id}/faults", "Inject a fault into the job.", job_id=_JOB),
    PostReport=link("POST", "/v1/jobs/{job_id}/reports", "A node agent's report for the job.", job_id=_JOB),
    ListNodes=link("GET", "/v1/jobs/{job_id}/nodes", "The job's nodes.", job_id=_JOB),
    PostEvents=link("POST", "/v1/jobs/{job_id}/events", "Report events of the job.", job_id=_JOB),
    ListEvents=link("GET", "/v1/jobs/{job_id}/events", "The job's fault history.", job_id=_JOB),
    PostHeartbeats=link("POST", "/v1/jobs/{job_id}/heartbeats", "Report rank heartbeats.", job_id=_JOB),
    ListRanks=link("GET", "/v1/jobs/{job_id}/ranks", "Per-rank liveness.", job_id=_JOB),
    GetGoodput=link("GET", "/v1/jobs/{job_id}/goodput", "The job's goodput.", job_id=_JOB),
)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=JobCreated, responses=JOB_LINKS)
def submit_job(
    spec: JobSpec,
    request: Request,
    session: SessionDep,
    background: BackgroundTasks,
    principal: MemberDep,
    audit: AuditDep,
) -> JobCreated:
    """Accept a job spec. The job starts PENDING; a worker launches it. The trainer token is shown once.

    The spec's `project` must be one the caller is an operator (or admin) of: an unknown project, or one the
    caller holds no role in, is refused with 422 naming it; a viewer is refused with 403. So is a
    `checkpoint.resume_from` that is no job of that project.

    Rules between fields that the schema cannot state (a kubernetes job's image and checkpoint directory,
    fault ranks within nodes x procs_per_node, timeouts that must outlast others, ...) are checked after
    it: a spec that breaks one is refused with 422, and the message names the rule and the fields.
    """
    project_for(session, request, principal, spec.project, Role.operator)
    job, token = job_service.submit(session, spec)
    if audit is not None:
        audit.about(object_id=job.id)
    session.commit()
    background.add_task(queue.send, queue.SUBMIT_JOB, job.id)
    return JobCreated.model_validate({**JobOut.model_validate(job).model_dump(), "token": token})


@router.get(
    "",
    response_model=JobPage,
    responses=links(
        200,
        NextPage=link("GET", "/v1/jobs", "The next page.", cursor="$response.body#/next_cursor"),
    ),
)
def list_jobs(
    session: SessionDep,
    principal: MemberDep,
    project: Annotated[list[str], Query(description="Only jobs of these projects (repeatable).")] = [],  # noqa: B006
    status_: Annotated[list[lifecycle.JobStatus], Query(alias="status")] = [],  # noqa: B006
    label: Annotated[
        list[str],
        Query(
            description="key=value; every given label must match",
            json_schema_extra={"items": {"type": "string", "pattern": "^[^=]+="}},  # checked below
        ),
    ] = [],  # noqa: B006
    cursor: str | None = Query(default=None, max_length=512, pattern=CURSOR_PATTERN, description=CURSOR_DESCRIPTION),
    limit: int = Query(default=50, ge=1, le=500),
) -> JobPage:
    """Jobs of the projects the caller holds a role in, newest first."""
    labels: dict[str, str] = {}
    visible = principal.projects(Role.viewer)
    projects = visible if not project else [p for p in project if visible is None or p in visible]
    for item in label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ApiError(422, f"label filter {item!r} must look like key=value", field="label")
        labels[key] = value
    try:
        items, next_cursor = models.jobs.page(
            session,
            statuses=[s.value for s in status_],
            labels=labels,
            cursor=cursor,
            limit=limit,
            projects=projects,
        )
    except ValueError as exc:
        raise ApiError(422, str(exc), field="cursor") from exc
    return JobPage(items=[JobOut.model_validate(j) for j in items], next_cursor=next_cursor)


@router.get("/{job_id}", response_model=JobDetail, responses=responses(404))
def get_job(job_id: str, session: SessionDep, _: JobViewerDep) -> JobDetail:
    liveness_writer.flush()
    job = load_job(session, job_id)
    recent = models.events.newest(session, job.id, RECENT_EVENTS)
    return JobDetail.model_validate(
        {
            **JobOut.model_validate(job).model_dump(),
            "attempts": [AttemptOut.model_validate(a) for a in models.jobs.attempts(session, job.id)],
            "recent_events": [EventOut.model_validate(e) for e in recent],
            "progress": progress.progress_of(session, job),
        }
    )


@router.post("/{job_id}/cancel", response_model=JobOut, status_code=status.HTTP_202_ACCEPTED, responses=responses(404))
def cancel_job(job_id: str, session: SessionDep, background: BackgroundTasks, _: JobOperatorDep) -> JobOut:
    """Ask for the job to end. A PENDING job is cancelled at once; a launched one once torn down."""
    job = load_job(session, job_id, for_update=True)
    if job_service.request_cancel(session, job):
        background.add_task(queue.send, queue.CANCEL_JOB, job.id)
    session.commit()
    return JobOut.model_validate(job)


@router.post(
    "/{job_id}/faults", response_model=FaultOut, status_code=status.HTTP_202_ACCEPTED, responses=responses(404, 409)
)
def inject_fault(job_id: str, fault: FaultIn, session: SessionDep, _: JobOperatorDep, audit: AuditDep) -> FaultOut:
    """Inject a fault into a running job (recorded as fault_injected when it fires). It reaches the node agent of
    the rank's node with the reply to its next report (within one report interval).

    The rank must be one of the job's (below nodes x procs_per_node): another is refused with 422 naming it.
    """
    job = load_job(session, job_id)
    if job.status not in (
        lifecycle.JobStatus.RUNNING,
        lifecycle.JobStatus.RECOVERING,
        lifecycle.JobStatus.SUBMITTED,
    ):
        raise ApiError(409, f"job is {job.status}; faults can only be injected into a running job", field="job_id")
    world = lifecycle.spec_of(job).world_size
    if fault.rank >= world:
        raise ApiError(422, f"rank {fault.rank} is outside the job's {world} ranks", field="rank")
    out = job_service.request_fault(session, job, fault)
    if audit is not None:
        audit.about(kind=fault.kind, rank=fault.rank, fault_id=out.id)
    session.commit()
    caches.forget_job(job.id)  # the node's next report hands it over
    return out
