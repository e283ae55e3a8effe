"""Failures: how far the job got before each, the in-job restarts counted, and an attempt's failure with what
follows it (the next rung, or giving up).

`attempt_failed` is the one way an attempt that is over without success is ended: it records the failure,
asks the ladder, and for a job restart hands the new attempt's launch to the submit task once the
transaction commits (the launch duty's next pass would find it too, were the task lost).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import flag_modified

from api import models
from api.core import queue
from api.database.tables import Attempt, Job
from api.schemas.causes import CauseClass
from api.schemas.events import EventIn, EventType
from api.schemas.rungs import RungName
from api.schemas.spec import JobSpec
from api.schemas.status import AttemptStatus, JobStatus
from api.services import notifications
from api.services.lifecycle.ladder import RUNG, Decision, Failure, next_rung
from api.services.lifecycle.spec import spec_of
from api.services.lifecycle.states import fail, finish_attempt, new_attempt, record, transition

# In-job restarts noted as failures at once, however many a count claims: only the highest failure step and the
# last few are ever read (`progress_stalled`), and the steps are a list on the job's row.
NOTED_AT_ONCE = 100


# ---- progress at each failure -----------------------------------------------------------------------------


def highest_step(session: Session, job: Job, attempt: Attempt) -> int:
    """The highest step the job has reached so far, over every attempt (the attempt's own is kept up to date)."""
    seen = models.liveness.max_step(session, job.id, job.attempt)
    if seen is not None and (attempt.max_step is None or seen > attempt.max_step):
        attempt.max_step = seen
    previous = max((s for s in job.failure_steps if isinstance(s, int)), default=0)
    return max(previous, attempt.max_step or 0)


def note_failure(session: Session, job: Job, attempt: Attempt, times: int = 1) -> int:
    """Remember how far the job got before a failure (a run that never gets past it is stuck); the step."""
    step = highest_step(session, job, attempt)
    job.failure_steps = [*job.failure_steps, *[step] * times]
    flag_modified(job, "failure_steps")
    return step


# ---- in-job restarts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InJobRestart:
    """One in-job restart of an attempt: its number (the first is 1), and the step the job had reached."""

    number: int
    failed_step: int


def in_job_restarts_seen(session: Session, job: Job, attempt: Attempt, count: int) -> list[InJobRestart]:
    """The launcher has restarted the attempt's ranks in place `count` times in all: count the new restarts, each a
    failure noted at the step the job had reached. The new ones (none when `count` says nothing new)."""
    new = range(attempt.in_job_restarts + 1, count + 1)
    if not new:
        return []
    step = note_failure(session, job, attempt, times=min(len(new), NOTED_AT_ONCE))
    attempt.in_job_restarts = count
    return [InJobRestart(n, step) for n in new]


# ---- an attempt's failure ---------------------------------------------------------------------------------


def preemptions_spent(session: Session, job: Job) -> int:
    """Job restarts made after a preemption so far (they are not charged to max_job_restarts)."""
    restarts = models.events.of_job(session, job.id, types=[EventType.job_restart.value])
    return sum(1 for e in restarts if (e.details or {}).get("cause_class") == CauseClass.preempted.value)


def attempt_failed(session: Session, job: Job, attempt: Attempt, failure: Failure) -> Decision:
    """The attempt is over without success: climb to the next rung, or give up. The new attempt is left PENDING
    and, once the transaction commits, handed to the submit task, which first tears this one down."""
    preempted = failure.cause.cause_class == CauseClass.preempted
    # a preemption says nothing about the job's progress: it does not count towards "no progress"
    failed_step = highest_step(session, job, attempt) if preempted else note_failure(session, job, attempt)
    spec = spec_of(job)
    preemptions = preemptions_spent(session, job)
    decision = next_rung(job, spec, failure, preemptions=preemptions)
    if decision.gives_up:
        fail(session, job, attempt, decision.cause)
        return decision
    finish_attempt(attempt, AttemptStatus.FAILED, failure.cause)
    _restart(session, job, spec, decision, failed_step, preemptions + 1 if preempted else None)
    job_id = job.id
    notifications.after_commit(session, lambda: queue.send(queue.SUBMIT_JOB, job_id))
    return decision


def _restart(
    session: Session, job: Job, spec: JobSpec, decision: Decision, failed_step: int, preemption: int | None
) -> None:
    cause = decision.cause
    from_attempt = job.attempt
    next_number = from_attempt + 1
    events: list[EventIn] = []
    for node in decision.exclude:
        job.excluded_nodes = [*job.excluded_nodes, node]
        flag_modified(job, "excluded_nodes")
        events.append(
            EventIn(
                key=f"node_excluded:{node}",
                type=EventType.node_excluded,
                attempt=next_number,
                node=node,
                details={**cause.details(), "from_attempt": from_attempt},
            )
        )
    events.append(
        EventIn(
            key=f"job_restart:a{next_number}",
            type=EventType.job_restart,
            attempt=next_number,
            step=failed_step,
            details={
                **cause.details(),
                "from_attempt": from_attempt,
                "failed_step": failed_step,
                "restart": job.job_restarts + 1,
                "budget": RUNG[RungName.job].budget(spec),
                # a preemption's restart is counted against its own budget
                **(
                    {"preemption": preemption, "preemption_budget": spec.resiliency.max_preemptions}
                    if preemption
                    else {}
                ),
            },
        )
    )
    new_attempt(session, job)
    job.job_restarts += 1
    record(session, job, events)
    if job.status in (JobStatus.RUNNING, JobStatus.SUBMITTED):
        transition(session, job, JobStatus.RECOVERING)
    job.status_reason = cause.message
