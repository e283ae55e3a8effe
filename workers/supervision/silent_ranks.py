"""Detect ranks that stopped heartbeating: hang_detected past the spec's timeout.

The in-pod launcher restarts a hung rank on its own (same timeouts); when a hang
outlives twice the timeout, the launcher could not recover it and the
supervisor escalates to a job-level restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.orm import Session

from api.database.tables import Attempt, Job
from api.models import liveness
from api.schemas.events import EventIn, EventType, utcnow
from api.schemas.spec import JobSpec
from api.services import reporting


@dataclass(frozen=True)
class Silence:
    cause: str
    escalate: bool  # silent for twice the timeout: in-job recovery did not work


def detect(session: Session, job: Job, attempt: Attempt, spec: JobSpec) -> Silence | None:
    now = utcnow()
    timeout = spec.resiliency.heartbeat_timeout_s
    ranks = [r for r in liveness.ranks(session, job.id) if r.attempt == job.attempt]
    if not ranks:
        if attempt.launched_at is None:
            return None
        waited = (now - attempt.launched_at).total_seconds()
        initial = spec.resiliency.initial_heartbeat_timeout_s
        if waited <= initial:
            return None
        cause = f"no heartbeat from any rank {waited:.1f} s after launch (initial timeout {initial:g} s)"
        _record(session, job, None, None, f"hang:a{job.attempt}:initial", cause)
        return Silence(cause, escalate=waited > 2 * initial)
    silent = [r for r in ranks if r.last_seen < now - timedelta(seconds=timeout)]
    if not silent:
        return None
    events = []
    worst = 0.0
    for rank in silent:
        quiet = (now - rank.last_seen).total_seconds()
        worst = max(worst, quiet)
        cause = f"no heartbeat for {quiet:.1f} s (timeout {timeout:g} s) at step {rank.step}"
        events.append(
            _event(
                job,
                rank.rank,
                rank.step,
                f"hang:a{job.attempt}:r{rank.rank}:t{int(rank.last_seen.timestamp() * 1000)}",
                cause,
                rank.node,
                silent_s=round(quiet, 3),
            )
        )
    reporting.record_events(session, job, events)
    summary = f"{len(silent)} rank(s) silent for up to {worst:.1f} s (timeout {timeout:g} s)"
    return Silence(summary, escalate=worst > 2 * timeout)


def _event(
    job: Job,
    rank: int | None,
    step: int | None,
    key: str,
    cause: str,
    node: str | None = None,
    silent_s: float | None = None,
) -> EventIn:
    # silent_s: how long the rank had been quiet (goodput dates the hang's onset by it)
    details: dict[str, object] = {"cause": cause}
    if silent_s is not None:
        details["silent_s"] = silent_s
    return EventIn(
        key=key,
        type=EventType.hang_detected,
        attempt=job.attempt,
        rank=rank,
        step=step,
        node=node,
        details=details,
    )


def _record(session: Session, job: Job, rank: int | None, step: int | None, key: str, cause: str) -> None:
    reporting.record_events(session, job, [_event(job, rank, step, key, cause)])
