"""Duty: restart anomalies of the job as a whole: a restart storm, progress that stalls across restarts,
a recovery that never finishes (api/services/anomalies.py says each, and what makes an episode).

Database only (the job's events and its watch). It watches jobs that are submitted, running or
recovering, and only announces: what a restart leads to stays the lifecycle's (which gives up on
restarts that never get past a step, `no_progress`, on its own). Each anomaly is an event, so its
webhook goes to the subscriptions that ask for its type.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from api import models
from api.database.tables import Job
from api.services import anomalies, lifecycle
from api.services.ingest import reporting
from api.services.lifecycle import AttemptStatus
from workers.supervision.batch import for_each_job


def run_once(session: Session, now: datetime | None = None) -> int:
    # active jobs not being cancelled, whatever their current attempt is doing (a stuck recovery is pending)
    active = models.jobs.with_current_attempt_in(session, [s.value for s in AttemptStatus])
    return for_each_job(session, active, lambda s, job: check(s, job, now), "detect restart anomalies")


def check(session: Session, job: Job, now: datetime | None = None) -> None:
    cfg = lifecycle.spec_of(job).resiliency.anomalies
    if cfg.enabled and job.status in lifecycle.ACTIVE:
        reporting.record_events(session, job, anomalies.watch(session, job, cfg, now))
