"""Restart anomalies: the job as a whole going wrong while each restart on its own looks fine.

Each anomaly is an event (and so a webhook) with its evidence, once per episode:

    restart_storm     `storm_restarts` restarts (any rung: in-process, in-job, job) within `storm_window_s`.
                      The episode lasts while the window holds that many; it is announced when it begins
                      (its key is the first restart of the window then) and the job's watch remembers it is
                      open, so a storm that goes on is one event.
    progress_stalled  `stalled_cycles` cycles in a row that did not move the newest checkpoint forward: a
                      cycle runs from one restart to the next (the first from the job's start), and it moved
                      the checkpoint when the newest checkpoint_saved step at its end is past the one at its
                      start. Once per stall: the key names the checkpoint step and the first restart stuck on it.
    recovery_stuck    a restart after which training has not resumed (no `running` since) for
                      `cycle_timeout_s`; time the attempt waits in a queue is not the recovery's. Once per
                      restart (the key is the restart's).

A hot spare spent is announced where it is seen, by the kubernetes backend (`spares_exhausted`).
The thresholds are the spec's `resiliency.anomalies`; the duty is workers/supervision/detect_restart_anomalies.py.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import flag_modified

from api import models
from api.database.tables import Event, Job
from api.schemas.causes import Cause, CauseClass, cause_class_of
from api.schemas.events import EventIn, EventType, utcnow
from api.schemas.resiliency import AnomalySpec
from api.schemas.rungs import RESTART_TYPES
from api.services.stragglers.window import watch_of

RESTARTS = [t.value for t in RESTART_TYPES]
LISTED = 10  # restarts listed in an event's evidence


def watch(session: Session, job: Job, cfg: AnomalySpec, now: datetime | None = None) -> list[EventIn]:
    """The anomalies `job` shows now, as events not stored yet (the store skips keys it has)."""
    now = now or utcnow()
    restarts = models.events.of_job(session, job.id, types=RESTARTS)
    events = []
    storm = restart_storm(session, job, cfg, restarts, now)
    if storm is not None:
        events.append(storm)
    stalled = progress_stalled(session, job, cfg, restarts)
    if stalled is not None:
        events.append(stalled)
    stuck = recovery_stuck(session, job, cfg, restarts, now)
    if stuck is not None:
        events.append(stuck)
    return events


def restart_storm(session: Session, job: Job, cfg: AnomalySpec, restarts: list[Event], now: datetime) -> EventIn | None:
    since = now - timedelta(seconds=cfg.storm_window_s)
    recent = [r for r in restarts if _aware(r.ts) > since]
    row = watch_of(session, job.id)
    state = dict(row.anomalies or {})
    if len(recent) < cfg.storm_restarts:
        if state.pop("restart_storm", None) is not None:
            _save(row, state)
        return None
    if "restart_storm" in state:
        return None  # announced when it began
    first = recent[0]
    state["restart_storm"] = {"key": f"restart_storm:{first.key}", "since": _aware(first.ts).isoformat()}
    _save(row, state)
    rungs = Counter(r.type.removesuffix("_restart") for r in recent)
    causes = Counter(cause_class_of(r.details).value for r in recent)
    minutes = cfg.storm_window_s / 60
    cause = Cause(
        CauseClass.other,
        f"restart storm: {len(recent)} restarts within {minutes:g} min "
        f"({', '.join(f'{n} {rung}' for rung, n in rungs.most_common())}; causes: "
        f"{', '.join(f'{n} {c}' for c, n in causes.most_common())})",
    )
    return EventIn(
        key=state["restart_storm"]["key"],
        type=EventType.restart_storm,
        ts=now,
        attempt=job.attempt,
        details={
            **cause.details(),
            "restarts": len(recent),
            "threshold": cfg.storm_restarts,
            "window_s": cfg.storm_window_s,
            "by_rung": dict(rungs),
            "by_cause": dict(causes),
            "evidence": _evidence(recent),
        },
    )


def progress_stalled(session: Session, job: Job, cfg: AnomalySpec, restarts: list[Event]) -> EventIn | None:
    n = cfg.stalled_cycles
    if len(restarts) < n:
        return None
    # the newest checkpoint step at the end of each of the last n cycles, and at the start of the first of them
    ends = restarts[-n:]
    start = restarts[-n - 1] if len(restarts) > n else None
    newest = [_checkpoint_at(session, job, r.ts) for r in ends]
    before = _checkpoint_at(session, job, start.ts) if start is not None else None
    if any(step != before for step in newest):
        return None
    # the stall began with the first restart, of those in a row before now, that found the checkpoint where it is
    first = ends[0]
    for r in reversed(restarts[:-n]):
        if _checkpoint_at(session, job, r.ts) != before:
            break
        first = r
    where = f"step {before}" if before is not None else "no checkpoint at all"
    cause = Cause(
        CauseClass.no_progress,
        f"progress stalled: {n} restart cycles in a row without a newer checkpoint ({where})",
        {"step": before} if before is not None else {},
    )
    return EventIn(
        key=f"progress_stalled:ckpt{before if before is not None else 'none'}:{first.key}",
        type=EventType.progress_stalled,
        attempt=job.attempt,
        step=before,
        details={
            **cause.details(),
            "checkpoint_step": before,
            "cycles": n,
            "since": _aware(first.ts).isoformat(),
            "evidence": _evidence(ends),
        },
    )


def recovery_stuck(
    session: Session, job: Job, cfg: AnomalySpec, restarts: list[Event], now: datetime
) -> EventIn | None:
    if not restarts:
        return None
    last = restarts[-1]
    began = _aware(last.ts)
    resumed = models.events.last_ts_of_job(session, job.id, [EventType.running.value])
    if resumed is not None and _aware(resumed) > began:
        return None
    waited = (now - began).total_seconds() - _queued_since(session, job, began, now)
    if waited <= cfg.cycle_timeout_s:
        return None
    cause = Cause(
        CauseClass.other,
        f"recovery stuck: no training since the {last.type.replace('_', ' ')} at {began:%H:%M:%S} UTC "
        f"({waited:.0f} s, cycle_timeout_s {cfg.cycle_timeout_s:g}); it was for: "
        f"{(last.details or {}).get('cause') or 'an unknown cause'}",
    )
    return EventIn(
        key=f"recovery_stuck:{last.key}",
        type=EventType.recovery_stuck,
        ts=now,
        attempt=job.attempt,
        details={
            **cause.details(),
            "restart": _evidence([last])[0],
            "waited_s": round(waited, 3),
            "cycle_timeout_s": cfg.cycle_timeout_s,
        },
    )


def _queued_since(session: Session, job: Job, began: datetime, now: datetime) -> float:
    """Seconds since `began` the current attempt has waited in a queue (to now, if it still waits)."""
    queued = [
        e
        for e in models.events.of_job(session, job.id, types=[EventType.queued.value])
        if e.attempt == job.attempt and _aware(e.ts) >= began
    ]
    waiting_since = None
    total = 0.0
    for e in queued:
        state = (e.details or {}).get("queue_state")
        if state == "waiting" and waiting_since is None:
            waiting_since = _aware(e.ts)
        elif state == "admitted" and waiting_since is not None:
            total += (_aware(e.ts) - waiting_since).total_seconds()
            waiting_since = None
    if waiting_since is not None:
        total += (now - waiting_since).total_seconds()
    return total


def _checkpoint_at(session: Session, job: Job, ts: datetime) -> int | None:
    return models.events.max_step_of_job(session, job.id, EventType.checkpoint_saved.value, before=ts)


def _evidence(restarts: list[Event]) -> list[dict[str, Any]]:
    """The restarts an anomaly is about (the newest LISTED), as the event's details say them."""
    return [
        {
            "type": r.type,
            "ts": _aware(r.ts).isoformat(),
            "attempt": r.attempt,
            "cause": (r.details or {}).get("cause"),
            "cause_class": cause_class_of(r.details).value,
        }
        for r in restarts[-LISTED:]
    ]


def _save(row: Any, state: dict[str, Any]) -> None:
    row.anomalies = state
    flag_modified(row, "anomalies")


def _aware(ts: datetime | str) -> datetime:
    if isinstance(ts, str):  # aggregates over SQLite come back as text
        ts = datetime.fromisoformat(ts)
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)
