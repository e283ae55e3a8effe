"""The job lifecycle: every job and attempt status transition, and the recovery ladder.

    job:      PENDING → SUBMITTED → RUNNING ⇄ RECOVERING → SUCCEEDED | FAILED | CANCELLED
    attempt:  PENDING → LAUNCHED → RUNNING → SUCCEEDED | FAILED | CANCELLED

Nothing else assigns `job.status` or `attempt.status`: routes, the ingest path and the
supervision duties ask this module. The recovery ladder is data (`LADDER`): each rung, the
event that marks it and its budget in the spec; `next_rung` alone decides what a failed
attempt leads to, and nothing else reads the budgets (the backends and the trainer get theirs
from `budgets`).

Decisions here only touch the database. What they ask of a backend (tear an attempt down,
launch the next one) is done by the supervision duties that read these states.

One module of ~460 lines on purpose: that every transition and every rung is decided in one
place, and nowhere else, is the rule this module exists for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import flag_modified

from api.database.tables import Attempt, Event, Job
from api.models import events as event_store
from api.models import jobs as job_store
from api.models import liveness
from api.schemas.causes import Cause, CauseClass
from api.schemas.events import MAX_EVENTS_PER_BATCH, EventIn, EventType, utcnow
from api.schemas.spec import JobSpec
from api.schemas.status import AttemptStatus, JobStatus
from api.services import notifications

__all__ = ["AttemptStatus", "JobStatus"]  # defined with the schemas, moved only from here


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
ACTIVE = frozenset({JobStatus.SUBMITTED, JobStatus.RUNNING, JobStatus.RECOVERING})

ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.PENDING: frozenset({JobStatus.SUBMITTED, JobStatus.FAILED, JobStatus.CANCELLED}),
    JobStatus.SUBMITTED: frozenset({JobStatus.RUNNING, JobStatus.RECOVERING} | TERMINAL),
    JobStatus.RUNNING: frozenset({JobStatus.RECOVERING} | TERMINAL),
    JobStatus.RECOVERING: frozenset({JobStatus.RUNNING} | TERMINAL),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}


ATTEMPT_ENDED = frozenset({AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.CANCELLED})

ATTEMPT_ALLOWED: dict[AttemptStatus, frozenset[AttemptStatus]] = {
    AttemptStatus.PENDING: frozenset({AttemptStatus.LAUNCHED, AttemptStatus.FAILED, AttemptStatus.CANCELLED}),
    AttemptStatus.LAUNCHED: frozenset({AttemptStatus.RUNNING} | ATTEMPT_ENDED),
    AttemptStatus.RUNNING: ATTEMPT_ENDED,
    AttemptStatus.SUCCEEDED: frozenset(),
    AttemptStatus.FAILED: frozenset(),
    AttemptStatus.CANCELLED: frozenset(),
}

TERMINAL_EVENT = {
    JobStatus.SUCCEEDED: EventType.succeeded,
    JobStatus.FAILED: EventType.failed,
    JobStatus.CANCELLED: EventType.cancelled,
}

# Failures in a row that do not get past the step of the first of them: the job is stuck.
NO_PROGRESS_FAILURES = 3


class InvalidTransition(Exception):
    pass


# ---- the recovery ladder ---------------------------------------------------------------------------


class RungName(StrEnum):
    inprocess = "in-process restart"
    in_job = "in-job restart"
    job = "job restart"


@dataclass(frozen=True)
class Rung:
    """One rung of the recovery ladder: who climbs it, the event that marks it, its budget in the spec."""

    name: RungName
    event: EventType
    runs_in: str  # "trainer" (the ranks' processes), "launcher" (ft_launcher in the pod) or "control plane"

    def budget(self, spec: JobSpec) -> int:
        r = spec.resiliency
        if self.name == RungName.inprocess:
            return r.inprocess.max_iterations if r.inprocess.enabled else 0
        if self.name == RungName.in_job:
            return r.max_in_job_restarts
        return r.max_job_restarts


LADDER: tuple[Rung, ...] = (
    Rung(RungName.inprocess, EventType.inprocess_restart, "trainer"),
    Rung(RungName.in_job, EventType.injob_restart, "launcher"),
    Rung(RungName.job, EventType.job_restart, "control plane"),
)
RUNG = {rung.name: rung for rung in LADDER}


@dataclass(frozen=True)
class Budgets:
    """Each rung's budget, as the parts that climb a rung themselves are told it."""

    inprocess: int
    in_job: int
    job: int


def budgets(spec: JobSpec) -> Budgets:
    return Budgets(*(rung.budget(spec) for rung in LADDER))


@dataclass(frozen=True)
class Failure:
    """An attempt that is over without success (the rungs inside it are spent), and the nodes it blames."""

    cause: Cause
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    """What a failure leads to: the next rung (with the nodes to exclude), or none: give up with `cause`."""

    rung: Rung | None
    cause: Cause
    exclude: tuple[str, ...] = ()

    @property
    def gives_up(self) -> bool:
        return self.rung is None


# Causes after which restarting cannot help: the resiliency library already decided, or the attempt's own
# image cannot run it (a launch cause, e.g. EFA asked of an image without the OFI plugin).
FINAL_CAUSES = frozenset({CauseClass.verdict, CauseClass.launch})
# The `reason` fact of a scheduling failure the pending timeout declared (time_out_pending).
PENDING_TIMEOUT = "PendingTimeout"


def next_rung(job: Job, spec: JobSpec, failure: Failure, *, preemptions: int = 0) -> Decision:
    """The escalation after `failure` of the job's current attempt: a job restart, or giving up.

    A preemption (evicted, drained, reclaimed spot capacity, a queue taking the quota back) is not the job's
    fault: its restart comes from a budget of its own, `resiliency.max_preemptions` (`preemptions`: those
    spent so far), and neither spends `max_job_restarts` nor counts as a failure without progress."""
    cause = failure.cause
    if cause.cause_class in FINAL_CAUSES:
        return Decision(None, cause)
    if cause.facts.get("reason") == PENDING_TIMEOUT and spec.resiliency.on_pending_timeout == "fail":
        return Decision(None, cause.with_message(f"{cause.message}; resiliency.on_pending_timeout is fail"))
    new_nodes = tuple(n for n in dict.fromkeys(failure.nodes) if n and n not in job.excluded_nodes)
    moves = bool(new_nodes) and spec.resiliency.exclude_failed_nodes
    exclude = new_nodes if moves else ()
    rung = RUNG[RungName.job]
    if cause.cause_class == CauseClass.preempted:
        allowed = spec.resiliency.max_preemptions
        if preemptions >= allowed:
            return Decision(None, cause.with_message(f"{cause.message}; preemption budget ({allowed}) spent"))
        return Decision(rung, cause, exclude=exclude)
    stalled = None if moves else progress_stalled(job)  # other hardware is a new condition, not a loop
    if stalled is not None:
        return Decision(None, stalled.with_message(f"{stalled.message} (last cause: {cause.message})"))
    budget = rung.budget(spec)
    if job.job_restarts - preemptions >= budget:
        return Decision(None, cause.with_message(f"{cause.message}; job restart budget ({budget}) spent"))
    return Decision(rung, cause, exclude=exclude)


def preemptions_spent(session: Session, job: Job) -> int:
    """Job restarts made after a preemption so far (they are not charged to max_job_restarts)."""
    restarts = event_store.of_job(session, job.id, types=[EventType.job_restart.value])
    return sum(1 for e in restarts if (e.details or {}).get("cause_class") == CauseClass.preempted.value)


def progress_stalled(job: Job) -> Cause | None:
    """The last NO_PROGRESS_FAILURES failures never got past the step of the first of them."""
    steps = [int(s) for s in job.failure_steps]
    if len(steps) < NO_PROGRESS_FAILURES:
        return None
    window = steps[-NO_PROGRESS_FAILURES:]
    if max(window[1:]) > window[0]:
        return None
    return Cause(
        CauseClass.no_progress,
        f"no progress: the last {NO_PROGRESS_FAILURES} failures never got past step {window[0]}",
        {"step": window[0]},
    )


# ---- the spec -----------------------------------------------------------------------------------------

_SPEC = "_ftplane_spec"


def spec_of(job: Job) -> JobSpec:
    """The job's spec, validated once per loaded row (a job's spec never changes after it is accepted)."""
    cached = job.__dict__.get(_SPEC)
    if cached is None:
        cached = JobSpec.model_validate(job.spec)
        job.__dict__[_SPEC] = cached
    return cached


# ---- job transitions ----------------------------------------------------------------------------------


def transition(
    session: Session,
    job: Job,
    to: JobStatus,
    cause: Cause | None = None,
    *,
    details: dict[str, Any] | None = None,
) -> bool:
    """Move `job` to `to`, recording the terminal event where there is one. False when already there."""
    current = JobStatus(job.status)
    if current == to:
        return False
    if to not in ALLOWED[current]:
        raise InvalidTransition(f"job {job.id}: {current} → {to} is not allowed")
    now = utcnow()
    job.status = to
    job.updated_at = now
    if cause is not None:
        job.status_reason = cause.message
    if to == JobStatus.RUNNING and job.started_at is None:
        job.started_at = now
    if to in TERMINAL:
        job.finished_at = now
        body = cause.details() if cause is not None else {}
        body.update(details or {})
        # the job's end is announced like any other new event (webhooks, metrics)
        record(
            session, job, [EventIn(key=f"lifecycle:{to.value.lower()}", type=TERMINAL_EVENT[to], ts=now, details=body)]
        )
    return True


def record(session: Session, job: Job, events: list[EventIn]) -> list[Event]:
    """Store the lifecycle's own events (idempotent by key) and announce the new ones."""
    stored: list[Event] = []
    for start in range(0, len(events), MAX_EVENTS_PER_BATCH):
        new = event_store.store(session, job, events[start : start + MAX_EVENTS_PER_BATCH])
        notifications.events_stored(session, job, new)
        stored.extend(new)
    return stored


# Events that show the job is recovering (the ranks are not all training).
RECOVERY_EVENTS = frozenset(
    {
        EventType.rank_failed,
        EventType.node_failed,
        EventType.node_unhealthy,
        EventType.hang_detected,
        EventType.heartbeat_lost,
        EventType.inprocess_restart,
        EventType.injob_restart,
        EventType.job_restart,
    }
)


def changes_job(status: str, types: Iterable[str]) -> bool:
    """Whether events of these types could change a job in `status` (apply_reported_event's rule, read without
    the row): reports whose events cannot may be stored side by side under a shared lock on the job's row."""
    if JobStatus(status) in TERMINAL:
        return False
    return any(
        t in RECOVERY_EVENTS or t == EventType.injob_restart or (t == EventType.running and status != JobStatus.RUNNING)
        for t in types
    )


def apply_reported_event(session: Session, job: Job, event: EventIn) -> None:
    """What a newly stored event means for the job's status (late events of old attempts mean nothing)."""
    if JobStatus(job.status) in TERMINAL or (event.attempt is not None and event.attempt != job.attempt):
        return
    if (event.type in RECOVERY_EVENTS or event.type == EventType.running) and job.status == JobStatus.PENDING:
        # The trainer already reports while the launch's own bookkeeping is still being committed.
        transition(session, job, JobStatus.SUBMITTED)
    if event.type == EventType.injob_restart:
        _in_job_restart_seen(session, job, event)
    if event.type == EventType.running:
        transition(session, job, JobStatus.RUNNING)
    elif event.type in RECOVERY_EVENTS and JobStatus(job.status) in (JobStatus.RUNNING, JobStatus.SUBMITTED):
        cause = Cause.of(event.details)
        transition(session, job, JobStatus.RECOVERING, cause if cause.message else cause.with_message(event.type))


def _in_job_restart_seen(session: Session, job: Job, event: EventIn) -> None:
    """The launcher restarted the ranks in place: count it, and note how far the job had got (a loop of restarts
    that never gets past a step is stuck)."""
    count = event.details.get("restart_count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return
    attempt = current_attempt(session, job)
    for _ in range(attempt.in_job_restarts, min(count, attempt.in_job_restarts + 100)):
        note_failure(session, job, attempt)
    attempt.in_job_restarts = max(attempt.in_job_restarts, count)


# ---- attempt transitions --------------------------------------------------------------------------------


def _move_attempt(attempt: Attempt, to: AttemptStatus) -> None:
    current = AttemptStatus(attempt.status)
    if current != to and to not in ATTEMPT_ALLOWED[current]:
        raise InvalidTransition(f"attempt {attempt.job_id}/{attempt.number}: {current} → {to} is not allowed")
    attempt.status = to


def current_attempt(session: Session, job: Job) -> Attempt:
    row = job_store.attempt_row(session, job.id, job.attempt)
    if row is None:  # created with the job and with every restart; absent only after manual surgery
        row = Attempt(job_id=job.id, number=job.attempt, status=AttemptStatus.PENDING, created_at=utcnow())
        session.add(row)
        session.flush()
    return row


def attempt_launched(session: Session, job: Job, attempt: Attempt, *, note: str | None = None) -> None:
    """The backend accepted the attempt: record `submitted` (with `note`, what the backend could not do as asked);
    the job is SUBMITTED if it was PENDING."""
    now = utcnow()
    _move_attempt(attempt, AttemptStatus.LAUNCHED)
    attempt.launched_at = now
    details: dict[str, Any] = {"backend": job.backend, "excluded_nodes": list(job.excluded_nodes)}
    if note:
        details["note"] = note
    event = EventIn(
        key=f"submitted:a{job.attempt}", type=EventType.submitted, ts=now, attempt=job.attempt, details=details
    )
    record(session, job, [event])
    if job.status == JobStatus.PENDING:
        transition(session, job, JobStatus.SUBMITTED)


def launch_deferred(attempt: Attempt, cause: Cause) -> None:
    """A launch failed in a way worth retrying: the attempt stays PENDING and says why."""
    attempt.cause = cause.message


def attempt_running(attempt: Attempt, at: datetime | None = None) -> None:
    if AttemptStatus(attempt.status) in ATTEMPT_ENDED or attempt.started_at is not None:
        return
    attempt.started_at = at or utcnow()
    _move_attempt(attempt, AttemptStatus.RUNNING)


def finish_attempt(attempt: Attempt, status: AttemptStatus, cause: Cause | None = None) -> None:
    if status not in ATTEMPT_ENDED:
        raise InvalidTransition(f"{status} does not end an attempt")
    if AttemptStatus(attempt.status) in ATTEMPT_ENDED:
        return
    _move_attempt(attempt, status)
    attempt.cause = cause.message if cause is not None else None
    attempt.finished_at = utcnow()


def succeed(session: Session, job: Job, attempt: Attempt) -> None:
    finish_attempt(attempt, AttemptStatus.SUCCEEDED)
    transition(session, job, JobStatus.SUCCEEDED, Cause(CauseClass.other, "all ranks finished"))


def cancel(session: Session, job: Job, attempt: Attempt | None, cause: Cause) -> None:
    if attempt is not None:
        finish_attempt(attempt, AttemptStatus.CANCELLED, cause)
    transition(session, job, JobStatus.CANCELLED, cause)


def fail(session: Session, job: Job, attempt: Attempt, cause: Cause) -> None:
    """Give up: the attempt and the job end FAILED with the cause (the release duty tears down what is left)."""
    finish_attempt(attempt, AttemptStatus.FAILED, cause)
    transition(session, job, JobStatus.FAILED, cause)


# ---- progress and failures ------------------------------------------------------------------------------


def highest_step(session: Session, job: Job, attempt: Attempt) -> int:
    """The highest step the job has reached so far, over every attempt (the attempt's own is kept up to date)."""
    seen = liveness.max_step(session, job.id, job.attempt)
    if seen is not None and (attempt.max_step is None or seen > attempt.max_step):
        attempt.max_step = seen
    previous = max((s for s in job.failure_steps if isinstance(s, int)), default=0)
    return max(previous, attempt.max_step or 0)


def note_failure(session: Session, job: Job, attempt: Attempt) -> int:
    """Remember how far the job got before a failure (a run that never gets past it is stuck); the step."""
    step = highest_step(session, job, attempt)
    job.failure_steps = [*job.failure_steps, step]
    flag_modified(job, "failure_steps")
    return step


def attempt_failed(session: Session, job: Job, attempt: Attempt, failure: Failure) -> Decision:
    """The attempt is over without success: climb to the next rung, or give up. Database only: the new
    attempt is left PENDING for the launch duty, which first tears this one down."""
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
    return decision


def _restart(
    session: Session, job: Job, spec: JobSpec, decision: Decision, failed_step: int, preemption: int | None
) -> None:
    cause = decision.cause
    from_attempt = job.attempt
    new_attempt = from_attempt + 1
    events: list[EventIn] = []
    for node in decision.exclude:
        job.excluded_nodes = [*job.excluded_nodes, node]
        flag_modified(job, "excluded_nodes")
        events.append(
            EventIn(
                key=f"node_excluded:{node}",
                type=EventType.node_excluded,
                attempt=new_attempt,
                node=node,
                details={**cause.details(), "from_attempt": from_attempt},
            )
        )
    events.append(
        EventIn(
            key=f"job_restart:a{new_attempt}",
            type=EventType.job_restart,
            attempt=new_attempt,
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
    job.attempt = new_attempt
    job.job_restarts += 1
    session.add(Attempt(job_id=job.id, number=new_attempt, status=AttemptStatus.PENDING, created_at=utcnow()))
    record(session, job, events)
    if job.status in (JobStatus.RUNNING, JobStatus.SUBMITTED):
        transition(session, job, JobStatus.RECOVERING)
    job.status_reason = cause.message
