"""The job lifecycle: every status transition and the recovery ladder live here.

    PENDING → SUBMITTED → RUNNING ⇄ RECOVERING → SUCCEEDED | FAILED | CANCELLED

Nothing else assigns `job.status`; routes, the ingest path and the supervisor
ask this module. The recovery ladder is data: each rung, the event that marks
it, and where its budget comes from in the spec.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy.orm import Session

from api.database.tables import Job
from api.models import events as event_store
from api.schemas.events import EventIn, EventType, utcnow
from api.schemas.spec import JobSpec
from api.services import notifications


class JobStatus(StrEnum):
    PENDING = "PENDING"
    SUBMITTED = "SUBMITTED"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
ACTIVE = frozenset({JobStatus.SUBMITTED, JobStatus.RUNNING, JobStatus.RECOVERING})

ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.PENDING: frozenset({JobStatus.SUBMITTED, JobStatus.FAILED, JobStatus.CANCELLED}),
    JobStatus.SUBMITTED: frozenset({JobStatus.RUNNING, JobStatus.RECOVERING} | TERMINAL),
    JobStatus.RUNNING: frozenset({JobStatus.RECOVERING} | TERMINAL),
    JobStatus.RECOVERING: frozenset({JobStatus.RUNNING} | TERMINAL),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}

TERMINAL_EVENT = {
    JobStatus.SUCCEEDED: EventType.succeeded,
    JobStatus.FAILED: EventType.failed,
    JobStatus.CANCELLED: EventType.cancelled,
}

# Failures in a row that do not get past the step of the first of them: the job is stuck.
NO_PROGRESS_FAILURES = 3


class InvalidTransition(Exception):
    pass


@dataclass(frozen=True)
class Rung:
    """One rung of the recovery ladder: cheapest first."""

    name: str
    event: EventType
    budget: Callable[[JobSpec], int]


LADDER: tuple[Rung, ...] = (
    Rung(
        "in-process restart",
        EventType.inprocess_restart,
        lambda s: s.resiliency.inprocess.max_iterations if s.resiliency.inprocess.enabled else 0,
    ),
    Rung("in-job restart", EventType.injob_restart, lambda s: s.resiliency.max_in_job_restarts),
    Rung("job restart", EventType.job_restart, lambda s: s.resiliency.max_job_restarts),
)

# Events that show the job is recovering (the ranks are not all training).
RECOVERY_EVENTS = frozenset(
    {
        EventType.rank_failed,
        EventType.node_failed,
        EventType.hang_detected,
        EventType.heartbeat_lost,
        EventType.inprocess_restart,
        EventType.injob_restart,
        EventType.job_restart,
    }
)


def spec_of(job: Job) -> JobSpec:
    return JobSpec.model_validate(job.spec)


def transition(
    session: Session,
    job: Job,
    to: JobStatus,
    *,
    cause: str | None = None,
    details: dict[str, Any] | None = None,
) -> bool:
    """Move `job` to `to`, recording the terminal event where there is one. False when already there."""
    current = JobStatus(job.status)
    if current == to:
        return False
    if to not in ALLOWED[current]:
        raise InvalidTransition(f"job {job.id}: {current} → {to} is not allowed")
    now = utcnow()
    job.status = to
    job.updated_at = now
    if cause is not None:
        job.status_reason = cause
    if to == JobStatus.RUNNING and job.started_at is None:
        job.started_at = now
    if to in TERMINAL:
        job.finished_at = now
        body = {"cause": cause} if cause else {}
        body.update(details or {})
        stored = event_store.record(
            session,
            job,
            EventIn(key=f"lifecycle:{to.value.lower()}", type=TERMINAL_EVENT[to], ts=now, details=body),
        )
        if stored is not None:  # the job's end is announced like any other new event (webhooks, metrics)
            notifications.events_stored(session, job, [stored])
    return True


def apply_reported_event(session: Session, job: Job, event: EventIn) -> None:
    """What a newly stored event means for the job's status (late events of old attempts mean nothing)."""
    if JobStatus(job.status) in TERMINAL or (event.attempt is not None and event.attempt != job.attempt):
        return
    if (event.type in RECOVERY_EVENTS or event.type == EventType.running) and job.status == JobStatus.PENDING:
        # The trainer already reports while the launch's own bookkeeping is still being committed.
        transition(session, job, JobStatus.SUBMITTED)
    if event.type == EventType.running:
        transition(session, job, JobStatus.RUNNING)
    elif event.type in RECOVERY_EVENTS and JobStatus(job.status) in (JobStatus.RUNNING, JobStatus.SUBMITTED):
        transition(session, job, JobStatus.RECOVERING, cause=event.details.get("cause") or event.type.value)


def is_stuck(failure_steps: list[int]) -> bool:
    """True when the last NO_PROGRESS_FAILURES failures never got past the step of the first of them."""
    if len(failure_steps) < NO_PROGRESS_FAILURES:
        return False
    window = failure_steps[-NO_PROGRESS_FAILURES:]
    return max(window[1:]) <= window[0]


def job_restart_budget_left(job: Job, spec: JobSpec) -> int:
    return spec.resiliency.max_job_restarts - job.job_restarts
