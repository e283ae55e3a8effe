"""Job use cases behind the routes: submit, cancel, inject a fault."""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.database.tables import Job
from api.models import faults as fault_outbox
from api.models import jobs as job_store
from api.models import tokens
from api.schemas.causes import Cause, CauseClass
from api.schemas.jobs import FaultIn, FaultOut
from api.schemas.spec import JobSpec
from api.services import lifecycle
from api.services.lifecycle import TERMINAL, JobStatus


def submit(session: Session, spec: JobSpec) -> tuple[Job, str]:
    """Store the job PENDING with its trainer token; the submit task launches it after commit."""
    job = job_store.create(session, spec)
    _, token = tokens.create_trainer(session, job.id, name=f"trainer:{job.name}")
    return job, token


def request_cancel(session: Session, job: Job) -> bool:
    """True when the cancel task must run (there is something launched to tear down)."""
    if JobStatus(job.status) in TERMINAL:
        return False
    if job.status == JobStatus.PENDING:
        attempt = lifecycle.current_attempt(session, job)
        lifecycle.cancel(session, job, attempt, Cause(CauseClass.cancelled, "cancelled before launch"))
        return False
    job.cancel_requested = True
    return True


def request_fault(session: Session, job: Job, fault: FaultIn) -> FaultOut:
    """Stored in the fault outbox either way: a lost inject task is made good by the next supervision pass."""
    row = fault_outbox.request(
        session,
        job.id,
        job.attempt,
        kind=fault.kind,
        rank=fault.rank,
        at_step=fault.at_step,
        now=fault.now,
        fraction=fault.fraction,
        duration_steps=fault.duration_steps,
    )
    return FaultOut(
        id=row.id,
        job_id=job.id,
        attempt=job.attempt,
        kind=fault.kind,
        rank=fault.rank,
        at_step=fault.at_step,
        fraction=fault.fraction,
        duration_steps=fault.duration_steps,
        delivery="agent" if row.delivery == fault_outbox.Delivery.agent else "trainer",
    )
