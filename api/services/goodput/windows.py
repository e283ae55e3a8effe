"""Where training ran and where it stopped: the runs of a job, the window each one owns, and the failure
signals placed in those windows (onset and detection). The rules are in the package docstring."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from api.schemas.events import EventType
from api.services.goodput.attempts import Clock
from api.services.goodput.records import FAILURE_TYPES, SILENCE_TYPES, Record

# Where a run's productive time starts, best first: the SDK's `running` (the loop says it starts, at its step),
# the agent's when the ranks' output showed the run's start or first step, the agent's when the ranks were up.
BASES = ("sdk", "progress", "processes")


@dataclass
class Run:
    """One start of the training loop: its ranks' `running` events of one (attempt, restart_count, iteration)."""

    key: tuple[int, int, int]  # (attempt, restart_count, iteration)
    start: float
    start_step: int | None  # None: nobody said which step the run resumed from
    basis: str = "sdk"  # which `running` starts it (BASES)
    end: float = 0.0  # the window's end: the next run's start, or the end of wall time


@dataclass(frozen=True)
class Signal:
    """What one event tells of a failure: when, where the trouble began, and whether it detects it."""

    t: float
    onset: float | None  # where the trouble began, when the signal says
    detects: bool
    refers_to: tuple[int, ...] | None = None  # the run a restart event ends: (attempt[, restart_count[, iteration]])


@dataclass
class Window:
    """The start-up window (run None) or one run's window."""

    start: float
    end: float
    run: Run | None
    onset: float | None = None
    detected: float | None = None
    silences: list[tuple[int, float]] = field(default_factory=list)  # (step, onset) of its measured silences
    train_end: float = 0.0
    stalls: list[tuple[float, float]] = field(default_factory=list)
    signals: list[Record] = field(default_factory=list)  # the events that placed its failure, in time order


def failure_time(w: Window) -> float:
    """When a failed window's failure counts: its detection, else its onset."""
    at = w.detected if w.detected is not None else w.onset
    return at or 0.0


def basis_of(r: Record) -> str:
    """Who said a `running` and from what: the SDK, or the node agent from its ranks' output or processes."""
    if r.details.get("source") != "agent":
        return "sdk"
    return "progress" if r.details.get("basis") == "progress" else "processes"


def runs_of(recs: Sequence[Record], t: Clock, wall: float) -> list[Run]:
    """One run per (attempt, restart_count, iteration), started by the best `running` said of it (BASES): when its
    last rank said it (the loop's first collective waits for all of them), at the lowest step they said."""
    best: dict[tuple[int, int, int], str] = {}
    for r in recs:
        if r.type == EventType.running:
            key, basis = run_key(r), basis_of(r)
            if key not in best or BASES.index(basis) < BASES.index(best[key]):
                best[key] = basis
    by_key: dict[tuple[int, int, int], Run] = {}
    for r in recs:
        if r.type != EventType.running or basis_of(r) != best[run_key(r)]:
            continue
        key = run_key(r)
        start_step = r.integer("start_step")
        if start_step is None and r.details.get("source") != "agent":
            start_step = r.step or 0  # an SDK rank always says its step
        held = by_key.get(key)
        if held is None:
            by_key[key] = Run(key, t(r.ts), start_step, best[key])
        else:
            held.start = max(held.start, t(r.ts))
            if start_step is not None:
                held.start_step = start_step if held.start_step is None else min(held.start_step, start_step)
    runs = sorted(by_key.values(), key=lambda run: (run.start, run.key))
    for i, run in enumerate(runs):
        run.end = runs[i + 1].start if i + 1 < len(runs) else wall
    return runs


def run_key(r: Record) -> tuple[int, int, int]:
    return (r.attempt, r.integer("restart_count") or 0, r.integer("iteration") or 0)


def place_signals(recs: Sequence[Record], t: Clock, windows: Sequence[Window]) -> None:
    """Each failure signal goes to the window its time falls in: the window's onset and detection."""
    starts = [w.start for w in windows[1:]]
    for r in recs:
        signal = signal_of(r, t(r.ts))
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
        window.signals.append(r)
        if onset is not None and r.type in SILENCE_TYPES and silence(r) is not None:
            window.silences.append((r.step if r.step is not None else -1, onset))
        elif onset is not None and (window.onset is None or onset < window.onset):
            window.onset = onset
        if signal.detects and (window.detected is None or signal.t < window.detected):
            window.detected = signal.t
    for w in windows:
        if w.silences:
            last_step = max(step for step, _ in w.silences)
            stopped = min(onset for step, onset in w.silences if step == last_step)
            w.onset = stopped if w.onset is None else min(w.onset, stopped)
        if w.onset is None and w.detected is not None:
            w.onset = w.detected
        if w.detected is not None and w.onset is not None and w.detected < w.onset:
            w.detected = w.onset
        w.train_end = w.onset if w.onset is not None else w.end


def signal_of(r: Record, at: float) -> Signal | None:
    """The failure signal of an event at `at` (seconds of wall time), or None when it is none."""
    kind = r.type
    if kind == EventType.fault_injected:
        if r.details.get("kind") == "slowdown":
            return None  # nothing stops: a straggler, counted in its own bucket
        return Signal(at, onset=at, detects=False)
    if kind in FAILURE_TYPES:
        if r.details.get("source") == "launcher":
            return None
        return Signal(at, onset=at, detects=True)
    if kind in SILENCE_TYPES:
        silent = silence(r)
        return Signal(at, onset=at - silent if silent is not None else at, detects=True)
    if kind == EventType.injob_restart:
        count = r.integer("restart_count")
        return Signal(at, onset=None, detects=True, refers_to=(r.attempt, count - 1) if count else None)
    if kind == EventType.inprocess_restart:
        iteration = r.integer("iteration")
        count = r.integer("restart_count") or 0
        return Signal(at, onset=None, detects=True, refers_to=(r.attempt, count, iteration - 1) if iteration else None)
    if kind == EventType.job_restart:
        source = r.integer("from_attempt")
        return Signal(at, onset=None, detects=True, refers_to=(source if source is not None else r.attempt - 1,))
    return None


def silence(r: Record) -> float | None:
    """How long the rank had been silent when the hang was detected (`silent_s`; unknown without it)."""
    silent = r.number("silent_s")
    return silent if silent is not None and silent >= 0 else None


def onset_time(r: Record, t: Clock) -> float:
    """When the step of a fault or silence event was current: a hang's step is its last heartbeat's."""
    at = t(r.ts)
    if r.type in SILENCE_TYPES:
        silent = silence(r)
        at = at - silent if silent is not None else at
    return at
