"""Duty: an attempt launched but not running within `resiliency.pending_timeout_s` is a failure.

It records `scheduling_failed` with what the attempt was waiting for (the backend's last pending
cause), and the lifecycle decides what follows (`resiliency.on_pending_timeout`: a job restart, or
FAILED). The launch duty then tears the partial attempt down (or, for a job that failed, the release
duty), freeing what it held. Database only.

Waiting in a queue is not pending: while the backend says the attempt is queued (its latest `queued`
event says `queue_state: waiting`), no pending timeout runs, and once the queue admits it the timeout counts
from the admission. `resiliency.queued_timeout_s` bounds the wait in the queue instead: an attempt queued that
long after its launch ends the job (`scheduling_failed`, reason QueuedTimeout: the ladder gives up).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from api import models
from api.database.tables import Attempt, Job
from api.schemas.causes import Cause, CauseClass
from api.schemas.events import EventIn, EventType, utcnow
from api.services import lifecycle
from api.services.ingest import reporting
from api.services.lifecycle import AttemptStatus
from workers.supervision.batch import for_each_job


def run_once(session: Session) -> int:
    jobs = models.jobs.with_current_attempt_in(session, [AttemptStatus.LAUNCHED])
    return for_each_job(session, jobs, check, "time out pending")


def check(session: Session, job: Job) -> None:
    resiliency = lifecycle.spec_of(job).resiliency
    timeout = resiliency.pending_timeout_s
    attempt = lifecycle.current_attempt(session, job)
    if attempt.status != AttemptStatus.LAUNCHED or attempt.launched_at is None:
        return
    since, what = pending_since(session, job, attempt)
    if since is None:  # queued: the queue decides when it runs, within queued_timeout_s
        if resiliency.queued_timeout_s is not None:
            _time_out_queued(session, job, attempt, resiliency.queued_timeout_s)
        return
    if timeout is None:
        return
    waited = utcnow() - since
    if waited <= timedelta(seconds=timeout):
        return
    waiting_for = attempt.cause or "the backend gave no reason"
    waited_s = waited.total_seconds()
    message = f"not running {waited_s:.0f} s after {what} (pending timeout {timeout:g} s): {waiting_for}"
    _fail_scheduling(
        session, job, attempt, Cause(CauseClass.scheduling, message, {"reason": lifecycle.PENDING_TIMEOUT})
    )


def _time_out_queued(session: Session, job: Job, attempt: Attempt, timeout: float) -> None:
    assert attempt.launched_at is not None
    waited = utcnow() - _aware(attempt.launched_at)
    if waited <= timedelta(seconds=timeout):
        return
    waiting_for = attempt.cause or "the queue gave no reason"
    message = (
        f"still queued {waited.total_seconds():.0f} s after launch (resiliency.queued_timeout_s {timeout:g} s): "
        f"{waiting_for}"
    )
    cause = Cause(CauseClass.scheduling, message, {"reason": lifecycle.QUEUED_TIMEOUT})
    _fail_scheduling(session, job, attempt, cause)


def _fail_scheduling(session: Session, job: Job, attempt: Attempt, cause: Cause) -> None:
    """`scheduling_failed` with `cause`, then the attempt's failure through the lifecycle (it decides what follows)."""
    event = EventIn(
        key=f"scheduling_failed:a{job.attempt}",
        type=EventType.scheduling_failed,
        attempt=job.attempt,
        details=cause.details(),
    )
    reporting.record_events(session, job, [event])
    lifecycle.attempt_failed(session, job, attempt, lifecycle.Failure(cause))


def pending_since(session: Session, job: Job, attempt: Attempt) -> tuple[datetime | None, str]:
    """When the attempt's pending time began (its launch, or its admission by the queue), and what that was;
    None while it waits in a queue."""
    assert attempt.launched_at is not None
    events = models.events.of_job(session, job.id, types=[EventType.queued.value])
    queued = [e for e in events if e.attempt == job.attempt]
    if not queued:
        return attempt.launched_at, "launch"
    latest = max(queued, key=lambda e: e.id)  # the newest report (times are when the reports were stored)
    if (latest.details or {}).get("queue_state") == "admitted":
        return max(_aware(latest.ts), attempt.launched_at), "admission by the queue"
    return None, "queued"


def _aware(ts: datetime) -> datetime:
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)
