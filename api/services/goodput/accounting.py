"""The accounting: from the runs' windows (windows.py), checkpoint stalls and step time, the labelled intervals
that partition wall time, and the job's goodput (the rules are in the package docstring,
api/services/goodput/__init__.py)."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from api.schemas.events import EventType
from api.schemas.goodput import GoodputOut, RunStart
from api.schemas.rungs import RESTART_TYPES
from api.services.goodput.advice import advise
from api.services.goodput.attempts import PRODUCTIVE, Clock, Interval, split
from api.services.goodput.launcher_phases import launcher_phases
from api.services.goodput.records import (
    PROGRESS_TYPES,
    TERMINAL_TYPES,
    Record,
)
from api.services.goodput.rolling import rolling
from api.services.goodput.stragglers import carve_stragglers, episode_spans
from api.services.goodput.windows import Run, Window, failure_time, onset_time, place_signals, runs_of


@dataclass(frozen=True)
class Ledger:
    """Where a job's wall time went, as labelled intervals: what `account` sums, and what the fleet's summaries
    store (api/services/fleet/). Times are seconds since `origin`, the wall start."""

    recs: list[Record]  # the records, by time
    origin: datetime
    end: datetime  # the job's end event, or now
    wall: float
    terminal: Record | None
    runs: list[Run]
    saves: list[_Save]
    step_time: float | None
    intervals: list[Interval]  # together they cover [0, wall] once
    recomputed_steps: int | None
    failed: list[Window]  # the windows a failure ended, in time order

    def t(self, ts: datetime) -> float:
        """Seconds since the wall start, clamped into wall time."""
        return min(max((ts - self.origin).total_seconds(), 0.0), self.wall)


def ledger(records: Iterable[Record], *, now: datetime) -> Ledger:
    """The labelled intervals of the module docstring's rules over `records` (any order)."""
    recs = sorted(records, key=lambda r: r.ts)
    terminal = next((r for r in recs if r.type in TERMINAL_TYPES), None)
    launches = [r.ts for r in recs if r.type == EventType.submitted]
    origin = min(launches) if launches else (recs[0].ts if recs else now)
    end_ts = terminal.ts if terminal is not None else max(now, origin)
    wall = max(0.0, (end_ts - origin).total_seconds())

    def t(ts: datetime) -> float:
        """Seconds since the wall start, clamped into wall time."""
        return min(max((ts - origin).total_seconds(), 0.0), wall)

    runs = runs_of(recs, t, wall)
    windows = [Window(0.0, runs[0].start if runs else wall, None)] + [Window(r.start, r.end, r) for r in runs]
    place_signals(recs, t, windows)

    saves = _saves(recs, origin)
    for w in windows:
        w.stalls = _merge((max(s.begin, w.start), min(s.unblocked, w.train_end)) for s in saves)
    step_time = _step_time(windows, saves, recs, t)
    if terminal is not None and terminal.type == EventType.succeeded and runs:
        _mark_shutdown(windows[-1], saves, terminal.integer("final_step"), step_time)

    intervals, recomputed_steps = _intervals(windows, sorted(_step_evidence(recs, t, saves)), step_time)
    intervals = _carve(intervals, _queued_spans(recs, t, wall), QUEUED_FROM, "queued")
    intervals = carve_stragglers(intervals, episode_spans(recs, t, wall))
    failed = [w for w in windows if w.onset is not None]
    return Ledger(recs, origin, end_ts, wall, terminal, runs, saves, step_time, intervals, recomputed_steps, failed)


def account(
    records: Iterable[Record],
    *,
    now: datetime,
    job_id: str = "",
    status: str = "",
    interval_steps: int | None = None,
) -> GoodputOut:
    """The accounting of the module docstring over `records` (any order)."""
    led = ledger(records, now=now)
    recs, origin, wall, saves = led.recs, led.origin, led.wall, led.saves
    overall, attempts = split(recs, led.t, origin, wall, led.intervals, [failure_time(w) for w in led.failed])
    advice = advise(
        [s.blocking for s in saves],
        wall=wall,
        failures=len(led.failed),
        recovery_s=overall.lost_s["fault_detection"] + overall.lost_s["restart"],
        step_time=led.step_time,
        interval_steps=_interval(saves) or interval_steps,
        straggler_s=overall.lost_s["straggler"],
        interval_measured=_interval(saves) is not None,
    )
    return GoodputOut(
        job_id=job_id,
        status=status,
        finished=led.terminal is not None,
        start=origin if recs else None,
        end=led.end if recs else None,
        failures=len(led.failed),
        step_time_s=led.step_time,
        recomputed_steps=led.recomputed_steps,
        runs=[
            RunStart.model_validate(
                {
                    "attempt": r.key[0],
                    "restart_count": r.key[1],
                    "iteration": r.key[2],
                    "start": origin + timedelta(seconds=r.start),
                    "start_step": r.start_step,
                    "basis": r.basis,
                }
            )
            for r in led.runs
        ],
        attempts=attempts,
        rolling=rolling(led.intervals, wall),
        launcher_phases=launcher_phases(recs),
        advice=advice,
        **overall.model_dump(),
    )


def _intervals(
    windows: Sequence[Window], evidence: Sequence[tuple[float, int]], step_time: float | None
) -> tuple[list[Interval], int | None]:
    """The labelled intervals (together they cover [0, wall] once) and the steps recomputed (None: a run after the
    first resumed from a step nobody said: how much it redid cannot be told)."""
    intervals: list[Interval] = []
    seen = 0
    high = -1
    recomputed_steps = 0
    unknown = False
    for w in windows:
        if w.run is None:
            intervals.append((w.start, w.train_end, "initialization"))
        else:
            while seen < len(evidence) and evidence[seen][0] < w.start:
                high = max(high, evidence[seen][1])
                seen += 1
            free = _subtract(w.start, w.train_end, w.stalls)
            if w.run.start_step is None:
                unknown = unknown or w is not windows[1]  # a restart resumed from a step nobody said
            redo_steps = max(0, high - w.run.start_step) if w.run.start_step is not None else 0
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

    return intervals, None if unknown else recomputed_steps


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


def _mark_shutdown(last: Window, saves: Sequence[_Save], final_step: int | None, step_time: float | None) -> None:
    """A succeeded job's last run ends training when its final save stops blocking and the steps after that save
    (to `final_step`, the highest the ranks reported) have run; when the run saved nothing, when the steps from its
    start to `final_step` have run. Without knowing those steps, it ends with the job."""
    if last.onset is not None or last.run is None:
        return
    finals = [s for s in saves if last.start <= s.begin and s.unblocked <= last.train_end]
    if finals:
        anchor, anchor_step = finals[-1].unblocked, finals[-1].step
    elif final_step is not None and last.run.start_step is not None and final_step >= last.run.start_step:
        anchor, anchor_step = last.start, last.run.start_step
    else:
        return  # steps may have followed, for all one knows: productive
    after = 0.0
    if anchor_step is None or final_step is None or final_step > anchor_step:
        if anchor_step is None or final_step is None or step_time is None:
            return
        after = (final_step - anchor_step) * step_time
    last.train_end = min(last.train_end, max(last.start, anchor + after))


def _interval(saves: Sequence[_Save]) -> int | None:
    """The checkpoint interval the ranks' reported saves show: the median step gap between consecutive saves."""
    steps = sorted({s.step for s in saves if s.step is not None})
    gaps = [b - a for a, b in itertools.pairwise(steps) if b > a]
    return round(statistics.median(gaps)) if gaps else None


def _step_time(windows: Sequence[Window], saves: Sequence[_Save], recs: Sequence[Record], t: Clock) -> float | None:
    """Seconds per step, stalls excluded (the module's docstring). A rank outlives a fault handed over to it a
    moment and trains meanwhile: the time is lost, but the step it showed then times its steps."""
    busy_total = 0.0
    steps_total = 0
    points = [(s.begin, s.step, False) for s in saves if s.step is not None]  # (time, step, shown by a rank then)
    for r in recs:
        if r.step is None or r.type not in PROGRESS_TYPES:
            continue
        if r.details.get("source") != "launcher":
            points.append((onset_time(r, t), r.step, False))
        elif (seen_at := _time(r.details.get("step_at"))) is not None:
            points.append((t(seen_at), r.step, True))  # observed late, but the agent says when the rank showed the step
    for w in windows:
        if w.run is None or w.run.start_step is None:
            continue
        start_step = w.run.start_step
        inside = [
            (at, step)
            for at, step, shown in points
            if w.start <= at <= (w.end if shown else w.train_end) and step > start_step
        ]
        if not inside:
            continue
        at, step = max(inside, key=lambda p: p[1])
        busy = at - w.start - _overlap(w.stalls, w.start, at)
        if busy > 0:
            busy_total += busy
            steps_total += step - start_step
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


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        ts = datetime.fromisoformat(value)
    except ValueError:
        return None
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


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
