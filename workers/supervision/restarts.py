"""Decide what a failed attempt leads to: a job-level restart (new attempt) or FAILED with the cause."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import flag_modified

from api.database.tables import Attempt, Job
from api.models import liveness
from api.schemas.events import EventIn, EventType, utcnow
from api.schemas.spec import JobSpec
from api.services import lifecycle, reporting
from api.services.lifecycle import JobStatus
from workers.backends import get_backend
from workers.supervision.launching import launch_current_attempt

log = logging.getLogger(__name__)


def highest_step(session: Session, job: Job, attempt: Attempt) -> int:
    """The highest step the job has reached so far, over every attempt."""
    seen = liveness.max_step(session, job.id, job.attempt)
    if seen is not None and (attempt.max_step is None or seen > attempt.max_step):
        attempt.max_step = seen
    previous = max((s for s in job.failure_steps if isinstance(s, int)), default=0)
    return max(previous, attempt.max_step or 0)


def note_failure(session: Session, job: Job, attempt: Attempt) -> int:
    step = highest_step(session, job, attempt)
    job.failure_steps = [*job.failure_steps, step]
    flag_modified(job, "failure_steps")
    return step


def stuck_cause(job: Job) -> str | None:
    if lifecycle.is_stuck([int(s) for s in job.failure_steps]):
        n = lifecycle.NO_PROGRESS_FAILURES
        return f"no progress: the last {n} failures never got past step {job.failure_steps[-n]}"
    return None


def fail(session: Session, job: Job, attempt: Attempt, cause: str, spec: JobSpec) -> None:
    """Give up: tear down what is left of the attempt and end FAILED with the cause."""
    try:
        get_backend(job.backend).cancel(job.id, job.attempt, spec)
    except Exception:
        log.warning("tear-down of job %s attempt %s failed; giving up anyway", job.id, job.attempt, exc_info=True)
    attempt.status = "FAILED"
    attempt.cause = cause
    attempt.finished_at = utcnow()
    lifecycle.transition(session, job, JobStatus.FAILED, cause=cause)


def restart_or_fail(
    session: Session, job: Job, attempt: Attempt, spec: JobSpec, cause: str, failed_nodes: tuple[str, ...]
) -> None:
    """The attempt is over without success: climb to the job-restart rung, or give up."""
    failed_step = note_failure(session, job, attempt)
    new_nodes = [n for n in failed_nodes if n and n not in job.excluded_nodes]
    will_move = bool(new_nodes) and spec.resiliency.exclude_failed_nodes
    stuck = None if will_move else stuck_cause(job)  # other hardware is a new condition, not a loop
    if stuck:
        fail(session, job, attempt, f"{stuck} (last cause: {cause})", spec)
        return
    budget = spec.resiliency.max_job_restarts
    if job.job_restarts >= budget:
        fail(session, job, attempt, f"{cause}; job restart budget ({budget}) spent", spec)
        return
    get_backend(job.backend).cancel(job.id, job.attempt, spec)
    attempt.status = "FAILED"
    attempt.cause = cause
    attempt.finished_at = utcnow()

    new_attempt = job.attempt + 1
    events: list[EventIn] = []
    if will_move:
        for node in new_nodes:
            if node not in job.excluded_nodes:
                job.excluded_nodes = [*job.excluded_nodes, node]
                flag_modified(job, "excluded_nodes")
                events.append(
                    EventIn(
                        key=f"node_excluded:{node}",
                        type=EventType.node_excluded,
                        attempt=new_attempt,
                        node=node,
                        details={"cause": cause, "from_attempt": job.attempt},
                    )
                )
    events.append(
        EventIn(
            key=f"job_restart:a{new_attempt}",
            type=EventType.job_restart,
            attempt=new_attempt,
            step=failed_step,
            details={
                "cause": cause,
                "from_attempt": job.attempt,
                "failed_step": failed_step,
                "restart": job.job_restarts + 1,
                "budget": budget,
            },
        )
    )
    job.attempt = new_attempt
    job.job_restarts += 1
    session.add(Attempt(job_id=job.id, number=new_attempt, status="PENDING", created_at=utcnow()))
    reporting.record_events(session, job, events)
    if job.status in (JobStatus.RUNNING, JobStatus.SUBMITTED):
        lifecycle.transition(session, job, JobStatus.RECOVERING)
    job.status_reason = cause
    session.commit()
    launch_current_attempt(session, job)
