"""Job use cases behind the routes: submit, cancel, inject a fault."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session

from api import models
from api.core.errors import ApiError
from api.database.tables import Job
from api.schemas.causes import Cause, CauseClass
from api.schemas.jobs import FaultIn, FaultOut
from api.schemas.spec import JobSpec
from api.services import lifecycle
from api.services.lifecycle import TERMINAL, JobStatus


def submit(session: Session, spec: JobSpec) -> tuple[Job, str]:
    """Store the job PENDING with its trainer token; the submit task launches it after commit."""
    check_resume_from(session, spec)
    if spec.backend == "local" and spec.working_dir is not None and not Path(spec.working_dir).is_dir():
        raise ApiError(
            422,
            f"working_dir {spec.working_dir} is not a directory on this host (the local backend runs jobs here): "
            "create it, or leave working_dir out for a directory of the job's own",
            field="working_dir",
        )
    job = models.jobs.create(session, spec)
    _, token = models.tokens.create_trainer(session, job.id, name=f"trainer:{job.name}")
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
    row = models.faults.request(
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
        delivery="agent" if row.delivery == models.faults.Delivery.agent else "trainer",
    )


def check_resume_from(session: Session, spec: JobSpec) -> None:
    """`checkpoint.resume_from` names a job whose checkpoints this one can read: a job of the same project, on the
    same checkpoint storage (kubernetes: the same claim in the same namespace; local: the same checkpoint.dir)."""
    source_id = spec.checkpoint.resume_from
    if source_id is None:
        return
    field = "checkpoint.resume_from"
    source = models.jobs.get(session, source_id)
    theirs = lifecycle.spec_of(source) if source is not None else None
    if theirs is None or theirs.project != spec.project:  # another project's job is not this caller's to read
        raise ApiError(422, f"{field}: there is no job {source_id} in project {spec.project}", field=field)
    same: object
    ours: object
    if spec.backend == "kubernetes":
        where, same, ours = (
            "namespace and checkpoint.pvc",
            (theirs.namespace, theirs.checkpoint.pvc),
            (
                spec.namespace,
                spec.checkpoint.pvc,
            ),
        )
    else:
        where, same, ours = "checkpoint.dir", theirs.checkpoint.dir, spec.checkpoint.dir
    if theirs.backend != spec.backend or same != ours:
        raise ApiError(
            422,
            f"{field}: job {source_id} kept its checkpoints elsewhere ({theirs.backend}, {where} {same}); "
            f"a job resumes from checkpoints on its own storage ({spec.backend}, {where} {ours})",
            field=field,
        )
