"""Deliver faults the backend injects itself (signals to a rank, pod deletion), from the outbox.

The API stores every requested fault; the inject task delivers it at once and each
supervision pass delivers any whose task was lost. Delivery is at most once: a fault is
marked delivered before the signal is sent, since injecting it twice is worse than not at all.
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.database.tables import Job, PendingFault
from api.schemas.events import EventIn, EventType, utcnow
from api.services import lifecycle, reporting
from api.services.reporting import by_backend
from workers.backends import get_backend
from workers.backends.base import FaultNotSupported, FaultRequest

log = logging.getLogger(__name__)


def deliver_backend_faults(session: Session, job: Job) -> int:
    pending = session.scalars(
        select(PendingFault).where(
            PendingFault.job_id == job.id,
            PendingFault.attempt == job.attempt,
            PendingFault.delivered_at.is_(None),
        )
    ).all()
    due = [f for f in pending if by_backend(f)]
    for fault in due:
        fault.delivered_at = utcnow()
    session.commit()
    spec = lifecycle.spec_of(job)
    for fault in due:
        request = FaultRequest(id=fault.id, kind=fault.kind, rank=fault.rank)
        try:
            get_backend(job.backend).inject_fault(job.id, job.attempt, spec, request)
        except FaultNotSupported as exc:
            log.warning("job %s: fault %s not injected: %s", job.id, fault.id, exc)
            continue
        except Exception:
            log.exception("job %s: injecting fault %s failed", job.id, fault.id)
            continue
        details = {"kind": fault.kind, "fault_id": fault.id, "source": "control_plane", "delivery": "backend"}
        event = EventIn(
            key=f"fault:{fault.id}",
            type=EventType.fault_injected,
            attempt=job.attempt,
            rank=fault.rank,
            details=details,
        )
        reporting.record_events(session, job, [event])
    session.commit()
    return len(due)
