"""A job's ledger (api/services/goodput/accounting.py) in the form the fleet reads: closed segments cut at attempts
and UTC hours, the sums of each hour and each UTC day, the failures with their cause classes, and the open tail
of a running job.

Pure: no database. Times are Unix seconds.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass, field

from api.database.tables import Job
from api.schemas.causes import CauseClass, cause_class_of
from api.schemas.events import EventType
from api.schemas.goodput import LOST_BUCKETS
from api.services import lifecycle
from api.services.goodput.accounting import Ledger
from api.services.goodput.attempts import attempt_edges
from api.services.goodput.windows import Window, failure_time

HOUR = 3600.0
DAY = 86400.0
BUCKETS = ("productive", *LOST_BUCKETS)  # every bucket of a job's goodput: goodput_hours has a column each

# The class a failure's kind implies where none of its events states one.
CAUSE_OF_KIND = {
    EventType.hang_detected.value: CauseClass.hang,
    EventType.heartbeat_lost.value: CauseClass.hang,
    EventType.node_failed.value: CauseClass.node,
    EventType.preempted.value: CauseClass.preempted,
    EventType.rank_failed.value: CauseClass.crash,
}


@dataclass(frozen=True)
class Segment:
    attempt: int
    bucket: str
    start_s: float
    end_s: float

    @property
    def hour_s(self) -> float:
        return math.floor(self.start_s / HOUR) * HOUR


@dataclass(frozen=True)
class Fault:
    attempt: int
    ts_s: float
    cause: str


@dataclass(frozen=True)
class OpenTail:
    """A running job's last stretch: from `start_s` to now, in one bucket."""

    attempt: int
    bucket: str
    start_s: float


@dataclass
class Summary:
    segments: list[Segment] = field(default_factory=list)  # closed, each inside one hour
    hours: dict[float, dict[str, float]] = field(default_factory=dict)  # hour -> bucket -> seconds
    days: dict[float, dict[str, float]] = field(default_factory=dict)  # UTC day -> bucket -> seconds
    faults: list[Fault] = field(default_factory=list)
    open: OpenTail | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # per bucket, the open tail to the ledger's end included


def gpus_of(job: Job) -> int:
    """GPUs the job holds: nodes x gpus_per_node, or nodes x procs_per_node where it asks for no GPU."""
    spec = lifecycle.spec_of(job)
    per_node = spec.resources.gpus_per_node or spec.procs_per_node
    return spec.nodes * per_node


def summarize(led: Ledger) -> Summary:
    """The summary of one job's ledger; a job without an end event keeps its last stretch open."""
    origin = led.origin.timestamp()
    ids, edges = attempt_edges(led.recs, led.t, led.wall)
    pieces: list[tuple[float, float, int, str]] = []
    for b, e, bucket in led.intervals:
        for i, attempt in enumerate(ids):
            lo, hi = max(b, edges[i]), min(e, edges[i + 1])
            if hi > lo:
                pieces.append((lo, hi, attempt, bucket))
    pieces.sort()
    merged: list[tuple[float, float, int, str]] = []
    for lo, hi, attempt, bucket in pieces:
        if merged and merged[-1][1] == lo and merged[-1][2:] == (attempt, bucket):
            merged[-1] = (merged[-1][0], hi, attempt, bucket)
        else:
            merged.append((lo, hi, attempt, bucket))

    out = Summary()
    seconds: dict[str, float] = defaultdict(float)
    for lo, hi, _, bucket in merged:
        seconds[bucket] += hi - lo
    out.seconds = dict(seconds)
    if led.terminal is None and led.recs:
        if merged:
            lo, _, attempt, bucket = merged.pop()
            out.open = OpenTail(attempt, bucket, origin + lo)
        else:  # launched just now: its start-up has begun
            out.open = OpenTail(ids[-1], "initialization", origin)
    for lo, hi, attempt, bucket in merged:
        for segment in _by_hour(Segment(attempt, bucket, origin + lo, origin + hi)):
            out.segments.append(segment)
            hour = out.hours.setdefault(segment.hour_s, dict.fromkeys(BUCKETS, 0.0))
            hour[bucket] += segment.end_s - segment.start_s
            day = out.days.setdefault(math.floor(segment.start_s / DAY) * DAY, dict.fromkeys(BUCKETS, 0.0))
            day[bucket] += segment.end_s - segment.start_s
    for w in led.failed:
        at = failure_time(w)
        attempt = ids[max(0, bisect.bisect_right(edges[:-1], at) - 1)]
        out.faults.append(Fault(attempt, origin + at, fault_cause(w).value))
    return out


def _by_hour(segment: Segment) -> list[Segment]:
    """The segment cut at UTC hour boundaries."""
    out = []
    lo = segment.start_s
    while lo < segment.end_s:
        hi = min(segment.end_s, math.floor(lo / HOUR) * HOUR + HOUR)
        out.append(Segment(segment.attempt, segment.bucket, lo, hi))
        lo = hi
    return out


def fault_cause(w: Window) -> CauseClass:
    """The class of the failure's first signal: the one it states, else the one its kind implies (an injected
    fault's kind; hang for a silence; node, preempted; crash for a rank's failure)."""
    for r in w.signals:
        if r.details.get("cause_class") is not None:
            return cause_class_of(r.details)
        if r.type == EventType.fault_injected:
            kind = r.details.get("kind")
            if isinstance(kind, str) and kind in CauseClass.__members__:
                return CauseClass(kind)
        elif r.type in CAUSE_OF_KIND:
            return CAUSE_OF_KIND[r.type]
    return CauseClass.unknown
