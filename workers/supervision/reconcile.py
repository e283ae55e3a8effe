"""Reconcile one job with its backend: record what the backend saw, then act on the attempt's phase."""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy.orm import Session

from api.database.tables import Attempt, Job, RankLiveness
from api.models import jobs as job_store
from api.models import tokens
from api.schemas.events import EventIn, EventType, utcnow
from api.schemas.spec import JobSpec
from api.services import lifecycle, reporting
from api.services.lifecycle import JobStatus
from workers.backends import get_backend
from workers.backends.base import AttemptPhase, AttemptStatus
from workers.supervision import restarts, silent_ranks
from workers.supervision.faults import deliver_backend_faults
from workers.supervision.launching import current_attempt, launch_current_attempt

log = logging.getLogger(__name__)

# A PENDING job whose submit task has not run after this long is launched by the sweep.
SUBMIT_GRACE = timedelta(seconds=5)


def supervise_job(session: Session, job_id: str, *, force_launch: bool = False) -> None:
    """One reconciliation pass over one job, in the caller's transaction."""
    job = job_store.get(session, job_id, for_update=True)
    if job is None or JobStatus(job.status) in lifecycle.TERMINAL:
        return
    _reconcile(session, job, force_launch=force_launch)
    if JobStatus(job.status) in lifecycle.TERMINAL:
        tokens.revoke_job_tokens(session, job.id)  # the trainer flushed its reports before it exited
        session.commit()
        _release(job)


def _release(job: Job) -> None:
    """The job is over: the backend frees what outlives attempts (e.g. the token Secret)."""
    try:
        get_backend(job.backend).delete_job_resources(job.id, lifecycle.spec_of(job))
    except Exception:  # leftovers are an operator's clean-up, not a reason to fail supervision
        log.warning("could not release the backend resources of job %s", job.id, exc_info=True)


def _reconcile(session: Session, job: Job, *, force_launch: bool) -> None:
    if job.status == JobStatus.PENDING:
        if force_launch or job.created_at < utcnow() - SUBMIT_GRACE:
            launch_current_attempt(session, job)
        return
    attempt = current_attempt(session, job)
    spec = lifecycle.spec_of(job)
    if job.cancel_requested:
        cancel(session, job, attempt, spec)
        return
    if attempt.launched_at is None:  # a restart decided but not yet launched (crash in between)
        launch_current_attempt(session, job)
        return
    status = get_backend(job.backend).status(job.id, job.attempt, spec)
    _record_observations(session, job, attempt, status)
    if status.phase == AttemptPhase.succeeded:
        _finish(attempt, "SUCCEEDED", None)
        lifecycle.transition(session, job, JobStatus.SUCCEEDED, cause="all ranks finished")
    elif status.phase in (AttemptPhase.failed, AttemptPhase.missing):
        cause = status.cause or ("the launcher is gone" if status.phase == AttemptPhase.missing else "failed")
        restarts.restart_or_fail(session, job, attempt, spec, cause, status.failed_nodes)
    elif status.phase == AttemptPhase.running:
        _watch_running(session, job, attempt, spec)


def cancel(session: Session, job: Job, attempt: Attempt, spec: JobSpec) -> None:
    get_backend(job.backend).cancel(job.id, job.attempt, spec)
    _finish(attempt, "CANCELLED", "cancelled by request")
    lifecycle.transition(session, job, JobStatus.CANCELLED, cause="cancelled by request")


def _finish(attempt: Attempt, status: str, cause: str | None) -> None:
    attempt.status = status
    attempt.cause = cause
    attempt.finished_at = utcnow()


def _record_observations(session: Session, job: Job, attempt: Attempt, status: AttemptStatus) -> None:
    events = []
    for seen in status.events:
        step = None
        if seen.type == EventType.rank_failed and seen.rank is not None:
            step = _last_step(session, job, seen.rank)
        events.append(
            EventIn(
                key=seen.key,
                type=EventType(seen.type),
                attempt=job.attempt,
                rank=seen.rank,
                node=seen.node,
                step=step,
                details=seen.details,
            )
        )
    if status.phase == AttemptPhase.running and attempt.started_at is None:
        attempt.started_at = utcnow()
        attempt.status = "RUNNING"
    restarts_seen = status.in_job_restarts
    for n in range(attempt.in_job_restarts + 1, restarts_seen + 1):
        failed_step = restarts.note_failure(session, job, attempt)
        known = status.restart_causes[n - 1] if n <= len(status.restart_causes) else None
        events.append(
            EventIn(
                # The trainer reports the same restart under the same key: it is stored once.
                key=f"injob_restart:{job.id}:{job.attempt}:{n}",
                type=EventType.injob_restart,
                attempt=job.attempt,
                step=failed_step,
                details={
                    "restart_count": n,
                    "cause": known or status.cause or "worker group failed",
                    "failed_step": failed_step,
                    "source": "launcher",
                },
            )
        )
    attempt.in_job_restarts = max(attempt.in_job_restarts, restarts_seen)
    reporting.record_events(session, job, events)


def _last_step(session: Session, job: Job, rank: int) -> int | None:
    row = session.get(RankLiveness, (job.id, rank))  # one row, not every rank of a 16k-rank job
    return row.step if row is not None and row.attempt == job.attempt else None


def _watch_running(session: Session, job: Job, attempt: Attempt, spec: JobSpec) -> None:
    deliver_backend_faults(session, job)
    restarts.highest_step(session, job, attempt)
    stuck = restarts.stuck_cause(job)
    if stuck:
        restarts.fail(session, job, attempt, stuck, spec)
        return
    silence = silent_ranks.detect(session, job, attempt, spec)
    if silence and silence.escalate:
        restarts.restart_or_fail(session, job, attempt, spec, f"hang not recovered in-job: {silence.cause}", ())
