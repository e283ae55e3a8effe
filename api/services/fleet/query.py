"""The aggregation behind GET /v1/goodput: the summaries' seconds inside each range of a window, per group, in SQL.

Each range (each bucket, or the whole window without buckets) is read in four parts, unioned and summed per group:
    days       the whole UTC days inside it, from goodput_days (one row per job and day, a column per bucket);
    hours      the whole UTC hours of its partial days, from goodput_hours (the same, per hour);
    edges      the partial hours at its ends, from goodput_segments of those hours, clipped to the range;
    open       the running jobs' open tails, clipped to the range and to now.
So the rows read grow with the jobs and hours in the window, not with the events behind them. The jobs with time
in a range are counted from their summaries' wall time; faults from goodput_faults; the jobs that lost the most
from the same parts, summed per job. report.py makes the API's figures of these sums.
"""

from __future__ import annotations

import functools
import json
import math
import operator
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Float, Integer, and_, case, func, literal, null, select, text, union_all
from sqlalchemy.orm import Session

from api.database.tables import GoodputDay, GoodputFault, GoodputHour, GoodputSegment, GoodputSummary, Job
from api.services.fleet.pricing import Pricing
from api.services.fleet.summary import BUCKETS, DAY, HOUR

WHOLE = -1  # the whole window's range, beside the buckets' (job counts only)


@dataclass(frozen=True)
class Scope:
    """Which jobs: their projects (None: every project), labels they all carry, statuses they are in."""

    projects: Sequence[str] | None = None
    labels: dict[str, str] = field(default_factory=dict)
    statuses: Sequence[str] = ()


@dataclass(frozen=True)
class Window:
    since: float  # Unix seconds
    until: float
    now: float
    bucket_s: float | None = None

    def ranges(self) -> list[tuple[float, float]]:
        """The buckets, aligned to whole multiples of the bucket since the Unix epoch (UTC midnight for 1d) and
        clipped to the window; without a bucket, the window."""
        if not self.bucket_s:
            return [(self.since, self.until)]
        out = []
        lo = self.since
        while lo < self.until:
            hi = min((math.floor(lo / self.bucket_s) + 1) * self.bucket_s, self.until)
            out.append((lo, hi))
            lo = hi
        return out


@dataclass
class Sums:
    """Seconds per bucket over some jobs in one range (a group's), or over the window (a job's)."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))  # not weighted
    gpu_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    cost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))  # GPU-hours x price
    unpriced_gpu_seconds: float = 0.0
    faults: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    jobs: int = 0  # with any time in it
    gpus: int = 0  # a job's


@dataclass(frozen=True)
class JobFacts:
    """What the figures say of a job besides its sums."""

    id: str
    name: str
    project: str
    status: str
    labels: dict[str, Any]


@dataclass
class Found:
    ranges: list[tuple[float, float]]
    groups: dict[tuple[str | None, int], Sums]  # (group key, range index); WHOLE: the window, for the job counts
    top: list[tuple[JobFacts, Sums]]  # the jobs that lost the most GPU-hours over the window, most first


def _added(terms: list[Any]) -> Any:
    """terms[0] + terms[1] + ... as one SQL expression."""
    return functools.reduce(operator.add, terms)


def _least(a: Any, b: Any) -> Any:
    return case((a < b, a), else_=b)


def _greatest(a: Any, b: Any) -> Any:
    return case((a > b, a), else_=b)


def _table(session: Session, name: str, rows: list[tuple[int, float, float, float]]) -> Any:
    """`rows` (idx, lo, hi, hr) as a table in the query: a VALUES list of bound parameters on PostgreSQL (its planner
    then knows how many rows there are: a few ranges lead it to the indexes; and the statement's text, the same
    for the same number of rows, compiles once), JSON read by json_each on SQLite."""
    if session.get_bind().dialect.name == "postgresql":
        rows = rows or [(-1, 0.0, 0.0, 0.0)]
        listed = ", ".join(
            f"(CAST(:{name}_i{n} AS integer), CAST(:{name}_l{n} AS float8), CAST(:{name}_h{n} AS float8), "
            f"CAST(:{name}_r{n} AS float8))"
            for n in range(len(rows))
        )
        params = {}
        for n, (idx, lo, hi, hr) in enumerate(rows):
            params.update({f"{name}_i{n}": idx, f"{name}_l{n}": lo, f"{name}_h{n}": hi, f"{name}_r{n}": hr})
        clause = text(f"SELECT * FROM (VALUES {listed}) AS v(idx, lo, hi, hr)").bindparams(**params)  # noqa: S608
    else:
        param = f"{name}_rows"
        sql = (
            "SELECT json_extract(value, '$[0]') AS idx, json_extract(value, '$[1]') AS lo, "
            f"json_extract(value, '$[2]') AS hi, json_extract(value, '$[3]') AS hr FROM json_each(:{param})"
        )
        clause = text(sql).bindparams(**{param: json.dumps(rows)})
    return clause.columns(idx=Integer, lo=Float, hi=Float, hr=Float).subquery(name)


Rows = list[tuple[int, float, float, float]]  # (range index, lo, hi, the hour an edge is in)


def _split(ranges: list[tuple[float, float]]) -> tuple[Rows, Rows, Rows]:
    """Each range cut into whole UTC days (days), whole hours (hours) and partial hours (edges, with the hour each
    is in): a range reads a row per job and day, per job and hour at its partial days, and segments at its ends."""
    days: Rows = []
    hours: Rows = []
    edges: Rows = []

    def by_hour(idx: int, lo: float, hi: float) -> None:
        h0, h1 = math.ceil(lo / HOUR) * HOUR, math.floor(hi / HOUR) * HOUR
        if h0 <= h1:
            if h0 < h1:
                hours.append((idx, h0, h1, 0.0))
            if lo < h0:
                edges.append((idx, lo, h0, h0 - HOUR))
            if h1 < hi:
                edges.append((idx, h1, hi, h1))
        elif lo < hi:
            edges.append((idx, lo, hi, h1))

    for idx, (lo, hi) in enumerate(ranges):
        d0, d1 = math.ceil(lo / DAY) * DAY, math.floor(hi / DAY) * DAY
        if d0 < d1:
            days.append((idx, d0, d1, 0.0))
            by_hour(idx, lo, d0)
            by_hour(idx, d1, hi)
        else:
            by_hour(idx, lo, hi)
    return days, hours, edges


def key_of(group_by: str) -> Any:
    """The column a group_by groups by: a label's value (null without it), or the job's backend, status or project."""
    if group_by.startswith("label:"):
        return Job.labels[group_by.removeprefix("label:")].as_string()
    return {"backend": Job.backend, "status": Job.status, "project": Job.project}[group_by]


def _price(pricing: Pricing) -> Any:
    """A job's price per GPU-hour (null: not priced), from its labels."""
    default = literal(pricing.default, Float) if pricing.default is not None else null()
    if pricing.key is None or not pricing.by_value:
        return default
    value = Job.labels[pricing.key].as_string()
    return case(*((value == v, literal(p, Float)) for v, p in pricing.by_value.items()), else_=default)


def _scoped(query: Any, scope: Scope) -> Any:
    if scope.projects is not None:
        query = query.where(Job.project.in_(list(scope.projects)))
    for key, value in scope.labels.items():
        query = query.where(Job.labels[key].as_string() == value)
    if scope.statuses:
        query = query.where(Job.status.in_(list(scope.statuses)))
    return query


def aggregate(
    session: Session, window: Window, scope: Scope, *, group_by: str | None, pricing: Pricing, top: int
) -> Found:
    """Each group's seconds per bucket, GPU-seconds, cost, jobs and faults in each range of the window; and the jobs
    that lost the most."""
    if session.get_bind().dialect.name == "postgresql":
        # short queries on indexes: compiling them (JIT) or splitting them over workers costs more than it saves
        session.execute(text("SET LOCAL jit = off"))
        session.execute(text("SET LOCAL max_parallel_workers_per_gather = 0"))
    ranges = window.ranges()
    days, hours, edges = _split(ranges)
    daily, inner, edge = _table(session, "daily", days), _table(session, "inner", hours), _table(session, "edge", edges)
    full = _table(session, "full", [(idx, lo, hi, 0.0) for idx, (lo, hi) in enumerate(ranges)])
    d, h, s, g = GoodputDay, GoodputHour, GoodputSegment, GoodputSummary
    now = literal(window.now, Float)
    clipped = _least(s.end_s, edge.c.hi) - _greatest(s.start_s, edge.c.lo)
    tail = _least(now, full.c.hi) - _greatest(g.open_start_s, full.c.lo)
    parts = union_all(
        select(daily.c.idx, d.job_id, d.gpus, *(getattr(d, b).label(b) for b in BUCKETS)).join(
            daily, and_(d.day_s >= daily.c.lo, d.day_s < daily.c.hi)
        ),
        select(inner.c.idx, h.job_id, h.gpus, *(getattr(h, b).label(b) for b in BUCKETS)).join(
            inner, and_(h.hour_s >= inner.c.lo, h.hour_s < inner.c.hi)
        ),
        select(
            edge.c.idx, s.job_id, s.gpus, *(case((s.bucket == b, clipped), else_=0.0).label(b) for b in BUCKETS)
        ).join(edge, and_(s.hour_s == edge.c.hr, s.start_s < edge.c.hi, s.end_s > edge.c.lo)),
        select(full.c.idx, g.job_id, g.gpus, *(case((g.open_bucket == b, tail), else_=0.0).label(b) for b in BUCKETS))
        .join(full, and_(g.open_start_s < full.c.hi, g.open_start_s < now, full.c.lo < now))
        .where(g.open_bucket.is_not(None)),
    ).subquery("parts")
    # the jobs in scope, each with its group and price computed once (not once per row of its time)
    chosen_columns = [Job.id.label("id")]
    if group_by:
        chosen_columns.append(key_of(group_by).label("key"))
    if pricing.configured:
        chosen_columns.append(_price(pricing).label("price"))
    chosen = _scoped(select(*chosen_columns), scope).subquery("chosen")
    keys = [chosen.c.key] if group_by else []  # no group: one, keyed None
    price = chosen.c.price if pricing.configured else None
    weighted = [parts.c[b] * parts.c.gpus for b in BUCKETS]
    columns = [*(func.sum(parts.c[b]) for b in BUCKETS), *(func.sum(w) for w in weighted)]
    if price is not None:
        columns += [
            *(func.sum(w * price) for w in weighted),
            func.sum(case((price.is_(None), _added(weighted)), else_=0.0)),
        ]
    summed = select(*keys, parts.c.idx, *columns).select_from(parts.join(chosen, chosen.c.id == parts.c.job_id))
    groups: dict[tuple[str | None, int], Sums] = defaultdict(Sums)
    n = len(BUCKETS)
    for row in session.execute(summed.group_by(*keys, parts.c.idx)):
        key, idx, *got = [None, *row] if not keys else list(row)
        sums = groups[(key, idx)]
        sums.seconds = {b: v or 0.0 for b, v in zip(BUCKETS, got[:n], strict=True)}
        sums.gpu_seconds = {b: v or 0.0 for b, v in zip(BUCKETS, got[n : 2 * n], strict=True)}
        if pricing.configured:
            sums.cost = {b: (v or 0.0) / HOUR for b, v in zip(BUCKETS, got[2 * n : 3 * n], strict=True)}
            sums.unpriced_gpu_seconds = got[3 * n] or 0.0
    _count_jobs(session, window, ranges, chosen, keys, groups)
    f = GoodputFault
    faults = select(*keys, full.c.idx, f.cause, func.count()).select_from(
        f.__table__.join(full, and_(f.ts_s >= full.c.lo, f.ts_s < full.c.hi)).join(chosen, chosen.c.id == f.job_id)
    )
    for row in session.execute(faults.group_by(*keys, full.c.idx, f.cause)):
        key, idx, cause, count = [None, *row] if not keys else list(row)
        groups[(key, idx)].faults[cause] += count
    return Found(ranges, dict(groups), _top(session, parts, chosen, top) if top else [])


def _count_jobs(
    session: Session,
    window: Window,
    ranges: list[tuple[float, float]],
    chosen: Any,
    keys: list[Any],
    groups: dict[tuple[str | None, int], Sums],
) -> None:
    """Jobs with time in each range and in the whole window: those whose wall time overlaps it (it is theirs,
    partitioned: any overlap is time in some bucket), a running one's to now."""
    g = GoodputSummary
    spans = _table(
        session,
        "spans",
        [(idx, lo, hi, 0.0) for idx, (lo, hi) in [*enumerate(ranges), (WHOLE, (window.since, window.until))]],
    )
    now = literal(window.now, Float)
    end = case((g.open_bucket.is_not(None), now), else_=g.end_s)
    counted = (
        select(*keys, spans.c.idx, func.count())
        .select_from(g.__table__.join(chosen, chosen.c.id == g.job_id))
        .join(spans, and_(g.start_s < spans.c.hi, g.start_s < end, end > spans.c.lo))
        .where(g.start_s.is_not(None))
    )
    for row in session.execute(counted.group_by(*keys, spans.c.idx)):
        key, idx, count = [None, *row] if not keys else list(row)
        groups[(key, idx)].jobs = count


def _top(session: Session, parts: Any, chosen: Any, top: int) -> list[tuple[JobFacts, Sums]]:
    """The jobs that lost the most GPU-hours over the window (those that lost any), with their sums."""
    weighted = {b: func.sum(parts.c[b] * parts.c.gpus) for b in BUCKETS}
    lost = _added([w for b, w in weighted.items() if b != "productive"])
    ranked = (
        select(parts.c.job_id, func.max(parts.c.gpus), *(func.sum(parts.c[b]) for b in BUCKETS), *weighted.values())
        .select_from(parts.join(chosen, chosen.c.id == parts.c.job_id))
        .group_by(parts.c.job_id)
        .having(lost > 0)
        .order_by(lost.desc(), parts.c.job_id)
        .limit(top)
    )
    n = len(BUCKETS)
    found: list[tuple[str, Sums]] = []
    for job_id, gpus, *row in session.execute(ranked):
        sums = Sums(gpus=gpus or 0, jobs=1)
        sums.seconds = {b: v or 0.0 for b, v in zip(BUCKETS, row[:n], strict=True)}
        sums.gpu_seconds = {b: v or 0.0 for b, v in zip(BUCKETS, row[n:], strict=True)}
        found.append((job_id, sums))
    facts = select(Job.id, Job.name, Job.project, Job.status, Job.labels).where(Job.id.in_([j for j, _ in found]))
    jobs = {row[0]: JobFacts(row[0], row[1], row[2], row[3], dict(row[4] or {})) for row in session.execute(facts)}
    return [(jobs[job_id], sums) for job_id, sums in found if job_id in jobs]
