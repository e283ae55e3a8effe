"""Task: launch a newly accepted job (PENDING → SUBMITTED)."""

from __future__ import annotations

from api.core.db import session_scope
from workers.celery_app import celery_app
from workers.supervision.reconcile import supervise_job


@celery_app.task(name="ftplane.submit_job")
def submit_job(job_id: str) -> None:
    with session_scope() as session:
        supervise_job(session, job_id, force_launch=True)
