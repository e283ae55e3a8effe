"""Task: inject a fault through the job's backend (or hand it to the trainer when the backend can't)."""

from __future__ import annotations

from typing import Any

from api.core.db import session_scope
from api.database.tables import PendingFault
from api.models import jobs as job_store
from api.schemas.events import EventIn, EventType
from api.services import lifecycle, reporting
from workers.backends import get_backend
from workers.backends.base import FaultNotSupported, FaultRequest
from workers.celery_app import celery_app


@celery_app.task(name="ftplane.inject_fault")
def inject_fault(job_id: str, fault: dict[str, Any]) -> None:
    with session_scope() as session:
        job = job_store.get(session, job_id)
        if job is None or job.status in lifecycle.TERMINAL or job.attempt != fault["attempt"]:
            return
        spec = lifecycle.spec_of(job)
        request = FaultRequest(id=fault["id"], kind=fault["kind"], rank=fault["rank"])
        try:
            get_backend(job.backend).inject_fault(job.id, job.attempt, spec, request)
        except FaultNotSupported:
            session.add(
                PendingFault(id=request.id, job_id=job.id, attempt=job.attempt, kind=request.kind, rank=request.rank)
            )
            return
        reporting.record_events(
            session,
            job,
            [
                EventIn(
                    key=f"fault:{request.id}",
                    type=EventType.fault_injected,
                    attempt=job.attempt,
                    rank=request.rank,
                    details={
                        "kind": request.kind,
                        "fault_id": request.id,
                        "source": "control_plane",
                        "delivery": "backend",
                    },
                )
            ],
        )
