"""A straggler episode and what it says: when it began and ended among the window's passes, the part of the
job's time it cost, and its `straggler_detected` and `straggler_cleared` events (pure: window.py keeps the state)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from api.database.tables import Job
from api.schemas.causes import Cause, CauseClass
from api.schemas.events import EventIn, EventType
from api.schemas.resiliency import StragglerSpec
from api.services.stragglers.scoring import STEP_TIME, Scores

T = TypeVar("T")


@dataclass
class Episode:
    """An open episode, as the watch keeps it (JSON)."""

    rank: int
    attempt: int
    key: str  # the straggler_detected event's
    detected: float  # epoch seconds
    onset: float
    node: str | None
    score: float
    slowdown_s: float | None
    lost_fraction: float
    decision: str | None = None  # what the action did not do, and why (action exclude)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def of(cls, value: dict[str, Any]) -> Episode:
        return cls(**{k: value[k] for k in cls.__dataclass_fields__ if k in value})


def onset_of(passes: list[float], slow: list[float]) -> float:
    """When the rank began to straggle: where the window's passes split best into before and a slow stretch to
    now (the pass from which on slow passes outnumber healthy ones by the most: a hiccup followed by healthy
    passes is not the start)."""
    return split_passes(list(reversed(passes)), slow, default=max(slow))


def end_of(passes: list[float], slow: list[float]) -> float | None:
    """When the rank was last straggling: the pass up to which the window's slow passes outnumber its healthy
    ones by the most (a hiccup after it recovered is not the end); None when the window holds no slow pass."""
    return split_passes(passes, slow, default=None) if slow else None


def split_passes(passes: list[float], slow: list[float], default: T) -> float | T:
    found = {round(t, 3) for t in slow}
    best, lead = 0, 0
    at: float | T = default
    for t in passes:
        lead += 1 if round(t, 3) in found else -1
        if lead > best:
            best, at = lead, t
    return at


def lost_fraction(scores: Scores, score: float, slowdown_s: float | None, pace_s: float | None) -> float:
    """The part of the job's time the straggler costs: its extra seconds per step over the job's seconds per step
    while it straggles. With the own-work signal (synchronous training) the job's measured step time already
    includes the wait for it; with step times, the straggler's own step time is the slow pace. Without seconds
    (NVRx's score alone): 1 - score."""
    if slowdown_s is None or slowdown_s <= 0:
        return max(0.0, min(1.0, 1.0 - score)) if slowdown_s is None else 0.0
    slow_step = pace_s if scores.signal == STEP_TIME else scores.step_time_s
    if not slow_step or slow_step <= 0:
        return max(0.0, min(1.0, 1.0 - score))
    return max(0.0, min(1.0, slowdown_s / max(slow_step, slowdown_s)))


def detected_event(job: Job, cfg: StragglerSpec, scores: Scores, episode: Episode, now: datetime) -> EventIn:
    where = f" on node {episode.node}" if episode.node else ""
    slower = f": {episode.slowdown_s:.3g} s per step slower" if episode.slowdown_s is not None else ""
    cause = Cause(
        CauseClass.straggler,
        f"rank {episode.rank}{where} ran at {episode.score:.2f} of the job's pace over the last {cfg.window_s:g} s "
        f"(threshold {cfg.threshold:g}){slower}",
        {"rank": episode.rank, **({"node": episode.node} if episode.node else {})},
    )
    step = next((r.step for r in scores.ranks if r.rank == episode.rank), None)
    return EventIn(
        key=episode.key,
        type=EventType.straggler_detected,
        ts=now,
        attempt=job.attempt,
        rank=episode.rank,
        node=episode.node,
        step=step,
        details={
            **cause.details(),
            "episode": episode.key,
            "score": episode.score,
            "node_score": round(scores.nodes[episode.node], 4) if episode.node in scores.nodes else None,
            "threshold": cfg.threshold,
            "window_s": cfg.window_s,
            "slowdown_s": episode.slowdown_s,
            "job_step_s": round(scores.step_time_s, 6) if scores.step_time_s is not None else None,
            "signal": scores.signal,
            "lost_fraction": episode.lost_fraction,
            "onset_s": round(max(0.0, episode.detected - episode.onset), 3),
            "action": cfg.action,
        },
    )


def cleared_event(episode: Episode, why: str, now: datetime, last_slow: float | None) -> EventIn:
    t = now.timestamp()
    ended = last_slow if last_slow is not None else t
    where = f" on node {episode.node}" if episode.node else ""
    details: dict[str, Any] = {
        "cause": f"rank {episode.rank}{where} straggles no more: {why}",
        "reason": why,
        "episode": episode.key,
        "lasted_s": round(max(0.0, ended - episode.onset), 3),
        "recovered_s": round(max(0.0, t - ended), 3),
        "rank": episode.rank,
    }
    return EventIn(
        key=f"straggler_cleared:{episode.key}",
        type=EventType.straggler_cleared,
        ts=now,
        attempt=episode.attempt,
        rank=episode.rank,
        node=episode.node,
        details=details,
    )


def close_all(state: dict[str, Any], why: str, now: datetime) -> tuple[list[Episode], list[EventIn]]:
    episodes = [Episode.of(v) for v in state.get("open", {}).values()]
    return episodes, [cleared_event(e, why, now, None) for e in episodes]
