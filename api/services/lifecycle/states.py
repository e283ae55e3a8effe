"""Job and attempt statuses: what each may become, and the moves that make them so.

    job:      PENDING → SUBMITTED → RUNNING ⇄ RECOVERING → SUCCEEDED | FAILED | CANCELLED
    attempt:  PENDING → LAUNCHED → RUNNING → SUCCEEDED | FAILED | CANCELLED

Nothing else assigns `job.status` or `attempt.status`. A job's end is recorded as its terminal event.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from api import models
from api.database.tables import Attempt, Event, Job
from api.schemas.causes import Cause, CauseClass
from api.schemas.events import MAX_EVENTS_PER_BATCH, EventIn, EventType, utcnow
from api.schemas.status import AttemptStatus, JobStatus
from api.services import notifications

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

ATTEMPT_ENDED = frozenset({AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.CANCELLED})

ATTEMPT_ALLOWED: dict[AttemptStatus, frozenset[AttemptStatus]] = {
    AttemptStatus.PENDING: frozenset({AttemptStatus.LAUNCHED, AttemptStatus.FAILED, AttemptStatus.CANCELLED}),
    AttemptStatus.LAUNCHED: frozenset({AttemptStatus.RUNNING} | ATTEMPT_ENDED),
    AttemptStatus.RUNNING: ATTEMPT_ENDED,
    AttemptStatus.SUCCEEDED: frozenset(),
    AttemptStatus.FAILED: frozenset(),
    AttemptStatus.CANCELLED: frozenset(),
}

TERMINAL_EVENT = {
    JobStatus.SUCCEEDED: EventType.succeeded,
    JobStatus.FAILED: EventType.failed,
    JobStatus.CANCELLED: EventType.cancelled,
}


class InvalidTransition(Exception):
    pass


# ---- job transitions ----------------------------------------------------------------------------------


def transition(
    session: Session,
    job: Job,
    to: JobStatus,
    cause: Cause | None = None,
    *,
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
        job.status_reason = cause.message
    if to == JobStatus.RUNNING and job.started_at is None:
        job.started_at = now
    if to in TERMINAL:
        job.finished_at = now
        body = cause.details() if cause is not None else {}
        body.update(details or {})
        # the job's end is announced like any other new event (webhooks, metrics)
        record(
            session, job, [EventIn(key=f"lifecycle:{to.value.lower()}", type=TERMINAL_EVENT[to], ts=now, details=body)]
        )
    return True


def record(session: Session, job: Job, events: list[EventIn]) -> list[Event]:
    """Store the lifecycle's own events (idempotent by key) and announce the new ones."""
    stored: list[Event] = []
    for start in range(0, len(events), MAX_EVENTS_PER_BATCH):
        new = models.events.store(session, job, events[start : start + MAX_EVENTS_PER_BATCH])
        notifications.events_stored(session, job, new)
        stored.extend(new)
    return stored


# ---- attempt transitions --------------------------------------------------------------------------------


def _move_attempt(attempt: Attempt, to: AttemptStatus) -> None:
    current = AttemptStatus(attempt.status)
    if current != to and to not in ATTEMPT_ALLOWED[current]:
        raise InvalidTransition(f"attempt {attempt.job_id}/{attempt.number}: {current} → {to} is not allowed")
    attempt.status = to


def current_attempt(session: Session, job: Job) -> Attempt:
    row = models.jobs.attempt_row(session, job.id, job.attempt)
    if row is None:  # created with the job and with every restart; absent only after manual surgery
        row = Attempt(job_id=job.id, number=job.attempt, status=AttemptStatus.PENDING, created_at=utcnow())
        session.add(row)
        session.flush()
    return row


def attempt_launched(session: Session, job: Job, attempt: Attempt, *, note: str | None = None) -> None:
    """The backend accepted the attempt: record `submitted` (with `note`, what the backend could not do as asked);
    the job is SUBMITTED if it was PENDING."""
    now = utcnow()
    _move_attempt(attempt, AttemptStatus.LAUNCHED)
    attempt.launched_at = now
    details: dict[str, Any] = {"backend": job.backend, "excluded_nodes": list(job.excluded_nodes)}
    if note:
        details["note"] = note
    event = EventIn(
        key=f"submitted:a{job.attempt}", type=EventType.submitted, ts=now, attempt=job.attempt, details=details
    )
    record(session, job, [event])
    if job.status == JobStatus.PENDING:
        transition(session, job, JobStatus.SUBMITTED)


def launch_deferred(attempt: Attempt, cause: Cause) -> None:
    """A launch failed in a way worth retrying: the attempt stays PENDING and says why."""
    attempt.cause = cause.message


def launch_waits(session: Session, job: Job, attempt: Attempt, cause: Cause) -> None:
    """The attempt may not launch yet (its project's GPU limit): it stays PENDING, and a `queued` event (once per
    attempt) says why."""
    attempt.cause = cause.message
    details = {**cause.details(), "queue_state": "waiting"}
    key = f"queued:project:a{job.attempt}"
    record(session, job, [EventIn(key=key, type=EventType.queued, attempt=job.attempt, details=details)])


def launch_admitted(session: Session, job: Job, attempt: Attempt) -> None:
    """An attempt that waited for its project's GPU limit may launch now: its wait ends (`queue_state: admitted`)."""
    waited = f"queued:project:a{job.attempt}"
    if waited in models.events.keys_of_type(session, job.id, job.attempt, EventType.queued.value):
        attempt.cause = None
        details = {"queue": f"project:{job.project}", "queue_state": "admitted"}
        event = EventIn(key=f"{waited}:admitted", type=EventType.queued, attempt=job.attempt, details=details)
        record(session, job, [event])


def attempt_running(attempt: Attempt, at: datetime | None = None) -> None:
    if AttemptStatus(attempt.status) in ATTEMPT_ENDED or attempt.started_at is not None:
        return
    attempt.started_at = at or utcnow()
    _move_attempt(attempt, AttemptStatus.RUNNING)


def new_attempt(session: Session, job: Job) -> None:
    """The job moves on to its next attempt, PENDING until the launch duty launches it."""
    job.attempt += 1
    session.add(Attempt(job_id=job.id, number=job.attempt, status=AttemptStatus.PENDING, created_at=utcnow()))


def finish_attempt(attempt: Attempt, status: AttemptStatus, cause: Cause | None = None) -> None:
    if status not in ATTEMPT_ENDED:
        raise InvalidTransition(f"{status} does not end an attempt")
    if AttemptStatus(attempt.status) in ATTEMPT_ENDED:
        return
    _move_attempt(attempt, status)
    attempt.cause = cause.message if cause is not None else None
    attempt.finished_at = utcnow()


def succeed(session: Session, job: Job, attempt: Attempt) -> None:
    """The job is done; its `succeeded` event says the highest step its ranks reported (`final_step`: goodput's
    steps after the last checkpoint), in their heartbeats or, for a run that ended before its first step (a
    heartbeat comes with a step), in their `running`."""
    finish_attempt(attempt, AttemptStatus.SUCCEEDED)
    reported = (
        models.liveness.max_step(session, job.id, job.attempt),
        models.events.max_step(session, job.id, job.attempt, EventType.running.value),
    )
    final = max((step for step in reported if step is not None), default=None)
    details = {"final_step": final} if final is not None else None
    transition(session, job, JobStatus.SUCCEEDED, Cause(CauseClass.other, "all ranks finished"), details=details)


def cancel(session: Session, job: Job, attempt: Attempt | None, cause: Cause) -> None:
    if attempt is not None:
        finish_attempt(attempt, AttemptStatus.CANCELLED, cause)
    transition(session, job, JobStatus.CANCELLED, cause)


def fail(session: Session, job: Job, attempt: Attempt, cause: Cause) -> None:
    """Give up: the attempt and the job end FAILED with the cause (the release duty tears down what is left)."""
    finish_attempt(attempt, AttemptStatus.FAILED, cause)
    transition(session, job, JobStatus.FAILED, cause)
