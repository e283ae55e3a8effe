"""The summarize_goodput duty: which jobs a pass recomputes (new events, never summarized, running and due for a
refresh; nothing else), the mark it moves only once events have settled, a running job's open tail that lasts to
now, and the counters that only rise."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.database.tables import GoodputCounter, GoodputMark, GoodputSummary
from api.services.fleet.query import Scope
from api.services.fleet.report import fleet_goodput
from tests.support.fleet import add_job, at, fleet_db
from workers.supervision import summarize_goodput

RUN = {"restart_count": 0, "iteration": 0, "start_step": 0}


@pytest.fixture
def db(env: str) -> Iterator[Session]:
    with fleet_db() as session:
        yield session


def history(end: float | None = None) -> list[dict[str, Any]]:
    events = [{"type": "submitted", "t": 0}, {"type": "running", "t": 60, "step": 0, "details": RUN}]
    if end is not None:
        events.append({"type": "succeeded", "t": end})
    return events


def store(db: Session, job_id: str, *events: dict[str, Any]) -> None:
    from api import models
    from api.schemas.events import EventIn

    job = models.jobs.get(db, job_id)
    assert job is not None
    rows = [
        EventIn.model_validate({"key": uuid.uuid4().hex, "type": e["type"], "ts": at(e["t"]).isoformat(), **e["more"]})
        for e in events
    ]
    models.events.store(db, job, rows)
    db.commit()


def computed_at(db: Session, job_id: str) -> datetime | None:
    db.expire_all()
    row = db.get(GoodputSummary, job_id)
    return row.computed_at if row is not None else None


def test_a_pass_recomputes_only_what_changed(db: Session) -> None:
    done = add_job(db, history(end=3600), labels={"team": "a"}, status="SUCCEEDED")
    running = add_job(db, history(), labels={"team": "b"})
    db.commit()
    t1 = at(4000)
    assert summarize_goodput.run_once(db, t1) == 2  # never summarized
    assert computed_at(db, done) == t1 and computed_at(db, running) == t1
    assert summarize_goodput.run_once(db, t1 + timedelta(seconds=10)) == 0  # nothing new, refresh not due

    store(db, done, {"type": "checkpoint_saved", "t": 1800, "more": {"details": {"step": 9, "blocking_s": 30}}})
    t2 = t1 + timedelta(seconds=20)
    assert summarize_goodput.run_once(db, t2) == 1
    assert computed_at(db, done) == t2 and computed_at(db, running) == t1

    t3 = t1 + timedelta(seconds=61)  # FTPLANE_GOODPUT_REFRESH_S (60) after its summary: the running one
    assert summarize_goodput.run_once(db, t3) == 1
    assert computed_at(db, running) == t3 and computed_at(db, done) == t2


def test_the_mark_moves_only_after_the_settle_time(db: Session) -> None:
    job = add_job(db, history(), status="RUNNING")
    db.commit()
    t0 = at(100)
    summarize_goodput.run_once(db, t0)
    mark = db.scalar(select(GoodputMark))
    assert mark is not None
    first = mark.settled_id
    store(db, job, {"type": "checkpoint_saved", "t": 90, "more": {"details": {"step": 1, "blocking_s": 1}}})
    summarize_goodput.run_once(db, t0 + timedelta(seconds=5))
    db.expire_all()
    mark = db.scalar(select(GoodputMark))
    assert mark is not None and mark.settled_id == first  # seen, not settled: a late commit below it is still read
    summarize_goodput.run_once(db, t0 + timedelta(seconds=40))  # FTPLANE_GOODPUT_SETTLE_S (30) later: the newest
    db.expire_all()  # id seen then is taken as seen, and settles one settle time later
    mark = db.scalar(select(GoodputMark))
    assert mark is not None and mark.settled_id == first and mark.seen_id > first
    summarize_goodput.run_once(db, t0 + timedelta(seconds=80))
    db.expire_all()
    mark = db.scalar(select(GoodputMark))
    assert mark is not None and mark.settled_id > first


def test_a_running_jobs_last_bucket_lasts_to_now(db: Session) -> None:
    """Summarized at t=1000 s, asked at t=5000 s with no event since: productive to now, as its own goodput."""
    job = add_job(db, history(), labels={"team": "open"}, nodes=2, procs_per_node=4)
    db.commit()
    summarize_goodput.run_once(db, at(1000))
    late = at(5000)
    out = fleet_goodput(db, since=at(-100), until=late, now=late, scope=Scope(labels={"team": "open"}))
    from api import models
    from api.services import goodput

    row = models.jobs.get(db, job)
    assert row is not None
    own = goodput.job_goodput(db, row, now=late)
    assert own is not None and own.wall_s == pytest.approx(5000)
    assert out.total.wall_gpu_hours == pytest.approx(own.wall_s * 8 / 3600)
    assert out.total.productive_gpu_hours == pytest.approx(own.productive_s * 8 / 3600)
    assert out.total.lost_gpu_hours["initialization"] == pytest.approx(60 * 8 / 3600)


def test_the_counters_only_rise(db: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    job = add_job(db, history(), labels={"team": "c"}, nodes=1, procs_per_node=2)
    db.commit()
    summarize_goodput.run_once(db, at(600))

    def counted() -> dict[str, float]:
        db.expire_all()
        rows = db.scalars(select(GoodputCounter).where(GoodputCounter.label_value == "c")).all()
        return {r.bucket: r.gpu_seconds for r in rows}

    assert counted() == pytest.approx({"initialization": 120.0, "productive": 1080.0})
    # A fault found late moves productive time to fault detection and restart: lost rises, productive stays.
    store(
        db,
        job,
        {"type": "rank_failed", "t": 300, "more": {"rank": 0, "details": {"cause_class": "crash"}}},
        {"type": "failed", "t": 650, "more": {}},
    )
    summarize_goodput.run_once(db, at(700))
    after = counted()
    assert after["productive"] == pytest.approx(1080.0) and after["restart"] == pytest.approx(700.0)


def test_a_broken_job_does_not_stop_the_pass(db: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    from api.services.fleet import store as fleet_store

    good = add_job(db, history(end=100), status="SUCCEEDED")
    bad = add_job(db, history(end=100), status="SUCCEEDED")
    db.commit()
    real = fleet_store.summarize_job

    def breaks(session: Session, job: Any, now: Any = None) -> Any:
        if job.id == bad:
            raise RuntimeError("boom")
        return real(session, job, now)

    monkeypatch.setattr(fleet_store, "summarize_job", breaks)
    assert summarize_goodput.run_once(db, datetime(2026, 3, 2, 12, tzinfo=UTC)) == 1
    assert computed_at(db, good) is not None and computed_at(db, bad) is None
