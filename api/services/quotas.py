"""Per-project GPU limits: a job is admitted to launch only while its project's admitted jobs, with it, hold
at most the project's `gpu_limit` GPUs (resources.gpus_per_node x nodes each).

A job admitted once counts against the limit until it ends, restarts included (its attempts replace one
another, never run side by side). A job over the limit stays PENDING: the launch duty records why in a
`queued` event (`queue_state: waiting`, as a Kueue queue's wait is told), retries on each pass, and records
`queue_state: admitted` when it goes. The check and the admission hold the project's row locked, so two
launches at once cannot both take the last GPUs. On Kubernetes with Kueue, the cluster's own quota still
applies after this one.
"""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from api import models
from api.database.tables import Job
from api.schemas.causes import Cause, CauseClass
from api.schemas.events import utcnow
from api.schemas.status import JobStatus
from api.services import lifecycle

HOLDING = [JobStatus.SUBMITTED.value, JobStatus.RUNNING.value, JobStatus.RECOVERING.value]


def gpus_of(job: Job) -> int:
    spec = lifecycle.spec_of(job)
    return spec.resources.gpus_per_node * spec.nodes


def gpus_held(session: Session, project: str, *, besides: str) -> int:
    """GPUs of the project's jobs that are admitted and not ended (other than `besides`)."""
    query = select(Job).where(
        Job.project == project,
        Job.id != besides,
        or_(Job.status.in_(HOLDING), (Job.status == JobStatus.PENDING.value) & Job.admitted_at.is_not(None)),
    )
    return sum(gpus_of(job) for job in session.scalars(query))


def admit(session: Session, job: Job) -> Cause | None:
    """Admit the job to launch (None), or say why it waits. Call before launching; the caller commits.

    A job that plainly does not fit waits without locking anything (it is looked at again every pass); one that
    seems to fit is counted again under the project's lock before it is admitted."""
    if job.admitted_at is not None:
        return None
    needed = gpus_of(job)
    project = models.projects.get(session, job.project)
    if project is not None and project.gpu_limit is not None and needed > 0:
        waiting = _over_limit(session, job, project.gpu_limit, needed)
        if waiting is not None:
            return waiting
        project = models.projects.lock(session, job.project)
        if project is not None and project.gpu_limit is not None:
            waiting = _over_limit(session, job, project.gpu_limit, needed)
            if waiting is not None:
                return waiting
    job.admitted_at = utcnow()
    return None


def _over_limit(session: Session, job: Job, limit: int, needed: int) -> Cause | None:
    held = gpus_held(session, job.project, besides=job.id)
    if held + needed <= limit:
        return None
    return Cause(
        CauseClass.scheduling,
        f"project {job.project!r} is at its GPU limit: {held} of {limit} GPUs held by its running jobs, this job "
        f"needs {needed}; it launches when enough of them end (or the limit rises)",
        {"queue": f"project:{job.project}", "gpus_held": held, "gpu_limit": limit, "gpus": needed},
    )
