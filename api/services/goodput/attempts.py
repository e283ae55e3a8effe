"""The per-attempt split: where each attempt begins, and the labelled intervals of the accounting summed
into buckets, for the job and for each attempt (cut at the attempts' boundaries)."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

from api.schemas.events import EventType
from api.schemas.goodput import LOST_BUCKETS, AttemptGoodput, Breakdown
from api.services.goodput.records import Record

PRODUCTIVE = "productive"

Clock = Callable[[datetime], float]  # an event time as seconds since the wall start, clamped into wall time
Interval = tuple[float, float, str]  # [begin, end) in seconds since the wall start, and its bucket


def split(
    recs: Sequence[Record],
    t: Clock,
    origin: datetime,
    wall: float,
    intervals: Sequence[Interval],
    failures_at: Sequence[float],
) -> tuple[Breakdown, list[AttemptGoodput]]:
    """The job's breakdown and each attempt's; `failures_at`: when each failure was detected (or began)."""
    attempt_ids, edges = attempt_edges(recs, t, wall)
    total: dict[str, float] = defaultdict(float)
    per_attempt: list[dict[str, float]] = [defaultdict(float) for _ in attempt_ids]
    for b, e, bucket in intervals:
        if e <= b:
            continue
        total[bucket] += e - b
        for i in range(len(attempt_ids)):
            part = min(e, edges[i + 1]) - max(b, edges[i])
            if part > 0:
                per_attempt[i][bucket] += part

    failures_in = [0] * len(attempt_ids)
    for at in failures_at:
        failures_in[max(0, bisect.bisect_right(edges[:-1], at) - 1)] += 1

    attempts = [
        AttemptGoodput(
            attempt=a,
            start=origin + timedelta(seconds=edges[i]),
            end=origin + timedelta(seconds=edges[i + 1]),
            failures=failures_in[i],
            **breakdown(edges[i + 1] - edges[i], per_attempt[i]).model_dump(),
        )
        for i, a in enumerate(attempt_ids)
    ]
    return breakdown(wall, total), attempts


def attempt_edges(recs: Sequence[Record], t: Clock, wall: float) -> tuple[list[int], list[float]]:
    """The attempts and their boundaries: attempt a > 0 starts at the job_restart that created it (else at its
    earliest event), attempt 0 at the wall start; the last edge is the end of wall time."""
    bounds: dict[int, float] = {0: 0.0}
    for r in recs:
        if r.attempt > 0 and r.type == EventType.job_restart:
            bounds[r.attempt] = min(t(r.ts), bounds.get(r.attempt, wall))
    for r in recs:
        if r.attempt > 0 and r.attempt not in bounds:
            bounds[r.attempt] = t(r.ts)  # the earliest event of an attempt without a job_restart
    attempt_ids = sorted(bounds)
    edges: list[float] = []
    for a in attempt_ids:
        edges.append(max([bounds[a], *edges[-1:]]))
    edges.append(wall)
    return attempt_ids, edges


def breakdown(wall: float, seconds: Mapping[str, float]) -> Breakdown:
    productive = seconds.get(PRODUCTIVE, 0.0)
    return Breakdown(
        wall_s=wall,
        productive_s=productive,
        lost_s={name: seconds.get(name, 0.0) for name in LOST_BUCKETS},
        ettr=min(1.0, productive / wall) if wall > 0 else None,
    )
