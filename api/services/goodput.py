"""Goodput: where a job's wall time went, computed from its events alone.

Wall time
    From the launch of attempt 0 (its `submitted` event; the earliest event if there is none) to the
    job's end event (`succeeded`, `failed` or `cancelled`), or to now while the job runs. Time queued
    before the launch is not the job's. Event times outside that span are clamped into it.

Runs
    A run is one start of the training loop: the `running` events of one (attempt, restart_count,
    iteration) — every rank sends one when its loop starts or resumes. A run starts when the last of
    its ranks reported (the loop's first collective waits for all of them). A run's window lasts
    until the next run starts, or until the end of wall time.

Failures
    Inside a window (and before the first run: the start-up window) the first sign of trouble ends
    training. Signals, by what they tell:
      * onset only: `fault_injected`;
      * onset and detection: `rank_failed` sent by a rank, `node_failed`;
      * detection, with the onset at the rank's last heartbeat (`ts - details.silent_s`, or the
        silence in the cause text): `hang_detected`, `heartbeat_lost`; a silence that began before
        the window's run started is about an earlier run and is skipped;
      * detection: `inprocess_restart`, `injob_restart`, `job_restart` — skipped when they end an
        earlier run (by restart_count, iteration, from_attempt), e.g. a restart recorded late.
    `rank_failed` observed by the launcher (details.source == "launcher") is no time signal: the
    supervisor records it in the same pass as the restart it causes, and its time may trail the
    next run's start. Its step still counts as progress evidence (below).
    onset = the earliest signal; detection = the earliest detection signal at or after the onset.
    A window with a signal is one failure.

Buckets (they partition wall time exactly; every second is in exactly one)
    initialization    start-up window up to the first run (or to the onset of a start-up failure)
    fault_detection   onset → detection (to the window's end while undetected)
    restart           detection → the next run's start (to the end when training never resumed):
                      teardown, relaunch, process start, rendezvous, checkpoint load; a job-level
                      restart's new attempt is in here until its first run
    checkpoint_stall  inside a run's training time: each save's blocking part, placed at
                      [ts - total_s, ts - total_s + blocking_s) of its `checkpoint_saved`
    recompute         inside a run's training time (stalls excluded): its first
                      (H - start_step) x step_time seconds, where H is the highest step the events
                      show reached before the run started (fault/failure/hang steps, failed_step
                      of restarts, checkpoint steps): steps redone after resuming from an older
                      checkpoint
    shutdown          a succeeded job's tail: from the end of its last run's final checkpoint
                      blocking (the trainer always saves the final state) to `succeeded`; without
                      a checkpoint in the last run, the tail stays productive
    productive        the rest of every run's training time
    Training time of a run = its start → its onset (or the window's end). ETTR = productive / wall.

Per attempt
    Attempt a > 0 starts at the `job_restart` that created it (else its `submitted`); attempt 0 at
    the wall start. The intervals above are split at those boundaries, so the attempts' buckets sum
    to the total's.

Step time
    Seconds per step, stalls excluded, from each run's progress points: (run start, start_step),
    (save start, checkpoint step), (onset, step of the fault or silence). Over all runs: the sum of
    each run's time to its furthest point over the sum of its steps.

Advice: api/services/checkpoint_advice.py.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.database.tables import Event, Job
from api.schemas.events import EventType, utcnow
from api.schemas.goodput import (
    LOST_BUCKETS,
    AttemptGoodput,
    Breakdown,
    GoodputOut,
)
from api.services import lifecycle
from api.services.checkpoint_advice import advise

PRODUCTIVE = "productive"
TERMINAL_TYPES = frozenset({EventType.succeeded, EventType.failed, EventType.cancelled})
SILENCE_TYPES = frozenset({EventType.hang_detected, EventType.heartbeat_lost})
RESTART_TYPES = frozenset({EventType.inprocess_restart, EventType.injob_restart, EventType.job_restart})
FAILURE_TYPES = frozenset({EventType.rank_failed, EventType.node_failed})
# Events whose step was current at their (onset) time.
PROGRESS_TYPES = FAILURE_TYPES | SILENCE_TYPES | {EventType.fault_injected}
# Every type the accounting reads; `running` is read aggregated per run (see load_records).
READ_TYPES = frozenset(
    {EventType.submitted, EventType.checkpoint_saved, EventType.fault_injected}
    | TERMINAL_TYPES
    | SILENCE_TYPES
    | RESTART_TYPES
    | FAILURE_TYPES
)
_SILENCE_IN_CAUSE = re.compile(r"no heartbeat for ([0-9]+(?:\.[0-9]+)?) s")


@dataclass(frozen=True)
class Record:
    """What the accounting reads of one event (a stored row, or one built by hand in a test)."""

    type: str
    ts: datetime
    attempt: int = 0
    step: int | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


# ---- reading the events --------------------------------------------------------------------------


def load_records(session: Session, job_id: str) -> list[Record]:
    """The job's events the accounting needs, with the per-rank kinds read aggregated: `running` one row per
    run (its last rank's time; a job of N ranks sends N per restart), and silences one row per detection
    pass (the supervisor stores a pass's hang_detected events with one time; a job-wide hang of N ranks is N
    events), carrying the longest silence and the highest step."""
    silent_s = Event.details["silent_s"].as_float()
    per_rank = [EventType.running.value, *(t.value for t in SILENCE_TYPES)]
    rows = session.execute(
        select(Event.type, Event.ts, Event.attempt, Event.step, Event.details).where(
            Event.job_id == job_id,
            Event.type.in_([t.value for t in READ_TYPES if t.value not in per_rank]),
        )
    ).all()
    records = [Record(t, ts, attempt, step, details or {}) for t, ts, attempt, step, details in rows]
    # silences without silent_s (recorded before it existed) are read one by one: their cause has it
    old = session.execute(
        select(Event.type, Event.ts, Event.attempt, Event.step, Event.details).where(
            Event.job_id == job_id, Event.type.in_([t.value for t in SILENCE_TYPES]), silent_s.is_(None)
        )
    ).all()
    records += [Record(t, ts, attempt, step, details or {}) for t, ts, attempt, step, details in old]
    passes = session.execute(
        select(Event.type, Event.ts, Event.attempt, func.max(Event.step), func.max(silent_s))
        .where(Event.job_id == job_id, Event.type.in_([t.value for t in SILENCE_TYPES]), silent_s.is_not(None))
        .group_by(Event.type, Event.ts, Event.attempt)
    ).all()
    for t, ts, attempt, step, silent in passes:
        records.append(Record(t, _aware(ts), attempt, step, {"silent_s": silent}))
    restart_count = Event.details["restart_count"].as_integer()
    iteration = Event.details["iteration"].as_integer()
    runs = session.execute(
        select(Event.attempt, restart_count, iteration, func.max(Event.ts), func.min(Event.step))
        .where(Event.job_id == job_id, Event.type == EventType.running.value)
        .group_by(Event.attempt, restart_count, iteration)
    ).all()
    for attempt, rc, it, ts, step in runs:
        details = {"restart_count": rc or 0, "iteration": it or 0, "start_step": step or 0}
        records.append(Record(EventType.running.value, _aware(ts), attempt, step, details))
    return records


def _aware(ts: datetime | str) -> datetime:
    if isinstance(ts, str):  # aggregates over SQLite come back as text
        ts = datetime.fromisoformat(ts)
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


def job_goodput(session: Session, job: Job, *, now: datetime | None = None) -> GoodputOut | None:
    """The goodput of `job`, or None before it was launched (no events yet)."""
    records = load_records(session, job.id)
    if not records:
        return None
    spec = lifecycle.spec_of(job)
    interval = spec.checkpoint.interval_steps if spec.checkpoint.engine != "none" else None
    return account(records, now=now or utcnow(), job_id=job.id, status=job.status, interval_steps=interval)


def empty(job: Job) -> GoodputOut:
    """A job without events (not launched yet): no wall time."""
    return account([], now=utcnow(), job_id=job.id, status=job.status)


# ---- the accounting ------------------------------------------------------------------------------


def _num(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _int(value: Any) -> int | None:
    number = _num(value)
    return int(number) if number is not None else None


Clock = Callable[[datetime], float]


@dataclass
class _Run:
    key: tuple[int, int, int]  # (attempt, restart_count, iteration)
    start: float
    start_step: int
    end: float = 0.0  # the window's end: the next run's start, or the end of wall time


@dataclass(frozen=True)
class _Signal:
    t: float
    onset: float | None  # where the trouble began, when the signal says
    detects: bool
    refers_to: tuple[int, ...] | None = None  # the run a restart event ends: (attempt[, restart_count[, iteration]])


@dataclass
class _Window:
    """The start-up window (run None) or one run's window."""

    start: float
    end: float
    run: _Run | None
    onset: float | None = None
    detected: float | None = None
    train_end: float = 0.0
    stalls: list[tuple[float, float]] = field(default_factory=list)


def account(
    records: Iterable[Record],
    *,
    now: datetime,
    job_id: str = "",
    status: str = "",
    interval_steps: int | None = None,
) -> GoodputOut:
    """The accounting of the module docstring over `records` (any order)."""
    recs = sorted(records, key=lambda r: r.ts)
    terminal = next((r for r in recs if r.type in TERMINAL_TYPES), None)
    launches = [r.ts for r in recs if r.type == EventType.submitted]
    origin = min(launches) if launches else (recs[0].ts if recs else now)
    end_ts = terminal.ts if terminal is not None else max(now, origin)
    wall = max(0.0, (end_ts - origin).total_seconds())

    def t(ts: datetime) -> float:
        """Seconds since the wall start, clamped into wall time."""
        return min(max((ts - origin).total_seconds(), 0.0), wall)

    runs = _runs(recs, t, wall)
    windows = [_Window(0.0, runs[0].start if runs else wall, None)] + [_Window(r.start, r.end, r) for r in runs]
    _place_signals(recs, t, windows)

    saves = _saves(recs, origin)
    if terminal is not None and terminal.type == EventType.succeeded and runs:
        _mark_shutdown(windows[-1], saves)
    for w in windows:
        w.stalls = _merge((max(s.begin, w.start), min(s.unblocked, w.train_end)) for s in saves)
    step_time = _step_time(windows, saves, recs, t)

    # Intervals, labelled; together they cover [0, wall] once.
    intervals: list[tuple[float, float, str]] = []
    evidence = sorted(_step_evidence(recs, t, saves))
    seen = 0
    high = -1
    recomputed_steps = 0
    for w in windows:
        if w.run is None:
            intervals.append((w.start, w.train_end, "initialization"))
        else:
            while seen < len(evidence) and evidence[seen][0] < w.start:
                high = max(high, evidence[seen][1])
                seen += 1
            free = _subtract(w.start, w.train_end, w.stalls)
            redo_steps = max(0, high - w.run.start_step)
            redo = min(redo_steps * step_time, sum(e - b for b, e in free)) if step_time else 0.0
            if step_time and redo_steps:
                recomputed_steps += min(redo_steps, round(redo / step_time))
            intervals.extend((b, e, "checkpoint_stall") for b, e in w.stalls)
            for b, e in free:
                take = min(redo, e - b)
                if take > 0:
                    intervals.append((b, b + take, "recompute"))
                    redo -= take
                intervals.append((b + take, e, PRODUCTIVE))
        if w.onset is not None:
            detected = w.detected if w.detected is not None else w.end
            intervals.append((w.onset, detected, "fault_detection"))
            intervals.append((detected, w.end, "restart"))
        elif w.train_end < w.end:
            intervals.append((w.train_end, w.end, "shutdown"))

    # Attempts: attempt a > 0 starts at the job_restart that created it (else at its launch).
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

    failed = [w for w in windows if w.onset is not None]
    failures_in = [0] * len(attempt_ids)
    for w in failed:
        at = w.detected if w.detected is not None else w.onset
        failures_in[max(0, bisect.bisect_right(edges[:-1], at or 0.0) - 1)] += 1

    attempts = [
        AttemptGoodput(
            attempt=a,
            start=origin + timedelta(seconds=edges[i]),
            end=origin + timedelta(seconds=edges[i + 1]),
            failures=failures_in[i],
            **_breakdown(edges[i + 1] - edges[i], per_attempt[i]).model_dump(),
        )
        for i, a in enumerate(attempt_ids)
    ]
    overall = _breakdown(wall, total)
    advice = advise(
        [s.blocking for s in saves],
        wall=wall,
        failures=len(failed),
        recovery_s=overall.lost_s["fault_detection"] + overall.lost_s["restart"],
        step_time=step_time,
        interval_steps=interval_steps,
    )
    return GoodputOut(
        job_id=job_id,
        status=status,
        finished=terminal is not None,
        start=origin if recs else None,
        end=end_ts if recs else None,
        failures=len(failed),
        step_time_s=step_time,
        recomputed_steps=recomputed_steps,
        attempts=attempts,
        advice=advice,
        **overall.model_dump(),
    )


def _runs(recs: Sequence[Record], t: Clock, wall: float) -> list[_Run]:
    """One run per (attempt, restart_count, iteration), started when its last rank reported."""
    by_key: dict[tuple[int, int, int], _Run] = {}
    for r in recs:
        if r.type != EventType.running:
            continue
        key = (r.attempt, _int(r.details.get("restart_count")) or 0, _int(r.details.get("iteration")) or 0)
        start_step = _int(r.details.get("start_step"))
        start_step = start_step if start_step is not None else (r.step or 0)
        held = by_key.get(key)
        if held is None:
            by_key[key] = _Run(key, t(r.ts), start_step)
        else:
            held.start = max(held.start, t(r.ts))
            held.start_step = min(held.start_step, start_step)
    runs = sorted(by_key.values(), key=lambda run: (run.start, run.key))
    for i, run in enumerate(runs):
        run.end = runs[i + 1].start if i + 1 < len(runs) else wall
    return runs


def _place_signals(recs: Sequence[Record], t: Clock, windows: Sequence[_Window]) -> None:
    """Each failure signal goes to the window its time falls in: the window's onset and detection."""
    starts = [w.start for w in windows[1:]]
    for r in recs:
        signal = _signal(r, t(r.ts))
        if signal is None:
            continue
        window = windows[bisect.bisect_right(starts, signal.t)]
        run = window.run
        if run is not None and signal.refers_to is not None and signal.refers_to < run.key[: len(signal.refers_to)]:
            continue  # a restart that ends an earlier run, recorded late
        onset = signal.onset
        if onset is not None and onset < window.start:
            if r.type in SILENCE_TYPES and run is not None:
                continue  # silent since before this run started: about an earlier run
            onset = window.start
        if onset is not None and (window.onset is None or onset < window.onset):
            window.onset = onset
        if signal.detects and (window.detected is None or signal.t < window.detected):
            window.detected = signal.t
    for w in windows:
        if w.onset is None and w.detected is not None:
            w.onset = w.detected
        if w.detected is not None and w.onset is not None and w.detected < w.onset:
            w.detected = w.onset
        w.train_end = w.onset if w.onset is not None else w.end


def _signal(r: Record, at: float) -> _Signal | None:
    kind = r.type
    if kind == EventType.fault_injected:
        return _Signal(at, onset=at, detects=False)
    if kind in FAILURE_TYPES:
        if r.details.get("source") == "launcher":
            return None
        return _Signal(at, onset=at, detects=True)
    if kind in SILENCE_TYPES:
        silent = _silence(r.details)
        return _Signal(at, onset=at - silent if silent is not None else at, detects=True)
    if kind == EventType.injob_restart:
        count = _int(r.details.get("restart_count"))
        return _Signal(at, onset=None, detects=True, refers_to=(r.attempt, count - 1) if count else None)
    if kind == EventType.inprocess_restart:
        iteration = _int(r.details.get("iteration"))
        count = _int(r.details.get("restart_count")) or 0
        return _Signal(at, onset=None, detects=True, refers_to=(r.attempt, count, iteration - 1) if iteration else None)
    if kind == EventType.job_restart:
        source = _int(r.details.get("from_attempt"))
        return _Signal(at, onset=None, detects=True, refers_to=(source if source is not None else r.attempt - 1,))
    return None


def _silence(details: Mapping[str, Any]) -> float | None:
    """How long the rank had been silent when the hang was detected."""
    silent = _num(details.get("silent_s"))
    if silent is None:
        match = _SILENCE_IN_CAUSE.search(str(details.get("cause") or ""))
        silent = float(match.group(1)) if match else None
    return silent if silent is not None and silent >= 0 else None


def _onset_time(r: Record, t: Clock) -> float:
    """When the step of a fault or silence event was current: a hang's step is its last heartbeat's."""
    at = t(r.ts)
    if r.type in SILENCE_TYPES:
        silent = _silence(r.details)
        at = at - silent if silent is not None else at
    return at


@dataclass(frozen=True)
class _Save:
    begin: float  # when the save started: the step was done
    unblocked: float  # begin + blocking_s: training went on
    step: int | None
    blocking: float


def _saves(recs: Sequence[Record], origin: datetime) -> list[_Save]:
    out = []
    for r in recs:
        if r.type != EventType.checkpoint_saved:
            continue
        blocking = _num(r.details.get("blocking_s"))
        if blocking is None or blocking < 0:
            continue
        total = _num(r.details.get("total_s"))
        step = _int(r.details.get("step"))
        done = (r.ts - origin).total_seconds()
        begin = done - max(total if total is not None else blocking, blocking)
        out.append(_Save(begin, begin + blocking, step if step is not None else r.step, blocking))
    return out


def _mark_shutdown(last: _Window, saves: Sequence[_Save]) -> None:
    """A succeeded job's last run ends training when its final save stops blocking."""
    finals = [s for s in saves if last.start <= s.begin and s.unblocked <= last.train_end]
    if last.onset is None and finals:
        last.train_end = max(last.start, finals[-1].unblocked)


def _step_time(windows: Sequence[_Window], saves: Sequence[_Save], recs: Sequence[Record], t: Clock) -> float | None:
    """Seconds per step, stalls excluded: each run's time to its furthest progress point over its steps."""
    busy_total = 0.0
    steps_total = 0
    for w in windows:
        if w.run is None:
            continue
        points = [(s.begin, s.step) for s in saves if s.step is not None]
        points += [
            (_onset_time(r, t), r.step)
            for r in recs
            if r.step is not None
            and r.type in PROGRESS_TYPES
            and r.details.get("source") != "launcher"  # observed late: its time is no step's time
        ]
        inside = [(at, step) for at, step in points if w.start <= at <= w.train_end and step > w.run.start_step]
        if not inside:
            continue
        at, step = max(inside, key=lambda p: p[1])
        busy = at - w.start - _overlap(w.stalls, w.start, at)
        if busy > 0:
            busy_total += busy
            steps_total += step - w.run.start_step
    return busy_total / steps_total if steps_total else None


def _step_evidence(recs: Sequence[Record], t: Clock, saves: Sequence[_Save]) -> Iterable[tuple[float, int]]:
    """(time, step): a step the job is known to have reached by then (for the high-water mark H)."""
    for r in recs:
        if r.type in RESTART_TYPES:
            steps = [r.step, _int(r.details.get("failed_step"))]
        elif r.type in PROGRESS_TYPES:
            steps = [r.step]
        elif r.type == EventType.running:
            steps = [r.step, _int(r.details.get("start_step"))]
        else:
            continue
        yield from ((t(r.ts), s) for s in steps if s is not None)
    yield from ((max(0.0, s.begin), s.step) for s in saves if s.step is not None)


def _merge(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for b, e in sorted(s for s in spans if s[1] > s[0]):
        if out and b <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((b, e))
    return out


def _overlap(spans: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(e, hi) - max(b, lo)) for b, e in spans)


def _subtract(lo: float, hi: float, spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """[lo, hi) minus the merged, sorted spans (which lie inside it)."""
    out = []
    at = lo
    for b, e in spans:
        if b > at:
            out.append((at, b))
        at = max(at, e)
    if at < hi:
        out.append((at, hi))
    return out


def _breakdown(wall: float, seconds: Mapping[str, float]) -> Breakdown:
    productive = seconds.get(PRODUCTIVE, 0.0)
    return Breakdown(
        wall_s=wall,
        productive_s=productive,
        lost_s={name: seconds.get(name, 0.0) for name in LOST_BUCKETS},
        ettr=min(1.0, productive / wall) if wall > 0 else None,
    )
