"""ft_launcher's own clock: the timed phases of each of its cycles, from NVRx's profiling lines.

NVRx 0.5 and later log each step of a cycle as it happens, on the launcher's output:

    ...  - Cycle: 1 Event: failure_detected Node: node-0 Rank: 0 Time: 2026-12-03 14:02:51.123 UTC

with the events failure_detected (a restart's cycle begins), worker_terminated, rendezvous_started,
health_check_completed, rendezvous_completed, worker_start_started, worker_start_completed (the cycle's
workers are up). NVRx 0.4.1 prints none of them, and nothing is timed then. A cycle's phases, in seconds:

    termination   failure_detected -> worker_terminated             (a restart's cycle only)
    rendezvous    rendezvous_started -> rendezvous_completed        (the node health check included)
    health_check  rendezvous_started -> health_check_completed
    worker_start  worker_start_started -> worker_start_completed

They are the launcher's times, not the control plane's: goodput splits its initialization and restart
buckets by them (api/services/goodput/launcher_phases.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

PROFILING_LINE = re.compile(
    r"Cycle: (\d+) Event: (\w+) Node: .*? Rank: \S+ Time: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) UTC"
)
PHASES = {
    "termination": ("failure_detected", "worker_terminated"),
    "rendezvous": ("rendezvous_started", "rendezvous_completed"),
    "health_check": ("rendezvous_started", "health_check_completed"),
    "worker_start": ("worker_start_started", "worker_start_completed"),
}
CYCLE_DONE = "worker_start_completed"


@dataclass(frozen=True)
class CycleTimed:
    """One cycle of the launcher, its workers started: when it began and how long each phase took."""

    cycle: int
    began: datetime
    phases: dict[str, float]


@dataclass
class LauncherTiming:
    """Feed it the launcher's lines; a cycle's `CycleTimed` comes with its worker_start_completed line."""

    _times: dict[int, dict[str, datetime]] = field(default_factory=dict)

    def feed(self, line: str) -> CycleTimed | None:
        match = PROFILING_LINE.search(line)
        if match is None:
            return None
        cycle, event = int(match[1]), match[2]
        at = datetime.strptime(match[3], "%Y-%m-%d %H:%M:%S.%f" if "." in match[3] else "%Y-%m-%d %H:%M:%S")
        times = self._times.setdefault(cycle, {})
        times.setdefault(event, at.replace(tzinfo=UTC))
        if event != CYCLE_DONE:
            return None
        del self._times[cycle]
        phases = {
            name: round(max(0.0, (times[end] - times[start]).total_seconds()), 3)
            for name, (start, end) in PHASES.items()
            if start in times and end in times
        }
        return CycleTimed(cycle, min(times.values()), phases)
