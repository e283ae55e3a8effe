"""Task (beat): one supervision pass over every job that is not finished."""

from __future__ import annotations

import logging

from api.core.db import session_scope
from api.models import jobs as job_store
from api.services.lifecycle import ACTIVE, JobStatus
from workers.celery_app import celery_app
from workers.supervision.reconcile import supervise_job

log = logging.getLogger(__name__)


@celery_app.task(name="ftplane.supervise_jobs")
def supervise_jobs() -> int:
    with session_scope() as session:
        job_ids = [j.id for j in job_store.active(session, [s.value for s in ACTIVE | {JobStatus.PENDING}])]
    for job_id in job_ids:
        try:
            with session_scope() as session:
                supervise_job(session, job_id)
        except Exception:  # one broken job must not stop the others from being supervised
            log.exception("supervision of job %s failed; retrying next pass", job_id)
    return len(job_ids)
