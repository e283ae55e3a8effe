"""The fleet's figures are the jobs' own: over any window and bucket, per team, the fleet's GPU-hours per cause,
jobs and faults equal the sum of each job's own accounting clipped to the range (built here from each job's ledger,
never from the summaries), for generated histories with jobs crossing the window's edges (hypothesis)."""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session

from api.services.fleet.query import Scope
from api.services.fleet.report import fleet_goodput
from api.services.fleet.store import summarize_job
from tests.support.fleet import BUCKETS, add_job, at, own_faults, own_seconds

KINDS = [
    "running",
    "checkpoint_saved",
    "fault_injected",
    "rank_failed",
    "hang_detected",
    "inprocess_restart",
    "injob_restart",
    "job_restart",
    "queued",
    "straggler_detected",
    "submitted",
]
SPAN = 250_000.0  # seconds of history: about three days, so jobs cross hours and days as well as the window's edges


@st.composite
def history(draw: st.DrawFn) -> list[dict[str, Any]]:
    start = draw(st.floats(0, SPAN * 0.8))
    events: list[dict[str, Any]] = [{"type": "submitted", "t": start}]
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(KINDS))
        t = start + draw(st.floats(0, SPAN * 0.6))
        attempt = draw(st.integers(0, 2))
        step = draw(st.one_of(st.none(), st.integers(0, 1000)))
        details: dict[str, Any] = {}
        if kind == "running":
            details = {"restart_count": draw(st.integers(0, 2)), "iteration": 0, "start_step": step or 0}
        elif kind == "checkpoint_saved":
            details = {"step": step, "blocking_s": draw(st.floats(0, 300)), "total_s": draw(st.floats(0, 600))}
        elif kind == "hang_detected":
            details = {"silent_s": draw(st.floats(0, 600))}
        elif kind == "injob_restart":
            details = {"restart_count": draw(st.integers(1, 3)), "failed_step": step}
        elif kind == "job_restart":
            details = {"from_attempt": max(0, attempt - 1), "cause_class": draw(st.sampled_from(["node", "crash"]))}
        elif kind == "fault_injected":
            details = {"kind": draw(st.sampled_from(["crash", "hang", "exception"]))}
        elif kind == "queued":
            details = {"queue_state": draw(st.sampled_from(["waiting", "admitted"]))}
        elif kind == "straggler_detected":
            details = {"lost_fraction": draw(st.floats(0.05, 0.5)), "episode": "e1", "onset_s": 30.0}
        events.append({"type": kind, "t": t, "attempt": attempt, "step": step, "details": details})
    if draw(st.booleans()):
        end = draw(st.sampled_from(["succeeded", "failed", "cancelled"]))
        events.append({"type": end, "t": start + draw(st.floats(0, SPAN)), "details": {"final_step": 900}})
    return events


@st.composite
def fleets(draw: st.DrawFn) -> dict[str, Any]:
    jobs = [
        {
            "events": draw(history()),
            "team": draw(st.sampled_from(["a", "b", None])),
            "nodes": draw(st.integers(1, 4)),
            "gpus": draw(st.sampled_from([0, 8])),
        }
        for _ in range(draw(st.integers(1, 4)))
    ]
    since = draw(st.floats(0, SPAN))
    length = draw(st.floats(60, SPAN))
    bucket = draw(st.sampled_from([None, 3600.0, 5000.0, 86400.0]))
    now = since + length + draw(st.floats(-length / 2, SPAN / 2))  # now before or after until
    return {"jobs": jobs, "since": since, "until": since + length, "bucket": bucket, "now": now}


def _close(a: float, b: float) -> bool:
    """Equal but for float sums, and for the buckets' edges as the answer states them (to the microsecond: up to a
    microsecond per edge and GPU)."""
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-3)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=fleets())
def test_per_team_and_bucket_the_fleet_equals_the_jobs_own(db: Session, case: dict[str, Any]) -> None:
    run = uuid.uuid4().hex[:12]  # each example's jobs apart from the others'
    now = at(case["now"])
    jobs = []
    for spec in case["jobs"]:
        labels = {"run": run, **({"team": spec["team"]} if spec["team"] else {})}
        ended = any(e["type"] in ("succeeded", "failed", "cancelled") for e in spec["events"])
        job_id = add_job(
            db,
            spec["events"],
            labels=labels,
            nodes=spec["nodes"],
            gpus_per_node=spec["gpus"],
            status="SUCCEEDED" if ended else "RUNNING",
        )
        jobs.append((job_id, spec))
    from api import models

    for job_id, _ in jobs:
        job = models.jobs.get(db, job_id)
        assert job is not None
        summarize_job(db, job, now)
    db.flush()
    since, until = at(case["since"]), at(case["until"])
    out = fleet_goodput(
        db,
        since=since,
        until=until,
        now=now,
        scope=Scope(labels={"run": run}),
        bucket_s=case["bucket"],
        group_by="label:team",
        top=3,
    )
    ranges: list[tuple[int, datetime, datetime]] = [(-1, since, until)]
    for i, b in enumerate(out.series):
        ranges.append((i, b.start, b.end))
    if case["bucket"]:
        assert ranges[-1][2] == until and all(b.end - b.start <= timedelta(seconds=case["bucket"]) for b in out.series)
    for team in ("a", "b", None):
        mine = [(job_id, s) for job_id, s in jobs if s["team"] == team]
        group = next((g for g in out.groups if g.key == team), None)
        for idx, lo, hi in ranges:
            expected = dict.fromkeys(BUCKETS, 0.0)
            weighted = dict.fromkeys(BUCKETS, 0.0)
            in_range, faults = 0, 0
            for job_id, s in mine:
                own = own_seconds(db, job_id, now, lo, hi)
                gpus = s["nodes"] * (s["gpus"] or 2)
                for bucket, seconds in own.items():
                    expected[bucket] += seconds
                    weighted[bucket] += seconds * gpus
                in_range += sum(own.values()) > 0
                faults += own_faults(db, job_id, now, lo, hi)
            if group is None:
                assert sum(expected.values()) == 0 and faults == 0, (team, idx, expected)
                continue
            figures = group if idx == -1 else group.series[idx]
            got = {"productive": figures.productive_gpu_hours, **figures.lost_gpu_hours}
            for bucket in BUCKETS:
                assert _close(got[bucket] * 3600, weighted[bucket]), (team, idx, bucket, got, weighted)
            assert _close(figures.wall_hours * 3600, sum(expected.values())), (team, idx)
            assert figures.jobs == in_range, (team, idx)
            assert figures.faults_total == faults, (team, idx)
    assert _close(out.total.wall_gpu_hours, sum(g.wall_gpu_hours for g in out.groups))


@pytest.mark.parametrize("running", [False, True])
def test_a_group_of_one_job_equals_its_own_goodput(db: Session, running: bool) -> None:
    """Over a window holding the whole job, the group is the job's GET /v1/jobs/{id}/goodput, GPU-weighted."""
    from api import models
    from api.services import goodput

    events = [
        {"type": "submitted", "t": 0},
        {"type": "running", "t": 120, "step": 0, "details": {"restart_count": 0, "iteration": 0, "start_step": 0}},
        {"type": "checkpoint_saved", "t": 4000, "details": {"step": 100, "blocking_s": 30, "total_s": 40}},
        {"type": "rank_failed", "t": 7300, "step": 180, "rank": 1, "details": {"cause_class": "crash"}},
        {"type": "injob_restart", "t": 7400, "details": {"restart_count": 1, "failed_step": 180}},
        {
            "type": "running",
            "t": 7600,
            "step": 100,
            "details": {"restart_count": 1, "iteration": 0, "start_step": 100},
        },
    ]
    if not running:
        events.append({"type": "succeeded", "t": 12000, "details": {"final_step": 400}})
    job_id = add_job(db, events, labels={"team": "solo"}, nodes=2, gpus_per_node=8)
    now = at(15000)
    job = models.jobs.get(db, job_id)
    assert job is not None
    summarize_job(db, job, now)
    own = goodput.job_goodput(db, job, now=now)
    assert own is not None
    out = fleet_goodput(
        db, since=at(-3600), until=at(20000), now=now, scope=Scope(labels={"team": "solo"}), group_by="label:team"
    )
    (group,) = out.groups
    assert group.key == "solo" and group.jobs == 1 and group.faults_total == own.failures == 1
    assert group.faults == {"crash": 1}
    assert _close(group.wall_gpu_hours, own.wall_s * 16 / 3600)
    assert _close(group.productive_gpu_hours, own.productive_s * 16 / 3600)
    for bucket, seconds in own.lost_s.items():
        assert _close(group.lost_gpu_hours[bucket], seconds * 16 / 3600), bucket
    assert group.ettr is not None and own.ettr is not None and _close(group.ettr, own.ettr)
    assert _close(group.wall_hours, own.wall_s / 3600) and group.mtbf_hours == group.wall_hours


@pytest.mark.parametrize("bucket", [None, 86400.0, 7 * 86400.0])
def test_whole_days_of_long_jobs(db: Session, bucket: float | None) -> None:
    """Jobs of days, a window from mid-day to mid-day: whole UTC days are read by the day, the rest by the hour and
    the segment; per team and bucket the same as the jobs' own."""
    from api import models

    run = {"restart_count": 0, "iteration": 0, "start_step": 0}
    now = at(9 * 86400)
    teams = {}
    for n, (start, end) in enumerate([(-86400, 5 * 86400), (3600, 2.5 * 86400), (2 * 86400, None)]):
        events = [
            {"type": "submitted", "t": start},
            {"type": "running", "t": start + 300, "step": 0, "details": run},
            {"type": "checkpoint_saved", "t": start + 7 * 3600, "details": {"step": 10, "blocking_s": 60}},
            {"type": "rank_failed", "t": start + 30 * 3600, "step": 20, "rank": 0, "details": {"cause_class": "hang"}},
            {"type": "injob_restart", "t": start + 31 * 3600, "details": {"restart_count": 1, "failed_step": 20}},
            {"type": "running", "t": start + 32 * 3600, "step": 10, "details": {**run, "restart_count": 1}},
        ]
        if end is not None:
            events.append({"type": "succeeded", "t": end})
        team = "long" if n < 2 else "open"
        job_id = add_job(db, events, labels={"team": team, "case": "days"}, nodes=n + 1, gpus_per_node=8)
        job = models.jobs.get(db, job_id)
        assert job is not None
        summarize_job(db, job, now)
        teams.setdefault(team, []).append((job_id, (n + 1) * 8))
    since, until = at(0.4 * 86400 + 123.456), at(8.6 * 86400)
    out = fleet_goodput(
        db,
        since=since,
        until=until,
        now=now,
        scope=Scope(labels={"case": "days"}),
        bucket_s=bucket,
        group_by="label:team",
    )
    for team, jobs in teams.items():
        group = next(g for g in out.groups if g.key == team)
        ranges = [(group, since, until)] + [(b, b.start, b.end) for b in group.series]
        for figures, lo, hi in ranges:
            weighted = dict.fromkeys(BUCKETS, 0.0)
            for job_id, gpus in jobs:
                for b, seconds in own_seconds(db, job_id, now, lo, hi).items():
                    weighted[b] += seconds * gpus
            got = {"productive": figures.productive_gpu_hours, **figures.lost_gpu_hours}
            for b in BUCKETS:
                assert _close(got[b] * 3600, weighted[b]), (team, lo, b, got[b] * 3600, weighted[b])
