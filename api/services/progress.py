"""How far a job has got, how fast, when it will be done, and at which level its hangs can be detected."""

from __future__ import annotations

from typing import Literal

from sqlalchemy.orm import Session

from api import models
from api.database.tables import Job
from api.schemas.jobs import JobProgress
from api.schemas.spec import JobSpec
from api.services import lifecycle


def reports_rank_progress(session: Session, job: Job, spec: JobSpec) -> bool:
    """Whether the job's ranks say how far they got (through the SDK, or a log pattern). Without it, hang
    detection is node-level only: a rank process that lives is not hung as far as ftplane can tell."""
    if spec.progress.log_pattern or spec.progress.preset or models.liveness.has_attempt(session, job.id, job.attempt):
        return True
    return models.nodes.any_with_progress(session, job.id, job.attempt, "sdk")


def progress_of(session: Session, job: Job) -> JobProgress:
    spec = lifecycle.spec_of(job)
    level: Literal["rank", "node"] = "rank" if reports_rank_progress(session, job, spec) else "node"
    step = models.liveness.max_step(session, job.id, job.attempt)
    step_time = models.liveness.median_step_time(session, job.id, job.attempt)
    total = job.total_steps
    fraction = min(1.0, step / total) if step is not None and total else None
    eta = None
    if step is not None and total and step_time and job.status in lifecycle.ACTIVE:
        eta = max(0, total - step) * step_time
    return JobProgress(
        hang_detection=level, step=step, total_steps=total, fraction=fraction, step_time_s=step_time, eta_s=eta
    )
