"""Duty: an attempt launched but not running within `resiliency.pending_timeout_s` is a failure.

It records `scheduling_failed` with what the attempt was waiting for (the backend's last pending
cause), and the lifecycle decides the next rung (a job restart, or FAILED). The launch duty then
tears the partial attempt down, freeing what it held. Database only.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.orm import Session

from api.core import queue
from api.database.tables import Job
from api.models import jobs as job_store
from api.schemas.causes import Cause, CauseClass
from api.schemas.events import EventIn, EventType, utcnow
from api.services import lifecycle, notifications, reporting
from api.services.lifecycle import AttemptStatus
from workers.supervision.batch import for_each_job


def run_once(session: Session) -> int:
    jobs = job_store.with_current_attempt_in(session, [AttemptStatus.LAUNCHED])
    return for_each_job(session, jobs, check, "time out pending")


def check(session: Session, job: Job) -> None:
    timeout = lifecycle.spec_of(job).resiliency.pending_timeout_s
    attempt = lifecycle.current_attempt(session, job)
    if timeout is None or attempt.status != AttemptStatus.LAUNCHED or attempt.launched_at is None:
        return
    waited = utcnow() - attempt.launched_at
    if waited <= timedelta(seconds=timeout):
        return
    waiting_for = attempt.cause or "the backend gave no reason"
    cause = Cause(
        CauseClass.scheduling,
        f"not running {waited.total_seconds():.0f} s after launch (pending timeout {timeout:g} s): {waiting_for}",
        {"reason": waiting_for},
    )
    event = EventIn(
        key=f"scheduling_failed:a{job.attempt}",
        type=EventType.scheduling_failed,
        attempt=job.attempt,
        details=cause.details(),
    )
    reporting.record_events(session, job, [event])
    decision = lifecycle.attempt_failed(session, job, attempt, lifecycle.Failure(cause))
    if not decision.gives_up:
        notifications.after_commit(session, lambda: queue.send(queue.SUBMIT_JOB, job.id))
