"""The effects table read two ways agrees: `changes_job` (the report path's lock choice, without the row) says an
event changes a job exactly when `apply_reported_event` changes it."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api import models
from api.core.db import session_scope
from api.schemas.events import EventIn, EventType
from api.services import lifecycle
from api.services.lifecycle import JobStatus


def snapshot(session: Any, job: Any) -> tuple[object, ...]:
    attempt = lifecycle.current_attempt(session, job)
    return (
        job.status,
        job.status_reason,
        job.started_at,
        list(job.failure_steps),
        job.job_restarts,
        attempt.status,
        attempt.in_job_restarts,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    status=st.sampled_from(list(JobStatus)),
    event_type=st.sampled_from(list(EventType)),
    of=st.sampled_from(["current", "unstated", "earlier"]),
    restart_count=st.one_of(st.none(), st.integers(min_value=0, max_value=4)),
    counted=st.integers(min_value=0, max_value=2),
)
def test_changes_job_says_whether_applying_the_event_changes_the_job(
    make_job: Any, status: JobStatus, event_type: EventType, of: str, restart_count: int | None, counted: int
) -> None:
    job_id = make_job()["id"]
    with session_scope() as session:
        job = models.jobs.get(session, job_id, for_update=True)
        assert job is not None
        job.status = status
        job.attempt = 1
        lifecycle.current_attempt(session, job).in_job_restarts = counted
        details: dict[str, Any] = {"cause": "exit 1", "cause_class": "crash"}
        if restart_count is not None:
            details["restart_count"] = restart_count
        attempt = {"current": 1, "unstated": None, "earlier": 0}[of]
        event = EventIn(key="k", type=event_type, attempt=attempt, details=details)
        before = snapshot(session, job)
        lifecycle.apply_reported_event(session, job, event)
        changed = snapshot(session, job) != before
        session.rollback()
    says = lifecycle.changes_job(status, [event_type])
    if changed:
        assert says, f"{event_type} changed a {status} job, but changes_job said it would not"
    if of == "earlier":
        assert not changed  # an earlier attempt's event changes nothing (changes_job, blind to it, may lock)
    elif event_type == EventType.injob_restart and status not in lifecycle.TERMINAL:
        # the count changes the job only when it is new; a status move always does, where there is one
        moves = bool(lifecycle.EFFECTS[status][event_type].moves)
        assert changed == (moves or (restart_count is not None and restart_count > counted))
        assert says
    else:
        assert changed == says, f"{event_type} on a {status} job: changed={changed}, changes_job={says}"
