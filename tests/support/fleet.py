"""The fleet's tests: jobs and their events straight into a fresh database (`fleet_db`: SQLite, and PostgreSQL
when configured), and the expected side of every comparison: each job's own accounting (its ledger, as
GET /v1/jobs/{id}/goodput computes it), clipped to a range here."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from api.schemas.goodput import LOST_BUCKETS

T0 = datetime(2026, 3, 2, 9, 40, tzinfo=UTC)  # not on an hour: histories cross hours
BUCKETS = ("productive", *LOST_BUCKETS)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@contextmanager
def fleet_db() -> Iterator[Session]:
    """A session on this test's migrated database (the `env` fixture's)."""
    from api.core.db import session_scope, upgrade_to_head

    upgrade_to_head()
    with session_scope() as session:
        yield session


def add_job(
    session: Session,
    events: list[dict[str, Any]],
    *,
    labels: dict[str, str] | None = None,
    nodes: int = 1,
    gpus_per_node: int = 0,
    procs_per_node: int = 2,
    project: str = "default",
    status: str = "RUNNING",
) -> str:
    """A job row and its events as stored rows (each event: type, t (seconds after T0), attempt, step, details)."""
    from api import models
    from api.database.tables import Job
    from api.schemas.events import EventIn
    from api.schemas.spec import JobSpec

    spec = JobSpec.model_validate(
        {
            "name": "fleet",
            "project": project,
            "backend": "local",
            "command": ["python", "-c", "pass"],
            "nodes": nodes,
            "procs_per_node": procs_per_node,
            "resources": {"gpus_per_node": gpus_per_node},
            "labels": labels or {},
        }
    )
    job = models.jobs.create(session, spec)
    job.status = status
    session.flush()
    stored = [
        EventIn.model_validate(
            {
                "key": uuid.uuid4().hex,
                "type": e["type"],
                "ts": at(e["t"]).isoformat(),
                "attempt": e.get("attempt", 0),
                "step": e.get("step"),
                "rank": e.get("rank"),
                "details": e.get("details", {}),
            }
        )
        for e in events
    ]
    if stored:
        models.events.store(session, job, stored)
    session.flush()
    assert isinstance(job, Job)
    return job.id


def own_seconds(session: Session, job_id: str, now: datetime, lo: datetime, hi: datetime) -> dict[str, float]:
    """The job's own accounting (its ledger at `now`), its seconds per bucket clipped to [lo, hi)."""
    from api.services.goodput.accounting import ledger
    from api.services.goodput.records import load_records

    records = load_records(session, job_id)
    out = dict.fromkeys(BUCKETS, 0.0)
    if not records:
        return out
    led = ledger(records, now=now)
    origin = led.origin.timestamp()
    for b, e, bucket in led.intervals:
        part = min(origin + e, hi.timestamp()) - max(origin + b, lo.timestamp())
        if part > 0:
            out[bucket] += part
    return out


def own_faults(session: Session, job_id: str, now: datetime, lo: datetime, hi: datetime) -> int:
    from api.services.goodput.accounting import ledger
    from api.services.goodput.records import load_records
    from api.services.goodput.windows import failure_time

    records = load_records(session, job_id)
    if not records:
        return 0
    led = ledger(records, now=now)
    times = [led.origin.timestamp() + failure_time(w) for w in led.failed]
    return sum(1 for ts in times if lo.timestamp() <= ts < hi.timestamp())
