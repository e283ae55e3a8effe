"""Task: inject the faults a job's backend delivers itself, right after they are asked for."""

from __future__ import annotations

from typing import Any

from api.core.db import session_scope
from api.models import jobs as job_store
from api.services import lifecycle
from workers.celery_app import celery_app
from workers.supervision.faults import deliver_backend_faults


@celery_app.task(name="ftplane.inject_fault")
def inject_fault(job_id: str, fault: dict[str, Any] | None = None) -> None:
    with session_scope() as session:
        job = job_store.get(session, job_id, for_update=True)
        if job is not None and job.status not in lifecycle.TERMINAL:
            deliver_backend_faults(session, job)
