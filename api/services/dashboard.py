"""Read models for the dashboard: jobs with restart counts, a job's timeline and progress,
checkpoints, rank liveness, and goodput."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api import models
from api.database.tables import Event, Job, JobWatch
from api.schemas.events import EventType, utcnow
from api.schemas.jobs import JobProgress
from api.schemas.rungs import RESTART_TYPES
from api.services import lifecycle
from api.services.goodput.records import number
from api.services.goodput_view import GoodputView, goodput_of
from api.services.ingest import liveness_writer
from api.services.job_liveness_view import NodesView, RanksView, nodes_view, ranks_view
from api.services.progress import progress_of

# the ladder's rungs, lowest first, as the jobs list and a job's page count them: (event, short name)
RUNGS: tuple[tuple[EventType, str], ...] = tuple(
    (rung.event, rung.name.removesuffix(" restart")) for rung in lifecycle.LADDER
)

LANES: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "lifecycle",
        frozenset(
            {
                EventType.submitted,
                EventType.scheduled,
                EventType.queued,
                EventType.running,
                EventType.succeeded,
                EventType.failed,
                EventType.cancelled,
            }
        ),
    ),
    (
        "faults",
        frozenset(
            {
                EventType.fault_injected,
                EventType.rank_failed,
                EventType.node_failed,
                EventType.heartbeat_lost,
                EventType.hang_detected,
                EventType.node_excluded,
                EventType.node_unhealthy,
                EventType.scheduling_failed,
                EventType.preempted,
                EventType.spares_exhausted,
                EventType.spare_unavailable,
                EventType.straggler_detected,
                EventType.straggler_cleared,
                EventType.restart_storm,
                EventType.progress_stalled,
                EventType.recovery_stuck,
            }
        ),
    ),
    ("restarts", RESTART_TYPES),
    ("checkpoints", frozenset({EventType.checkpoint_saved, EventType.checkpoint_loaded})),
)
# Failures whose rank's lines the page links to (a restart or an end names its root cause's rank).
FAILURE_TYPES = frozenset({EventType.rank_failed, EventType.hang_detected, EventType.failed}) | RESTART_TYPES
# Whose cause may carry a tail: the node agent's failure context, so a rung the ranks climb themselves has none.
TAILED = frozenset({rung.event for rung in lifecycle.LADDER if rung.runs_in != "trainer"} | {EventType.failed})
TIMELINE_EVENTS_MAX = 2000
TIMELINE_WIDTH = 1000.0
LANE_HEIGHT = 28.0
LABEL_WIDTH = 90.0


# ---- jobs list ---------------------------------------------------------------------------------


@dataclass
class JobRow:
    job: Job
    restarts: dict[str, int]
    goodput: GoodputView | None
    stragglers: int = 0  # straggler episodes open now (the badge)

    @property
    def total_restarts(self) -> int:
        return sum(self.restarts.values())


def restart_counts(session: Session, job_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {j: {t.value: 0 for t, _ in RUNGS} for j in job_ids}
    if not job_ids:
        return counts
    rows = session.execute(
        select(Event.job_id, Event.type, func.count())
        .where(Event.job_id.in_(list(job_ids)), Event.type.in_([t.value for t, _ in RUNGS]))
        .group_by(Event.job_id, Event.type)
    )
    for job_id, event_type, count in rows:
        counts[job_id][event_type] = int(count)
    return counts


def job_rows(
    session: Session, *, status: str | None = None, limit: int = 100, projects: Sequence[str] | None = None
) -> list[JobRow]:
    """The newest jobs of these `projects` (None: every project)."""
    jobs, _ = models.jobs.page(session, statuses=[status] if status else [], limit=limit, projects=projects)
    counts = restart_counts(session, [j.id for j in jobs])
    open_episodes = open_stragglers(session, [j.id for j in jobs if j.status in lifecycle.ACTIVE])
    return [JobRow(j, counts[j.id], goodput_of(session, j), open_episodes.get(j.id, 0)) for j in jobs]


def open_stragglers(session: Session, job_ids: Sequence[str]) -> dict[str, int]:
    """Straggler episodes open now, per job (only those with any)."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(JobWatch.job_id, JobWatch.open_stragglers).where(
            JobWatch.job_id.in_(list(job_ids)), JobWatch.open_stragglers > 0
        )
    )
    return {job_id: int(count) for job_id, count in rows}


# ---- one job -----------------------------------------------------------------------------------


@dataclass
class Marker:
    x: float
    y: float
    type: str
    title: str
    restart: bool
    logs: str | None = None  # the failing rank's lines around it: the job page's query (logs_query)
    more: int = 0  # events of its type drawn at the same point (a start's `running` from every node)


@dataclass
class Timeline:
    start: datetime
    end: datetime
    lanes: list[tuple[str, float]]
    markers: list[Marker]
    restart_xs: list[tuple[float, str]]
    ticks: list[tuple[float, str]]
    height: float
    truncated: bool = False


@dataclass(frozen=True)
class CheckpointRow:
    ts: datetime
    attempt: int
    step: int | None
    blocking_s: float | None
    total_s: float | None
    bytes: int | None


@dataclass
class JobView:
    job: Job
    restarts: dict[str, int]
    timeline: Timeline
    progress: dict[str, Any]
    checkpoints: list[CheckpointRow]
    ranks: RanksView
    heartbeat_timeout_s: float
    goodput: GoodputView | None
    recent: list[Event] = field(default_factory=list)
    steps: JobProgress | None = None
    nodes: NodesView | None = None
    last_failure: Event | None = None  # the newest restart or end whose cause carries its rank's last lines

    @property
    def terminal(self) -> bool:
        return self.job.status in lifecycle.TERMINAL


def _cause(event: Event) -> str:
    details = event.details or {}
    cause = details.get("cause") or details.get("reason") or details.get("kind")
    return str(cause) if cause else ""


def describe(event: Event) -> str:
    parts = [event.type.replace("_", " ")]
    where = [f"rank {event.rank}" if event.rank is not None else "", event.node or ""]
    where += [f"step {event.step}" if event.step is not None else "", f"attempt {event.attempt}"]
    parts.append("(" + ", ".join(w for w in where if w) + ")")
    cause = _cause(event)
    if cause:
        parts.append(f": {cause}")
    return " ".join(parts)


def logs_query(event: Event) -> str | None:
    """For a failure that names a rank (its own, or its cause's): the job page's query that opens the logs panel on
    that rank's lines around it, in the attempt that failed (a job restart's event is the next attempt's)."""
    details = event.details or {}
    rank = event.rank if event.rank is not None else details.get("rank")
    if event.type not in FAILURE_TYPES or not isinstance(rank, int) or isinstance(rank, bool):
        return None
    attempt = details.get("from_attempt", event.attempt)
    return urlencode({"rank": rank, "attempt": attempt, "around": event.ts.isoformat()})


def _ticks(start: datetime, end: datetime, count: int = 6) -> list[tuple[float, str]]:
    span = (end - start).total_seconds()
    fmt = "%H:%M:%S" if span < 86400 else "%m-%d %H:%M"
    return [
        (
            LABEL_WIDTH + (TIMELINE_WIDTH - LABEL_WIDTH) * i / (count - 1),
            (start + timedelta(seconds=span * i / (count - 1))).strftime(fmt),
        )
        for i in range(count)
    ]


def timeline(job: Job, events: Sequence[Event], now: datetime) -> Timeline:
    truncated = len(events) >= TIMELINE_EVENTS_MAX
    start = min([job.created_at, *(e.ts for e in events)])
    end = max([job.finished_at or now, *(e.ts for e in events)])
    if (end - start).total_seconds() < 1:
        end = start + timedelta(seconds=1)
    span = (end - start).total_seconds()
    usable = TIMELINE_WIDTH - LABEL_WIDTH - 10
    lanes = [(name, 20 + LANE_HEIGHT * i + LANE_HEIGHT / 2) for i, (name, _) in enumerate(LANES)]
    lane_y = {t: y for (name, types), (_, y) in zip(LANES, lanes, strict=True) for t in types}
    markers: list[Marker] = []
    drawn: dict[tuple[int, float, str], Marker] = {}  # one marker a type a point: 16,384 nodes' `running` are one
    restart_xs: list[tuple[float, str]] = []
    for e in events:
        x = LABEL_WIDTH + usable * (e.ts - start).total_seconds() / span
        y = lane_y.get(e.type, lanes[1][1])
        restart = e.type in RESTART_TYPES
        same = drawn.get((round(x), y, e.type))
        if same is not None and not restart:
            same.more += 1
            continue
        title = f"{e.ts.strftime('%H:%M:%S')} {describe(e)}"
        markers.append(marker := Marker(round(x, 1), y, e.type, title, restart, logs_query(e)))
        drawn[(round(x), y, e.type)] = marker
        if restart:
            restart_xs.append((round(x, 1), title))
    height = 20 + LANE_HEIGHT * len(LANES) + 22
    return Timeline(start, end, lanes, markers, restart_xs, _ticks(start, end), height, truncated)


def progress(events: Sequence[Event], start: datetime) -> dict[str, Any]:
    """uPlot data: steps reached over time (from events carrying a step) and restart times."""
    points = [(e.ts, e.step) for e in events if e.step is not None]
    return {
        "t": [round(ts.timestamp(), 3) for ts, _ in points],
        "step": [step for _, step in points],
        "restarts": [
            {"t": round(e.ts.timestamp(), 3), "type": e.type, "label": describe(e)}
            for e in events
            if e.type in RESTART_TYPES
        ],
        "start": round(start.timestamp(), 3),
    }


def checkpoints(events: Sequence[Event]) -> list[CheckpointRow]:
    rows = []
    for e in events:
        if e.type != EventType.checkpoint_saved:
            continue
        d = e.details or {}
        size = d.get("bytes")
        rows.append(
            CheckpointRow(
                ts=e.ts,
                attempt=e.attempt,
                step=e.step if e.step is not None else d.get("step"),
                blocking_s=number(d.get("blocking_s")),
                total_s=number(d.get("total_s")),
                bytes=int(size) if isinstance(size, int | float) and not isinstance(size, bool) else None,
            )
        )
    return rows[::-1]


def job_view(session: Session, job: Job) -> JobView:
    liveness_writer.flush()  # this process's newest reports
    now = utcnow()
    events = models.events.newest(session, job.id, TIMELINE_EVENTS_MAX)
    spec = lifecycle.spec_of(job)
    tl = timeline(job, events, now)
    return JobView(
        job=job,
        restarts=restart_counts(session, [job.id])[job.id],
        timeline=tl,
        progress=progress(events, tl.start),
        checkpoints=checkpoints(events),
        ranks=ranks_view(
            session,
            job,
            spec.world_size,
            spec.resiliency.heartbeat_timeout_s,
            now,
            spec.resiliency.stragglers.threshold,
        ),
        heartbeat_timeout_s=spec.resiliency.heartbeat_timeout_s,
        goodput=goodput_of(session, job),
        recent=list(events[-30:])[::-1],
        steps=progress_of(session, job),
        nodes=nodes_view(session, job, spec.resiliency.heartbeat_timeout_s, now),
        last_failure=next((e for e in reversed(events) if e.type in TAILED and "tail" in (e.details or {})), None),
    )
