"""What a reported event does to its job: one table, by the job's status and the event's type.

The table is read twice: by `changes_job`, without the job's row (whether a report may be stored under
a shared lock on it, side by side with others), and by `apply_reported_event`, which does what it says.
An event of an earlier attempt does nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy.orm import Session

from api.database.tables import Job
from api.schemas.causes import Cause
from api.schemas.events import EventIn, EventType
from api.schemas.rungs import RESTART_TYPES
from api.schemas.status import JobStatus
from api.services.lifecycle.failures import in_job_restarts_seen
from api.services.lifecycle.states import current_attempt, transition

# Events that show the job is recovering (the ranks are not all training): a failure, or a climb of any rung.
RECOVERY_EVENTS = (
    frozenset(
        {
            EventType.rank_failed,
            EventType.node_failed,
            EventType.node_unhealthy,
            EventType.hang_detected,
            EventType.heartbeat_lost,
        }
    )
    | RESTART_TYPES
)


@dataclass(frozen=True)
class Effect:
    """What one event does to a job: the statuses it moves the job through, in order (to RECOVERING with the
    event's cause), and whether it counts the launcher's in-job restarts (`details.restart_count`)."""

    moves: tuple[JobStatus, ...] = ()
    counts_in_job_restarts: bool = False


def _recovering(moves: tuple[JobStatus, ...]) -> dict[EventType, Effect]:
    """The recovery events moving a job through `moves`; an in-job restart is counted as well."""
    effects = {t: Effect(moves) for t in RECOVERY_EVENTS}
    effects[EventType.injob_restart] = Effect(moves, counts_in_job_restarts=True)
    return effects


# A PENDING job is SUBMITTED first: the trainer already reports while the launch's bookkeeping is being
# committed. A status or an event type not in the table: the event does nothing to the job.
EFFECTS: dict[JobStatus, dict[EventType, Effect]] = {
    JobStatus.PENDING: {
        **_recovering((JobStatus.SUBMITTED, JobStatus.RECOVERING)),
        EventType.running: Effect((JobStatus.SUBMITTED, JobStatus.RUNNING)),
    },
    JobStatus.SUBMITTED: {
        **_recovering((JobStatus.RECOVERING,)),
        EventType.running: Effect((JobStatus.RUNNING,)),
    },
    JobStatus.RUNNING: _recovering((JobStatus.RECOVERING,)),
    JobStatus.RECOVERING: {
        EventType.injob_restart: Effect(counts_in_job_restarts=True),
        EventType.running: Effect((JobStatus.RUNNING,)),
    },
}


def changes_job(status: str, types: Iterable[str]) -> bool:
    """Whether events of these types (of the job's current attempt) change a job in `status`, read without the
    row: reports whose events do not may be stored side by side under a shared lock on the job's row."""
    effects = EFFECTS.get(JobStatus(status), {})
    return any(t in effects for t in types)


def apply_reported_event(session: Session, job: Job, event: EventIn) -> None:
    """What a newly stored event means for the job (late events of old attempts mean nothing). A rank's failure
    marked a consequence (its collective broke because a peer failed: `ftplane.contract.root_cause`) moves
    nothing: the peer's failure, reported with it, does, and gives the job its cause."""
    if event.attempt is not None and event.attempt != job.attempt:
        return
    if event.type == EventType.rank_failed and event.details.get("consequence") is True:
        return
    effect = EFFECTS.get(JobStatus(job.status), {}).get(event.type)
    if effect is None:
        return
    if effect.counts_in_job_restarts:
        _count_in_job_restarts(session, job, event)
    for to in effect.moves:
        if to == JobStatus.RECOVERING:
            cause = Cause.of(event.details)
            transition(session, job, to, cause if cause.message else cause.with_message(event.type))
        else:
            transition(session, job, to)


def _count_in_job_restarts(session: Session, job: Job, event: EventIn) -> None:
    """The launcher restarted the ranks in place: its `restart_count` is how many times in all, so far."""
    count = event.details.get("restart_count")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 1:
        in_job_restarts_seen(session, job, current_attempt(session, job), count)
