"""The fleet's goodput and objectives (api/services/fleet/)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
)
from sqlalchemy.orm import Mapped, mapped_column

from api.database.tables.base import Base, BigId
from api.schemas.events import utcnow


class GoodputSummary(Base):
    """A job's goodput as the fleet reads it, kept by the summarize_goodput duty (api/services/fleet/): its closed
    wall time in `goodput_segments` and `goodput_hours`, its faults in `goodput_faults`, and here the open tail of
    a job still running (it lasts to now, in one bucket)."""

    __tablename__ = "goodput_summaries"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    last_event_id: Mapped[int] = mapped_column(BigInteger, default=0)  # the newest event it was computed from
    computed_at: Mapped[datetime] = mapped_column(default=utcnow)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    # Its wall time in Unix seconds (None before its first event); a running job's end is its summary's time.
    start_s: Mapped[float | None] = mapped_column(Float, default=None)
    end_s: Mapped[float | None] = mapped_column(Float, default=None)
    open_attempt: Mapped[int | None] = mapped_column(Integer, default=None)
    open_bucket: Mapped[str | None] = mapped_column(String(20), default=None, index=True)
    open_start_s: Mapped[float | None] = mapped_column(Float, default=None)  # Unix seconds
    # Seconds per bucket already added to goodput_counters (their high-water mark: counters never go down).
    counted: Mapped[dict[str, Any]] = mapped_column(default=dict)


class GoodputSegment(Base):
    """A stretch of a job's closed wall time in one bucket and attempt, inside one UTC hour (Unix seconds)."""

    __tablename__ = "goodput_segments"
    __table_args__ = (Index("ix_goodput_segments_hour_s", "hour_s"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    bucket: Mapped[str] = mapped_column(String(20))
    hour_s: Mapped[float] = mapped_column(Float)
    start_s: Mapped[float] = mapped_column(Float)
    end_s: Mapped[float] = mapped_column(Float)
    gpus: Mapped[int] = mapped_column(Integer)


class _BucketSeconds:
    """A job's GPUs and its closed seconds per goodput bucket, a column each (the sums a rollup keeps)."""

    gpus: Mapped[int] = mapped_column(Integer)
    productive: Mapped[float] = mapped_column(Float, default=0.0)
    initialization: Mapped[float] = mapped_column(Float, default=0.0)
    queued: Mapped[float] = mapped_column(Float, default=0.0)
    checkpoint_stall: Mapped[float] = mapped_column(Float, default=0.0)
    fault_detection: Mapped[float] = mapped_column(Float, default=0.0)
    restart: Mapped[float] = mapped_column(Float, default=0.0)
    recompute: Mapped[float] = mapped_column(Float, default=0.0)
    straggler: Mapped[float] = mapped_column(Float, default=0.0)
    shutdown: Mapped[float] = mapped_column(Float, default=0.0)


class GoodputHour(_BucketSeconds, Base):
    """A job's closed seconds within one UTC hour, per bucket (a column each): the sums of its segments there."""

    __tablename__ = "goodput_hours"
    __table_args__ = (Index("ix_goodput_hours_hour_s", "hour_s"),)

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    hour_s: Mapped[float] = mapped_column(Float, primary_key=True)


class GoodputDay(_BucketSeconds, Base):
    """A job's closed seconds within one UTC day, per bucket (a column each): the sums of its hours there."""

    __tablename__ = "goodput_days"
    __table_args__ = (Index("ix_goodput_days_day_s", "day_s"),)

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    day_s: Mapped[float] = mapped_column(Float, primary_key=True)


class GoodputFault(Base):
    """A failure of a job (a training stretch a detected fault ended), when it counts and its cause class."""

    __tablename__ = "goodput_faults"
    __table_args__ = (Index("ix_goodput_faults_ts_s", "ts_s"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    ts_s: Mapped[float] = mapped_column(Float)
    cause: Mapped[str] = mapped_column(String(16))


class GoodputMark(Base):
    """How far the summarize duty has read the (append-only) events: every job with an event up to `settled_id`
    was summarized after that event was stored; `seen_id` is the newest event id at `seen_at`."""

    __tablename__ = "goodput_marks"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    settled_id: Mapped[int] = mapped_column(BigInteger, default=0)
    seen_id: Mapped[int] = mapped_column(BigInteger, default=0)
    seen_at: Mapped[datetime] = mapped_column(default=utcnow)


class GoodputCounter(Base):
    """GPU-seconds per bucket and label value since ever (Prometheus counters, read at scrape time)."""

    __tablename__ = "goodput_counters"

    label_key: Mapped[str] = mapped_column(String(253), primary_key=True)
    label_value: Mapped[str] = mapped_column(String(63), primary_key=True)
    bucket: Mapped[str] = mapped_column(String(20), primary_key=True)
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)


class Objective(Base):
    """An ETTR objective of a project's jobs (those carrying `selector`), over a rolling window."""

    __tablename__ = "objectives"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    project: Mapped[str] = mapped_column(ForeignKey("projects.name"), index=True)
    name: Mapped[str] = mapped_column(String(63))
    selector: Mapped[dict[str, Any]] = mapped_column(default=dict)
    target: Mapped[float] = mapped_column(Float)
    window: Mapped[str] = mapped_column(String(16))  # as given: 7d
    burn_rate: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    breached_since: Mapped[datetime | None] = mapped_column(default=None)  # the open breach, if any
    evaluated_at: Mapped[datetime | None] = mapped_column(default=None)
    last: Mapped[dict[str, Any]] = mapped_column(default=dict)  # the last evaluation (ETTR, budget, burn rate)


class ObjectiveBreach(Base):
    """One breach of an objective, from when it was found to its recovery; announced once (objective_breached)."""

    __tablename__ = "objective_breaches"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    objective_id: Mapped[str] = mapped_column(ForeignKey("objectives.id", ondelete="CASCADE"), index=True)
    started_at: Mapped[datetime]
    recovered_at: Mapped[datetime | None] = mapped_column(default=None)
    reason: Mapped[str] = mapped_column(String(16))  # below_target | burn_rate
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
