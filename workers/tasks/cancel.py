"""Task: tear down a job whose cancellation was requested."""

from __future__ import annotations

from api.core.db import session_scope
from workers.celery_app import celery_app
from workers.supervision.reconcile import supervise_job


@celery_app.task(name="ftplane.cancel_job")
def cancel_job(job_id: str) -> None:
    # Supervision already handles `cancel_requested`; running it now just saves waiting for the beat.
    with session_scope() as session:
        supervise_job(session, job_id)
