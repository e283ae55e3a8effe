"""The window and the episodes: a pass of straggler detection over one job, its state kept between passes.

A pass scores the current attempt's ranks that reported lately (scoring.py) and remembers two things: when
it ran (`JobWatch.stragglers["passes"]`, those within the window) and which ranks scored below the
threshold (a `StragglerSample` row each; a healthy rank writes nothing). Over the window, a rank's median
score is below the threshold exactly when more than half the passes found it below: that opens an episode
(`straggler_detected`), once the passes cover at least half the window (a rank slow since the job began is
found then, not on the first pass). The episode closes (`straggler_cleared`) when at most a quarter of the
window's passes found the rank below and the pass itself found it healthy (the gap between the two keeps a rank
near the threshold from opening and closing episodes pass after pass; a rank slow right now is not cleared),
when its attempt ends, or when the job restarts without its node.

A job is scored at most every `pass_every_s`: half its report interval (a node's ranks' newest heartbeats change
once an interval, so a 16,384-node job reporting every 30 s, scored on every 2 s supervision pass, was scored 15
times on mostly the same rows, ~0.5 s of each pass: bench/RESULTS.md, scale), and often enough that the window
holds twice MIN_PASSES passes.

The events carry what goodput needs (api/services/goodput/stragglers.py): when the episode began (`onset_s`
before the detection: its first slow pass in the window), when the rank was last slow (`recovered_s` before
the clearing), and the fraction of the job's time it cost (`lost_fraction`: the seconds per step the rank is
slower, over the job's seconds per step while it was).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import flag_modified

from api.database.tables import Job, JobWatch, RankLiveness, StragglerSample
from api.schemas.events import EventIn, utcnow
from api.schemas.resiliency import StragglerSpec
from api.schemas.spec import JobSpec
from api.services.stragglers.episodes import (
    Episode,
    cleared_event,
    close_all,
    detected_event,
    end_of,
    lost_fraction,
    onset_of,
)
from api.services.stragglers.scoring import RankRow, Scores, score_ranks

MIN_PASSES = 5  # fewer passes in the window than this never open an episode
FRESH_REPORTS = 3  # a rank is scored while its newest heartbeat is this many report intervals old at most


@dataclass
class Pass:
    """What one pass found: the scores, the episodes it opened and closed, those still open."""

    scores: Scores | None
    opened: list[Episode] = field(default_factory=list)
    closed: list[Episode] = field(default_factory=list)
    open: list[Episode] = field(default_factory=list)
    events: list[EventIn] = field(default_factory=list)


def pass_every_s(cfg: StragglerSpec, report_interval_s: float) -> float:
    """The least time between two passes over one job (the module's rule)."""
    return min(report_interval_s / 2, cfg.window_s / (2 * MIN_PASSES))


def watch_of(session: Session, job_id: str) -> JobWatch:
    row = session.get(JobWatch, job_id)
    if row is None:
        row = JobWatch(job_id=job_id, stragglers={}, open_stragglers=0, anomalies={}, updated_at=utcnow())
        session.add(row)
    return row


def rank_rows(session: Session, job: Job, since: datetime) -> list[RankRow]:
    """The current attempt's ranks heard from since `since` (one narrow query, whatever the job's size)."""
    query = select(
        RankLiveness.rank,
        RankLiveness.node,
        RankLiveness.step,
        RankLiveness.step_time_s,
        RankLiveness.compute_s,
        RankLiveness.perf_score,
    ).where(RankLiveness.job_id == job.id, RankLiveness.attempt == job.attempt, RankLiveness.last_seen >= since)
    return [RankRow._make(row) for row in session.connection().execute(query)]  # Core: no ORM loading


def observe(session: Session, job: Job, spec: JobSpec, now: datetime | None = None) -> Pass:
    """One pass over `job` (whose row the caller holds locked): score, remember, open and close episodes.
    The events are returned, not stored: the caller records them with what it decides."""
    now = now or utcnow()
    cfg = spec.resiliency.stragglers
    watch = watch_of(session, job.id)
    state = dict(watch.stragglers or {})
    result = Pass(scores=None)
    if state.get("attempt") != job.attempt:
        result.closed, result.events = close_all(state, "its attempt ended", now)
        state = {"attempt": job.attempt, "passes": [], "open": {}}
        session.execute(delete(StragglerSample).where(StragglerSample.job_id == job.id))
    episodes = {int(k): Episode.of(v) for k, v in state.get("open", {}).items()}
    passes = state.get("passes") or []
    if passes and now.timestamp() - passes[-1] < pass_every_s(cfg, spec.report_interval_s):
        result.open = list(episodes.values())  # not due: the episodes stand as the last pass left them
        return result
    scores = score_ranks(rank_rows(session, job, now - timedelta(seconds=FRESH_REPORTS * spec.report_interval_s)))
    result.scores = scores
    if len(scores.ranks) >= 2:
        _remember(session, job, cfg, state, scores, now)
        opened, closed = _judge(session, job, cfg, state, scores, episodes, now)
        for episode in opened:
            episodes[episode.rank] = episode
            result.events.append(detected_event(job, cfg, scores, episode, now))
        for episode, last_slow in closed:
            del episodes[episode.rank]
            result.events.append(cleared_event(episode, "recovered", now, last_slow))
        result.opened, result.closed = opened, result.closed + [e for e, _ in closed]
        state["lowest"] = scores.lowest
        state["signal"] = scores.signal
    state["open"] = {str(r): e.to_json() for r, e in episodes.items()}
    result.open = list(episodes.values())
    _save(watch, state, now)
    return result


def close(session: Session, job: Job, episodes: list[Episode], why: str, now: datetime | None = None) -> list[EventIn]:
    """End `episodes` of the current attempt for a reason other than recovery (the job restarts without
    their node); their straggler_cleared events are returned."""
    now = now or utcnow()
    watch = watch_of(session, job.id)
    state = dict(watch.stragglers or {})
    open_ = dict(state.get("open", {}))
    events = []
    for episode in episodes:
        if open_.pop(str(episode.rank), None) is not None:
            events.append(cleared_event(episode, why, now, None))
    state["open"] = open_
    _save(watch, state, now)
    return events


def end_watch(session: Session, job: Job, now: datetime | None = None) -> list[EventIn]:
    """The job's current attempt no longer runs: forget its window, close its open episodes (their
    straggler_cleared events returned)."""
    now = now or utcnow()
    session.execute(delete(StragglerSample).where(StragglerSample.job_id == job.id))
    watch = session.get(JobWatch, job.id)
    if watch is None or not watch.open_stragglers:
        return []
    state = dict(watch.stragglers)
    reason = "its attempt ended" if state.get("attempt") != job.attempt else f"the job is {job.status.lower()}"
    _, events = close_all(state, reason, now)
    state["open"] = {}
    _save(watch, state, now)
    return events


def _save(watch: JobWatch, state: dict[str, Any], now: datetime) -> None:
    watch.stragglers = state
    watch.open_stragglers = len(state.get("open", {}))
    watch.updated_at = now
    flag_modified(watch, "stragglers")


def _remember(
    session: Session, job: Job, cfg: StragglerSpec, state: dict[str, Any], scores: Scores, now: datetime
) -> None:
    t = now.timestamp()
    state["passes"] = [p for p in state.get("passes", []) if p > t - cfg.window_s] + [t]
    below = [r for r in scores.ranks if r.score < cfg.threshold]
    if below:
        session.execute(
            insert(StragglerSample),
            [
                {
                    "job_id": job.id,
                    "attempt": job.attempt,
                    "rank": r.rank,
                    "ts": now,
                    "score": r.score,
                    "pace_s": r.pace_s if r.pace_s is not None else 0.0,
                    "reference_s": r.reference_s if r.reference_s is not None else 0.0,
                }
                for r in below
            ],
        )
    session.execute(
        delete(StragglerSample).where(
            StragglerSample.job_id == job.id, StragglerSample.ts <= now - timedelta(seconds=cfg.window_s)
        )
    )


def _judge(
    session: Session,
    job: Job,
    cfg: StragglerSpec,
    state: dict[str, Any],
    scores: Scores,
    episodes: dict[int, Episode],
    now: datetime,
) -> tuple[list[Episode], list[tuple[Episode, float]]]:
    """The episodes this pass opens, and those it closes (with when the rank was last found slow)."""
    passes: list[float] = state["passes"]
    n = len(passes)
    counts = dict(
        session.execute(
            select(StragglerSample.rank, func.count())
            .where(StragglerSample.job_id == job.id, StragglerSample.attempt == job.attempt)
            .group_by(StragglerSample.rank)
        ).all()
    )
    ready = n >= MIN_PASSES and passes[-1] - passes[0] >= cfg.window_s / 2
    opened = []
    if ready:
        by_rank = {r.rank: r for r in scores.ranks}
        for rank, count in counts.items():
            if 2 * count > n and rank not in episodes and rank in by_rank:
                opened.append(_episode(session, job, cfg, scores, by_rank[rank].node, rank, passes, now))
    healthy = {r.rank for r in scores.ranks if r.score >= cfg.threshold}  # a pass that found the rank slow keeps it
    closed = []
    for rank, episode in episodes.items():
        if rank in healthy and 4 * counts.get(rank, 0) <= n:
            slow = session.scalars(
                select(StragglerSample.ts).where(StragglerSample.job_id == job.id, StragglerSample.rank == rank)
            )
            last_slow = end_of(passes, [_epoch(t) for t in slow])
            if last_slow is None:  # a late clearing: the rank was last slow before the window began
                last_slow = now.timestamp() - cfg.window_s
            closed.append((episode, last_slow))
    return opened, closed


def _episode(
    session: Session,
    job: Job,
    cfg: StragglerSpec,
    scores: Scores,
    node: str | None,
    rank: int,
    passes: list[float],
    now: datetime,
) -> Episode:
    n = len(passes)
    samples = session.execute(
        select(StragglerSample.ts, StragglerSample.score, StragglerSample.pace_s, StragglerSample.reference_s).where(
            StragglerSample.job_id == job.id, StragglerSample.attempt == job.attempt, StragglerSample.rank == rank
        )
    ).all()
    # More than half the window's passes are among these samples, all below the others: the window's median
    # score is one of them.
    window_median = sorted(s.score for s in samples)[(n - 1) // 2]
    paced = [s.pace_s - s.reference_s for s in samples if s.pace_s > 0]
    slowdown = statistics.median(paced) if paced else None
    pace = statistics.median(s.pace_s for s in samples if s.pace_s > 0) if paced else None
    onset = onset_of(passes, [_epoch(s.ts) for s in samples])
    return Episode(
        rank=rank,
        attempt=job.attempt,
        key=f"straggler:a{job.attempt}:r{rank}:t{int(now.timestamp() * 1000)}",
        detected=now.timestamp(),
        onset=onset,
        node=node,
        score=round(window_median, 4),
        slowdown_s=round(slowdown, 6) if slowdown is not None else None,
        lost_fraction=round(lost_fraction(scores, window_median, slowdown, pace), 4),
    )


def _epoch(ts: datetime | str) -> float:
    if isinstance(ts, str):  # aggregates over SQLite come back as text
        ts = datetime.fromisoformat(ts)
    return (ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)).timestamp()


def jobs_watched(session: Session) -> list[str]:
    """Jobs with open episodes or samples in their window (those whose attempt no longer runs are closed)."""
    open_ = select(JobWatch.job_id).where(JobWatch.open_stragglers > 0)
    sampled = select(StragglerSample.job_id).distinct()
    return sorted(set(session.scalars(open_)) | set(session.scalars(sampled)))


def not_excluded(episode: Episode) -> bool:
    """No decision was taken against excluding the episode's node yet."""
    return episode.decision is None


def note_decision(session: Session, job: Job, episodes: list[Episode], decision: str, now: datetime) -> None:
    """Keep, with each open episode, why its action was not carried out (it is not tried again)."""
    watch = watch_of(session, job.id)
    state = dict(watch.stragglers or {})
    open_ = dict(state.get("open", {}))
    for episode in episodes:
        if str(episode.rank) in open_:
            open_[str(episode.rank)] = {**open_[str(episode.rank)], "decision": decision}
    state["open"] = open_
    _save(watch, state, now)
