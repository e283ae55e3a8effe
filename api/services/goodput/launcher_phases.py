"""What the launcher's own clock says of the initialization and restart buckets.

The node agent reads NVRx 0.5+'s timed events and sends one `launcher_cycle` event per node and cycle,
with the cycle's phases in seconds (termination, rendezvous, health_check, worker_start; see
trainer/agent/launcher_timing.py). Every node's launcher times the same cycle: the slowest node's time
of each phase is the job's. Attempt 0's cycle 0 is the job's start (initialization); every other cycle
is a restart: an in-job restart's cycle, or a job-level restart's new launcher starting (cycle 0 of a
later attempt). The sums are a breakdown inside those buckets, not more buckets: the rest of each bucket
is what the launcher does not time (scheduling, process start before the launcher, the ranks' own
start-up and checkpoint load, detection before the launcher saw the failure).
"""

from __future__ import annotations

from collections.abc import Iterable

from api.schemas.events import EventType
from api.services.goodput.records import Record, number

PHASES = ("termination", "rendezvous", "health_check", "worker_start")


def launcher_phases(records: Iterable[Record]) -> dict[str, dict[str, float]]:
    """{"initialization" | "restart": {phase: seconds}}, summed over cycles; only buckets with a timed cycle."""
    slowest: dict[tuple[int, int], dict[str, float]] = {}
    for record in records:
        if record.type != EventType.launcher_cycle:
            continue
        cycle = record.integer("cycle")
        phases = record.details.get("phases")
        if cycle is None or cycle < 0 or not isinstance(phases, dict):
            continue
        times = slowest.setdefault((record.attempt, cycle), {})
        for name in PHASES:
            seconds = number(phases.get(name))
            if seconds is not None and seconds >= 0:
                times[name] = max(times.get(name, 0.0), seconds)
    out: dict[str, dict[str, float]] = {}
    for (attempt, cycle), times in sorted(slowest.items()):
        bucket = out.setdefault("initialization" if (attempt, cycle) == (0, 0) else "restart", {})
        for name, seconds in times.items():
            bucket[name] = round(bucket.get(name, 0.0) + seconds, 3)
    return out
