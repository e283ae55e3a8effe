"""Launch a job's current attempt, once, through its backend."""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy.orm import Session

from api.core.config import get_settings
from api.database.tables import Attempt, Job
from api.models import jobs as job_store
from api.models import tokens
from api.schemas.events import EventIn, EventType, utcnow
from api.services import lifecycle, reporting
from api.services.lifecycle import JobStatus
from workers.backends import UnknownBackend, get_backend
from workers.backends.base import LaunchRequest

log = logging.getLogger(__name__)

# How long a launch that fails with a retryable backend error is tried again before the job fails.
LAUNCH_RETRY_WINDOW = timedelta(minutes=15)


def current_attempt(session: Session, job: Job) -> Attempt:
    row = job_store.attempt_row(session, job.id, job.attempt)
    if row is None:  # created with the job and with every restart; absent only after manual surgery
        row = Attempt(job_id=job.id, number=job.attempt, status="PENDING", created_at=utcnow())
        session.add(row)
        session.flush()
    return row


def launch_current_attempt(session: Session, job: Job) -> None:
    """Idempotent: an attempt already launched is left alone; a launch redone after a crash is a no-op."""
    attempt = current_attempt(session, job)
    if attempt.launched_at is not None or JobStatus(job.status) in lifecycle.TERMINAL:
        return
    spec = lifecycle.spec_of(job)
    try:
        backend = get_backend(job.backend)
    except UnknownBackend as exc:
        fail_launch(session, job, attempt, str(exc))
        return
    # The token is committed before the launch, so a process started by a launch whose
    # bookkeeping is lost to a crash still holds a valid token.
    _, token = tokens.create_trainer(session, job.id, name=f"trainer:{job.name}:a{job.attempt}")
    session.commit()
    request = LaunchRequest(
        job_id=job.id,
        attempt=job.attempt,
        spec=spec,
        token=token,
        control_plane_url=get_settings().resolved_public_url,
        excluded_nodes=tuple(job.excluded_nodes),
    )
    try:
        backend.launch(request)
    except Exception as exc:
        cause = f"launch failed: {type(exc).__name__}: {exc}"
        if getattr(exc, "retryable", False) and utcnow() - attempt.created_at < LAUNCH_RETRY_WINDOW:
            # A transient backend outage (API 5xx, timeouts): the next supervision pass launches again.
            log.warning("job %s attempt %s: %s; retrying on the next pass", job.id, job.attempt, cause)
            attempt.cause = cause
            session.commit()
            return
        log.exception("launch of job %s attempt %s failed", job.id, job.attempt)
        fail_launch(session, job, attempt, cause)
        return
    now = utcnow()
    attempt.launched_at = now
    attempt.status = "LAUNCHED"
    reporting.record_events(
        session,
        job,
        [
            EventIn(
                key=f"submitted:a{job.attempt}",
                type=EventType.submitted,
                ts=now,
                attempt=job.attempt,
                details={"backend": job.backend, "excluded_nodes": list(job.excluded_nodes)},
            )
        ],
    )
    if job.status == JobStatus.PENDING:
        lifecycle.transition(session, job, JobStatus.SUBMITTED)
    session.commit()


def fail_launch(session: Session, job: Job, attempt: Attempt, cause: str) -> None:
    attempt.status = "FAILED"
    attempt.cause = cause
    attempt.finished_at = utcnow()
    lifecycle.transition(session, job, JobStatus.FAILED, cause=cause)
    session.commit()
