"""Duty: tear down the jobs whose cancellation was asked for, then mark them CANCELLED.

The teardown is asked for, not waited on: a job is marked CANCELLED by the first pass (or the cancel
task) that finds nothing of its attempt running any more; until then it stays as it was, cancel requested.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from api import models
from api.database.tables import Job
from api.schemas.causes import Cause, CauseClass
from api.services import lifecycle
from workers import backends
from workers.supervision.batch import for_each_job

CANCELLED_BY_REQUEST = Cause(CauseClass.cancelled, "cancelled by request")


def run_once(session: Session) -> int:
    return for_each_job(session, models.jobs.to_cancel(session), cancel_job, "cancel")


def cancel(session: Session, job_id: str) -> None:
    """The cancel task's fast path."""
    for_each_job(session, [job_id], cancel_job, "cancel")


def cancel_job(session: Session, job: Job) -> None:
    if not job.cancel_requested or job.status not in lifecycle.ACTIVE:
        return
    if not backends.get_backend(job.backend).stop(job.id, job.attempt, lifecycle.spec_of(job)):
        return
    lifecycle.cancel(session, job, lifecycle.current_attempt(session, job), CANCELLED_BY_REQUEST)
