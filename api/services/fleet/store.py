"""Writing one job's summary (summary.py) where the fleet's query reads it, and what it adds to the counters.

A summary is rewritten by difference: the segments, hours and faults it no longer has are deleted, the new ones
inserted, so a running job's refresh that changes nothing writes nothing. The summary's row is locked while it is
written (never the job's row, which the event path holds).
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Table, delete, func, insert, select
from sqlalchemy.orm import Session

from api.core.config import get_settings
from api.database.tables import (
    Base,
    Event,
    GoodputCounter,
    GoodputDay,
    GoodputFault,
    GoodputHour,
    GoodputSegment,
    GoodputSummary,
    Job,
)
from api.models.upsert import insert_for
from api.schemas.events import utcnow
from api.services.fleet.summary import BUCKETS, Summary, gpus_of, summarize
from api.services.goodput.accounting import ledger
from api.services.goodput.records import load_records

CHUNK = 500  # keys per IN list


def _table(model: type[Base]) -> Table:
    """The model's table: inserted into through Core (many rows, no ORM bookkeeping per row)."""
    return cast(Table, model.__table__)


def summarize_job(session: Session, job: Job, now: Any = None) -> GoodputSummary:
    """Recompute the job's summary from all its events (as of `now`) and store it; the caller commits."""
    now = now or utcnow()
    row = _locked(session, job.id, now)
    # `id + 0`: the job's rows by its index, then their highest id (PostgreSQL would otherwise walk the primary key
    # down from the newest event of all until it met one of this job's: all of the fleet's events since it ended).
    last_id = session.scalar(select(func.max(Event.id + 0)).where(Event.job_id == job.id)) or 0
    records = load_records(session, job.id)
    led = ledger(records, now=now) if records else None
    summary = summarize(led) if led is not None else Summary()
    gpus = gpus_of(job)
    _write_segments(session, job.id, summary, gpus)
    _write_sums(session, GoodputHour, job.id, summary.hours, gpus)
    _write_sums(session, GoodputDay, job.id, summary.days, gpus)
    session.execute(delete(GoodputFault).where(GoodputFault.job_id == job.id))
    if summary.faults:
        session.execute(
            insert(_table(GoodputFault)),
            [{"job_id": job.id, "attempt": f.attempt, "ts_s": f.ts_s, "cause": f.cause} for f in summary.faults],
        )
    row.last_event_id = last_id
    row.computed_at = now
    row.gpus = gpus
    row.start_s = led.origin.timestamp() if led is not None else None
    row.end_s = led.end.timestamp() if led is not None else None
    tail = summary.open
    row.open_attempt, row.open_bucket, row.open_start_s = (
        (tail.attempt, tail.bucket, tail.start_s) if tail else (None, None, None)
    )
    _count(session, job, row, summary, gpus)
    return row


def _locked(session: Session, job_id: str, now: Any) -> GoodputSummary:
    values = {"job_id": job_id, "last_event_id": 0, "computed_at": now, "gpus": 0, "counted": {}}
    session.execute(insert_for(session, GoodputSummary).values(**values).on_conflict_do_nothing())
    row = session.scalar(
        select(GoodputSummary)
        .where(GoodputSummary.job_id == job_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    assert row is not None
    return row


def _write_segments(session: Session, job_id: str, summary: Summary, gpus: int) -> None:
    held = {
        (attempt, bucket, start, end, g): row_id
        for row_id, attempt, bucket, start, end, g in session.execute(
            select(
                GoodputSegment.id,
                GoodputSegment.attempt,
                GoodputSegment.bucket,
                GoodputSegment.start_s,
                GoodputSegment.end_s,
                GoodputSegment.gpus,
            ).where(GoodputSegment.job_id == job_id)
        )
    }
    wanted = {(s.attempt, s.bucket, s.start_s, s.end_s, gpus): s for s in summary.segments}
    gone = [row_id for key, row_id in held.items() if key not in wanted]
    for start in range(0, len(gone), CHUNK):
        session.execute(delete(GoodputSegment).where(GoodputSegment.id.in_(gone[start : start + CHUNK])))
    new = [
        {
            "job_id": job_id,
            "attempt": s.attempt,
            "bucket": s.bucket,
            "hour_s": s.hour_s,
            "start_s": s.start_s,
            "end_s": s.end_s,
            "gpus": gpus,
        }
        for key, s in wanted.items()
        if key not in held
    ]
    if new:
        session.execute(insert(_table(GoodputSegment)), new)  # Core: many rows, one statement per batch


def _write_sums(
    session: Session,
    model: type[GoodputHour] | type[GoodputDay],
    job_id: str,
    sums: dict[float, dict[str, float]],
    gpus: int,
) -> None:
    """The job's rows of an hourly or daily table (`hour_s` or `day_s`, a column per bucket), by difference."""
    name = "hour_s" if model is GoodputHour else "day_s"
    at = getattr(model, name)
    columns = [getattr(model, bucket) for bucket in BUCKETS]
    held = {
        row[0]: tuple(row[1:])
        for row in session.execute(select(at, model.gpus, *columns).where(model.job_id == job_id))
    }
    wanted = {when: (gpus, *(seconds[b] for b in BUCKETS)) for when, seconds in sums.items()}
    changed = [when for when, old in held.items() if wanted.get(when) != old]
    for start in range(0, len(changed), CHUNK):
        session.execute(delete(model).where(model.job_id == job_id, at.in_(changed[start : start + CHUNK])))
    new = [
        {"job_id": job_id, name: when, "gpus": gpus, **sums[when]}
        for when, values in wanted.items()
        if held.get(when) != values
    ]
    if new:
        session.execute(insert(_table(model)), new)


def metric_label_keys() -> list[str]:
    return [key.strip() for key in get_settings().goodput_metric_labels.split(",") if key.strip()]


def _count(session: Session, job: Job, row: GoodputSummary, summary: Summary, gpus: int) -> None:
    """Add what the job's GPU-seconds per bucket grew by since last counted (never less: counters only rise)."""
    counted = dict(row.counted or {})
    grown: dict[str, float] = {}
    for bucket, seconds in summary.seconds.items():
        total = seconds * gpus
        if total > counted.get(bucket, 0.0):
            grown[bucket] = total - counted.get(bucket, 0.0)
            counted[bucket] = total
    row.counted = counted
    if not grown:
        return
    labels = job.labels or {}
    rows = [
        {"label_key": key, "label_value": str(labels.get(key) or ""), "bucket": bucket, "gpu_seconds": seconds}
        for key in metric_label_keys()
        for bucket, seconds in grown.items()
    ]
    if not rows:
        return
    stmt = insert_for(session, GoodputCounter)
    stmt = stmt.on_conflict_do_update(
        index_elements=["label_key", "label_value", "bucket"],
        set_={"gpu_seconds": GoodputCounter.gpu_seconds + stmt.excluded.gpu_seconds},
    )
    session.execute(stmt, rows)
