"""Job use cases behind the routes: submit, cancel, inject a fault."""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.core.security import new_id
from api.database.tables import Job, PendingFault
from api.models import jobs as job_store
from api.models import tokens
from api.schemas.jobs import FaultIn, FaultOut
from api.schemas.spec import JobSpec
from api.services.lifecycle import TERMINAL, JobStatus, transition


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
        transition(session, job, JobStatus.CANCELLED, cause="cancelled before launch")
        return False
    job.cancel_requested = True
    return True


def request_fault(session: Session, job: Job, fault: FaultIn) -> FaultOut:
    """Faults the backend can inject now go to the inject task; the rest ride on heartbeat replies."""
    fault_id = new_id()
    by_backend = fault.now and fault.kind in ("crash", "hang", "node_loss")
    # Stored either way (an outbox): a lost inject task is made good by the next supervision pass.
    session.add(
        PendingFault(
            id=fault_id,
            job_id=job.id,
            attempt=job.attempt,
            kind=fault.kind,
            rank=fault.rank,
            at_step=None if by_backend else fault.at_step,
        )
    )
    return FaultOut(
        id=fault_id,
        job_id=job.id,
        attempt=job.attempt,
        kind=fault.kind,
        rank=fault.rank,
        at_step=fault.at_step,
        delivery="backend" if by_backend else "trainer",
    )
