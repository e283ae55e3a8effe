"""Duty: hand the faults a backend injects itself (a signal to a rank, a node's loss) to that backend.

The API stores every requested fault in the outbox (api/models/faults.py); the inject task
delivers it at once and each pass of this duty delivers any whose task was lost. A fault is
marked delivered and committed before the backend is asked, so it is injected at most once.
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from api.database.tables import Job
from api.models import faults as fault_outbox
from api.schemas.events import EventIn, EventType
from api.services import lifecycle, reporting
from workers import backends
from workers.backends.base import FaultNotSupported, FaultRequest
from workers.supervision.batch import for_each_job

log = logging.getLogger(__name__)


def run_once(session: Session) -> int:
    jobs = fault_outbox.jobs_with_undelivered(session, fault_outbox.Delivery.backend, lifecycle.ACTIVE)
    return for_each_job(session, jobs, deliver_to_job, "deliver faults")


def deliver(session: Session, job_id: str) -> None:
    """The inject task's fast path."""
    for_each_job(session, [job_id], deliver_to_job, "deliver faults")


def deliver_to_job(session: Session, job: Job) -> int:
    if job.status not in lifecycle.ACTIVE:
        return 0
    due = fault_outbox.undelivered(session, job.id, job.attempt, fault_outbox.Delivery.backend)
    if not due:
        return 0
    fault_outbox.mark_delivered(due)
    session.commit()
    spec = lifecycle.spec_of(job)
    backend = backends.get_backend(job.backend)
    events = []
    for fault in due:
        try:
            backend.inject_fault(job.id, job.attempt, spec, FaultRequest(id=fault.id, kind=fault.kind, rank=fault.rank))
        except FaultNotSupported as exc:
            log.warning("job %s: fault %s not injected: %s", job.id, fault.id, exc)
            continue
        except Exception:
            log.exception("job %s: injecting fault %s failed", job.id, fault.id)
            continue
        events.append(
            EventIn(
                key=f"fault:{fault.id}",
                type=EventType.fault_injected,
                attempt=job.attempt,
                rank=fault.rank,
                details={"kind": fault.kind, "fault_id": fault.id, "source": "control_plane", "delivery": "backend"},
            )
        )
    reporting.record_events(session, job, events)
    return len(due)
