"""The fleet's figures as the API gives them (api/schemas/fleet.py), from the query's sums (query.py)."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from api.schemas.fleet import FleetBucket, FleetCost, FleetFigures, FleetGoodputOut, FleetGroup, TopJob
from api.schemas.goodput import LOST_BUCKETS
from api.services.fleet.pricing import NONE, Pricing
from api.services.fleet.query import WHOLE, Found, JobFacts, Scope, Sums, Window, aggregate
from api.services.fleet.summary import BUCKETS, HOUR

PRODUCTIVE = "productive"


def fleet_goodput(
    session: Session,
    *,
    since: datetime,
    until: datetime,
    now: datetime,
    scope: Scope,
    bucket_s: float | None = None,
    group_by: str | None = None,
    pricing: Pricing = NONE,
    top: int = 10,
) -> FleetGoodputOut:
    window = Window(since.timestamp(), until.timestamp(), now.timestamp(), bucket_s)
    found = aggregate(session, window, scope, group_by=group_by, pricing=pricing, top=top)
    priced = pricing.configured
    keys = {key for key, _ in found.groups}
    indexes = range(len(found.ranges))

    def series(of: list[str | None]) -> list[FleetBucket]:
        if bucket_s is None:
            return []
        return [
            FleetBucket(start=_time(lo), end=_time(hi), **figures(_merged(found, of, [i]), priced).model_dump())
            for i, (lo, hi) in enumerate(found.ranges)
        ]

    def whole(of: list[str | None]) -> FleetFigures:
        merged = _merged(found, of, list(indexes))
        merged.jobs = sum(found.groups[(k, WHOLE)].jobs for k in of if (k, WHOLE) in found.groups)
        return figures(merged, priced)

    groups = []
    if group_by is not None:
        for key in keys:
            groups.append(FleetGroup(key=key, series=series([key]), **whole([key]).model_dump()))
        groups.sort(key=lambda g: (-g.wall_gpu_hours, g.key is None, g.key or ""))
    return FleetGoodputOut(
        since=since,
        until=until,
        now=now,
        bucket_s=bucket_s,
        group_by=group_by,
        total=whole(list(keys)),
        series=series(list(keys)),
        groups=groups,
        top_jobs=[_top(job, sums) for job, sums in found.top],
    )


def _merged(found: Found, keys: list[str | None], indexes: list[int]) -> Sums:
    """The sums of these groups over these ranges (job counts: of one range only; the caller sets the window's)."""
    out = Sums()
    out.faults = defaultdict(int)
    for key in keys:
        for i in indexes:
            part = found.groups.get((key, i))
            if part is None:
                continue
            for b in BUCKETS:
                out.seconds[b] += part.seconds[b]
                out.gpu_seconds[b] += part.gpu_seconds[b]
                out.cost[b] += part.cost[b]
            out.unpriced_gpu_seconds += part.unpriced_gpu_seconds
            for cause, n in part.faults.items():
                out.faults[cause] += n
            out.jobs += part.jobs
    return out


def _time(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def figures(t: Sums, priced: bool) -> FleetFigures:
    wall_gpu = sum(t.gpu_seconds.values()) / HOUR
    productive = t.gpu_seconds[PRODUCTIVE] / HOUR
    wall_hours = sum(t.seconds.values()) / HOUR
    faults_total = sum(t.faults.values())
    cost = None
    if priced:
        cost = FleetCost(
            wall=sum(t.cost.values()),
            productive=t.cost[PRODUCTIVE],
            lost={b: t.cost[b] for b in LOST_BUCKETS},
            unpriced_gpu_hours=t.unpriced_gpu_seconds / HOUR,
        )
    return FleetFigures(
        jobs=t.jobs,
        wall_hours=wall_hours,
        wall_gpu_hours=wall_gpu,
        productive_gpu_hours=productive,
        lost_gpu_hours={b: t.gpu_seconds[b] / HOUR for b in LOST_BUCKETS},
        ettr=min(1.0, productive / wall_gpu) if wall_gpu > 0 else None,
        faults=dict(sorted(t.faults.items(), key=lambda kv: (-kv[1], kv[0]))),
        faults_total=faults_total,
        mtbf_hours=wall_hours / faults_total if faults_total else None,
        cost=cost,
    )


def _top(job: JobFacts, t: Sums) -> TopJob:
    lost = {b: s / HOUR for b, s in t.gpu_seconds.items() if b != PRODUCTIVE and s > 0}
    wall = sum(t.gpu_seconds.values()) / HOUR
    productive = t.gpu_seconds[PRODUCTIVE] / HOUR
    return TopJob(
        job_id=job.id,
        name=job.name,
        project=job.project,
        status=job.status,
        labels={str(k): str(v) for k, v in job.labels.items()},
        gpus=t.gpus,
        wall_gpu_hours=wall,
        lost_gpu_hours=sum(lost.values()),
        lost_by_cause=dict(sorted(lost.items(), key=lambda kv: -kv[1])),
        ettr=min(1.0, productive / wall) if wall > 0 else None,
    )
