"""Tasks the API sends for one job, right after a request: each runs one duty's step for that job now
instead of waiting for the duty's next pass (which would do the same if the task were lost)."""

from __future__ import annotations

from api.core import queue
from api.core.db import session_scope
from workers.celery_app import celery_app
from workers.supervision import cancel_jobs, launch_attempts


@celery_app.task(name=queue.SUBMIT_JOB)
def submit_job(job_id: str) -> None:
    """Launch the job's current attempt: a new job's first, or the next one after a job restart."""
    with session_scope() as session:
        launch_attempts.launch(session, job_id)


@celery_app.task(name=queue.CANCEL_JOB)
def cancel_job(job_id: str) -> None:
    with session_scope() as session:
        cancel_jobs.cancel(session, job_id)
