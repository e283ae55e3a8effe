"""The accounting: runs and their windows, failure signals, checkpoint stalls, step time and the labelled
intervals that partition wall time (the rules are in the package docstring, api/services/goodput/__init__.py)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from api.schemas.events import EventType
from api.schemas.goodput import GoodputOut
from api.services.goodput.advice import advise
from api.services.goodput.attempts import PRODUCTIVE, Clock, Interval, split
from api.services.goodput.launcher_phases import launcher_phases
from api.services.goodput.records import (
    FAILURE_TYPES,
    PROGRESS_TYPES,
    RESTART_TYPES,
    SILENCE_TYPES,
    TERMINAL_TYPES,
    Record,
)
from api.services.goodput.rolling import rolling
from api.services.goodput.stragglers import carve_stragglers, episode_spans


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

    intervals, recomputed_steps = _intervals(windows, sorted(_step_evidence(recs, t, saves)), step_time)
    intervals = _carve(intervals, _queued_spans(recs, t, wall), QUEUED_FROM, "queued")
    intervals = carve_stragglers(intervals, episode_spans(recs, t, wall))
    failed = [w for w in windows if w.onset is not None]
    overall, attempts = split(recs, t, origin, wall, intervals, [_failure_time(w) for w in failed])
    advice = advise(
        [s.blocking for s in saves],
        wall=wall,
        failures=len(failed),
        recovery_s=overall.lost_s["fault_detection"] + overall.lost_s["restart"],
        step_time=step_time,
        interval_steps=interval_steps,
        straggler_s=overall.lost_s["straggler"],
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
        rolling=rolling(intervals, wall),
        launcher_phases=launcher_phases(recs),
        advice=advice,
        **overall.model_dump(),
    )


def _intervals(
    windows: Sequence[_Window], evidence: Sequence[tuple[float, int]], step_time: float | None
) -> tuple[list[Interval], int]:
    """The labelled intervals (together they cover [0, wall] once) and the steps recomputed."""
    intervals: list[Interval] = []
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

    return intervals, recomputed_steps


# The buckets a queue wait is carved out of: the time before a run (nothing trains while the attempt is queued).
QUEUED_FROM = frozenset({"initialization", "restart"})


def _queued_spans(recs: Sequence[Record], t: Clock, wall: float) -> list[tuple[float, float]]:
    """[begin, end) of each wait in a queue: from a `queued` event (queue_state waiting) to the same attempt's
    admission (queue_state admitted), else to the next start of a run, job restart or the job's end."""
    spans: list[tuple[float, float]] = []
    waiting: dict[int, float] = {}
    for r in recs:
        if r.type == EventType.queued:
            state = r.details.get("queue_state")
            if state == "waiting":
                waiting.setdefault(r.attempt, t(r.ts))
            elif state == "admitted" and r.attempt in waiting:
                spans.append((waiting.pop(r.attempt), t(r.ts)))
        elif r.type in (EventType.running, EventType.job_restart) or r.type in TERMINAL_TYPES:
            for attempt in [a for a in waiting if a <= r.attempt]:
                spans.append((waiting.pop(attempt), t(r.ts)))
    spans += [(begin, wall) for begin in waiting.values()]
    return _merge(spans)


def _carve(
    intervals: Sequence[Interval], spans: Sequence[tuple[float, float]], buckets: frozenset[str], label: str
) -> list[Interval]:
    """The intervals, with the parts of those in `buckets` that fall inside `spans` relabelled `label`
    (the partition of wall time is kept: parts are split, never added or dropped)."""
    out: list[Interval] = []
    for b, e, bucket in intervals:
        if bucket not in buckets or not spans:
            out.append((b, e, bucket))
            continue
        at = b
        for sb, se in spans:
            lo, hi = max(sb, b), min(se, e)
            if hi <= lo:
                continue
            if lo > at:
                out.append((at, lo, bucket))
            out.append((lo, hi, label))
            at = hi
        if at < e:
            out.append((at, e, bucket))
    return out


def _failure_time(w: _Window) -> float:
    """When a failed window's failure counts: its detection, else its onset."""
    at = w.detected if w.detected is not None else w.onset
    return at or 0.0


def _runs(recs: Sequence[Record], t: Clock, wall: float) -> list[_Run]:
    """One run per (attempt, restart_count, iteration), started when its last rank reported. Where a run's ranks
    said `running` themselves, the node agent's inferred `running` (details.source "agent", for ranks that did not
    say so in time) is not counted: it cannot know the step resumed from, and would make the run start at step 0."""
    said = {_run_key(r) for r in recs if r.type == EventType.running and r.details.get("source") != "agent"}
    by_key: dict[tuple[int, int, int], _Run] = {}
    for r in recs:
        if r.type != EventType.running:
            continue
        key = _run_key(r)
        if key in said and r.details.get("source") == "agent":
            continue
        start_step = r.integer("start_step")
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


def _run_key(r: Record) -> tuple[int, int, int]:
    return (r.attempt, r.integer("restart_count") or 0, r.integer("iteration") or 0)


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
        if r.details.get("kind") == "slowdown":
            return None  # nothing stops: a straggler, counted in its own bucket
        return _Signal(at, onset=at, detects=False)
    if kind in FAILURE_TYPES:
        if r.details.get("source") == "launcher":
            return None
        return _Signal(at, onset=at, detects=True)
    if kind in SILENCE_TYPES:
        silent = _silence(r)
        return _Signal(at, onset=at - silent if silent is not None else at, detects=True)
    if kind == EventType.injob_restart:
        count = r.integer("restart_count")
        return _Signal(at, onset=None, detects=True, refers_to=(r.attempt, count - 1) if count else None)
    if kind == EventType.inprocess_restart:
        iteration = r.integer("iteration")
        count = r.integer("restart_count") or 0
        return _Signal(at, onset=None, detects=True, refers_to=(r.attempt, count, iteration - 1) if iteration else None)
    if kind == EventType.job_restart:
        source = r.integer("from_attempt")
        return _Signal(at, onset=None, detects=True, refers_to=(source if source is not None else r.attempt - 1,))
    return None


def _silence(r: Record) -> float | None:
    """How long the rank had been silent when the hang was detected (`silent_s`; unknown without it)."""
    silent = r.number("silent_s")
    return silent if silent is not None and silent >= 0 else None


def _onset_time(r: Record, t: Clock) -> float:
    """When the step of a fault or silence event was current: a hang's step is its last heartbeat's."""
    at = t(r.ts)
    if r.type in SILENCE_TYPES:
        silent = _silence(r)
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
        blocking = r.number("blocking_s")
        if blocking is None or blocking < 0:
            continue
        total = r.number("total_s")
        step = r.integer("step")
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
            steps = [r.step, r.integer("failed_step")]
        elif r.type in PROGRESS_TYPES:
            steps = [r.step]
        elif r.type == EventType.running:
            steps = [r.step, r.integer("start_step")]
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
