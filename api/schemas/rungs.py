"""The recovery ladder's rungs as vocabulary, lowest first: each rung's name and the event that marks a climb.

Who climbs each rung and its budget in the spec are the lifecycle's (api/services/lifecycle/ladder.py);
what counts, shows or accounts restarts (metrics, the dashboard, goodput) reads the rungs from here.
"""

from __future__ import annotations

from enum import StrEnum

from api.schemas.events import EventType


class RungName(StrEnum):
    inprocess = "in-process restart"
    in_job = "in-job restart"
    job = "job restart"


# lowest first: the order in which a failure climbs them
RUNG_EVENTS: dict[RungName, EventType] = {
    RungName.inprocess: EventType.inprocess_restart,
    RungName.in_job: EventType.injob_restart,
    RungName.job: EventType.job_restart,
}
RESTART_TYPES = frozenset(RUNG_EVENTS.values())
