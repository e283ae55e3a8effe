"""The straggler duty against the database, on heartbeats ingested through the API at chosen times: one episode
per slow stretch (detected within the window, cleared after), none for noise, the exclude action through the
lifecycle, and episodes closed when their attempt ends."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient

from tests.api.services.stragglers.support import beat, events_of, past, run_pass, running_job
from tests.support.supervision import ScriptedBackend

WINDOW = 20.0
SPEC: dict[str, Any] = {
    "nodes": 2,
    "procs_per_node": 4,
    "resiliency": {"stragglers": {"window_s": WINDOW, "threshold": 0.85}},
}


def drive(
    admin: TestClient,
    job_id: str,
    seconds: int,
    slow: dict[int, tuple[int, int, float]],
    seed: int = 1,
    start: datetime | None = None,
) -> Any:
    """One heartbeat round and one pass per second for `seconds` from `start` (default: 2 h ago); `slow[rank] =
    (from, to, factor)`. Noise: each rank's own work per step is 1 s +- 3 %, one step in fifty takes 1.6 s."""
    rng = random.Random(seed)
    start = start or past()
    for t in range(seconds):
        now = start + timedelta(seconds=t)
        paces = {}
        for rank in range(8):
            pace = 1.0 + rng.gauss(0, 0.03)
            if rng.random() < 0.02:
                pace = 1.6
            begin, end, factor = slow.get(rank, (0, 0, 1.0))
            if begin <= t < end:
                pace *= factor
            paces[rank] = pace
        beat(admin, job_id, now, paces, step=t + 1)
        run_pass(now)
    return start


def at(event: dict[str, Any], start: Any) -> float:
    return (datetime.fromisoformat(event["ts"].replace("Z", "+00:00")) - start).total_seconds()


def test_one_slow_stretch_is_one_episode_detected_within_the_window_and_cleared_after(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job_id = running_job(admin, make_job, **SPEC)
    start = drive(admin, job_id, 110, {5: (30, 70, 1.5)})
    (detected,) = events_of(admin, job_id, "straggler_detected")
    (cleared,) = events_of(admin, job_id, "straggler_cleared")
    assert detected["rank"] == 5 and detected["node"] == "node-1" and detected["attempt"] == 0
    assert 30 < at(detected, start) <= 30 + WINDOW  # found within the window
    d = detected["details"]
    assert d["cause_class"] == "straggler" and d["signal"] == "compute_s" and d["window_s"] == WINDOW
    assert 0.6 < d["score"] < 0.75 and 0.4 < d["slowdown_s"] < 0.6  # 1.5x: 0.67 of the pace, 0.5 s per step
    assert d["node_score"] is not None and d["threshold"] == 0.85 and d["action"] == "alert"
    assert 0 <= at(detected, start) - d["onset_s"] - 30 < 3  # the onset is dated back to the first slow pass
    assert 0 < d["lost_fraction"] <= 1 and d["episode"] == detected["key"]
    assert "rank 5 on node node-1 ran at 0.6" in d["cause"]
    assert cleared["rank"] == 5 and cleared["details"]["episode"] == detected["key"]
    assert 70 < at(cleared, start) <= 70 + WINDOW and cleared["details"]["reason"] == "recovered"
    assert at(cleared, start) - cleared["details"]["recovered_s"] == 69  # the last slow pass


def test_a_clearing_after_the_window_lost_every_slow_pass_dates_the_recovery_before_the_window(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    """A loaded machine: the slow rank's reports stop arriving after its slowdown, so no pass can clear it until
    they come back, by when its slow passes have left the window. The first report back still says slow: that
    pass keeps the episode; the next, healthy, clears it, dating the recovery at the last slow pass, not at the
    clearing (which would count the whole window as the straggler's)."""
    job_id = running_job(admin, make_job, **SPEC)
    start = drive(admin, job_id, 60, {5: (10, 60, 1.5)})
    assert events_of(admin, job_id, "straggler_detected")
    for t in range(60, 60 + int(2 * WINDOW) + 20):  # rank 5 is not heard from
        now = start + timedelta(seconds=t)
        beat(admin, job_id, now, {r: 1.0 for r in range(8) if r != 5}, step=t + 1)
        run_pass(now)
    assert not events_of(admin, job_id, "straggler_cleared")
    back = start + timedelta(seconds=60 + int(2 * WINDOW) + 20)
    beat(admin, job_id, back, {**dict.fromkeys(range(8), 1.0), 5: 1.5}, step=200)  # its first report back: slow
    run_pass(back)
    assert not events_of(admin, job_id, "straggler_cleared")  # a rank slow right now is not cleared
    back += timedelta(seconds=1)
    beat(admin, job_id, back, dict.fromkeys(range(8), 1.0), step=201)
    run_pass(back)
    (cleared,) = events_of(admin, job_id, "straggler_cleared")
    recovered = cleared["details"]["recovered_s"]
    assert cleared["details"]["reason"] == "recovered"
    assert 0 < recovered <= WINDOW, recovered  # the last slow pass, before the clearing


def test_noise_and_hiccups_open_no_episode(admin: TestClient, make_job: Any, backend: ScriptedBackend) -> None:
    job_id = running_job(admin, make_job, **SPEC)
    drive(admin, job_id, 80, {}, seed=7)
    assert events_of(admin, job_id, "straggler_detected") == []


def test_a_rank_slow_for_less_than_half_the_window_is_no_straggler(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job_id = running_job(admin, make_job, **SPEC)
    drive(admin, job_id, 60, {2: (25, 33, 2.0)})  # 8 s of a 20 s window
    assert events_of(admin, job_id, "straggler_detected") == []


def test_step_times_are_the_signal_when_no_rank_times_its_own_work(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job_id = running_job(admin, make_job, **SPEC)
    start = past()
    for t in range(40):
        paces = {r: (1.3 if r == 6 else 1.0) for r in range(8)}
        beat(admin, job_id, start + timedelta(seconds=t), paces, signal="step_time_s")
        run_pass(start + timedelta(seconds=t))
    (detected,) = events_of(admin, job_id, "straggler_detected")
    assert detected["rank"] == 6 and detected["details"]["signal"] == "step_time_s"
    # the straggler's own step is the slow pace: 0.3 of its 1.3 s per step
    assert abs(detected["details"]["lost_fraction"] - 0.3 / 1.3) < 0.01


def test_disabled_detection_records_nothing(admin: TestClient, make_job: Any, backend: ScriptedBackend) -> None:
    job_id = running_job(admin, make_job, **{**SPEC, "resiliency": {"stragglers": {"enabled": False}}})
    drive(admin, job_id, 40, {5: (0, 40, 2.0)})
    assert events_of(admin, job_id, "straggler_detected") == []


def test_exclude_restarts_the_job_without_the_stragglers_node(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    spec = {**SPEC, "resiliency": {"stragglers": {"window_s": WINDOW, "action": "exclude", "exclude_after_s": 5}}}
    job_id = running_job(admin, make_job, **spec)
    start = drive(admin, job_id, 60, {5: (0, 60, 1.5)})
    (detected,) = events_of(admin, job_id, "straggler_detected")
    (restart,) = events_of(admin, job_id, "job_restart")
    (cleared,) = events_of(admin, job_id, "straggler_cleared")
    assert 5 <= at(cleared, start) - at(detected, start) <= 6  # closed for the restart, exclude_after_s on
    assert restart["details"]["cause_class"] == "straggler" and restart["details"]["node"] == "node-1"
    assert "resiliency.stragglers.action is exclude" in restart["details"]["cause"]
    (excluded,) = events_of(admin, job_id, "node_excluded")
    assert excluded["node"] == "node-1" and excluded["details"]["cause_class"] == "straggler"
    assert cleared["details"]["reason"] == "the job restarts without node(s) node-1"
    job = admin.get(f"/v1/jobs/{job_id}").json()
    assert job["attempt"] == 1 and job["excluded_nodes"] == ["node-1"] and job["job_restarts"] == 1


def test_exclude_with_the_restart_budget_spent_lets_the_job_run_on(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    from api.core.db import session_scope
    from api.database.tables import JobWatch

    spec = {
        **SPEC,
        "resiliency": {
            "max_job_restarts": 0,
            "stragglers": {"window_s": WINDOW, "action": "exclude", "exclude_after_s": 5},
        },
    }
    job_id = running_job(admin, make_job, **spec)
    drive(admin, job_id, 50, {5: (0, 50, 1.5)})
    assert len(events_of(admin, job_id, "straggler_detected")) == 1
    assert events_of(admin, job_id, "job_restart") == []
    assert admin.get(f"/v1/jobs/{job_id}").json()["status"] == "RUNNING"  # a slow job beats a failed one
    with session_scope() as session:
        watch = session.get(JobWatch, job_id)
        assert watch is not None and watch.open_stragglers == 1
        (episode,) = watch.stragglers["open"].values()
        assert episode["decision"].startswith("not excluded: no job restart to be had")


def test_episodes_close_when_their_attempt_ends_or_the_job_does(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    from workers.backends.base import AttemptPhase, AttemptReading

    job_id = running_job(admin, make_job, **SPEC)
    start = drive(admin, job_id, 40, {5: (0, 40, 1.5)})
    assert len(events_of(admin, job_id, "straggler_detected")) == 1
    backend.statuses[0] = AttemptReading(AttemptPhase.succeeded)
    from tests.support.supervision import supervise

    supervise()
    assert admin.get(f"/v1/jobs/{job_id}").json()["status"] == "SUCCEEDED"
    run_pass(start + timedelta(seconds=41))
    (cleared,) = events_of(admin, job_id, "straggler_cleared")
    assert cleared["details"]["reason"] == "the job is succeeded"
    run_pass(start + timedelta(seconds=42))
    assert len(events_of(admin, job_id, "straggler_cleared")) == 1  # once


def test_a_job_is_scored_at_most_every_half_report_interval(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    """At a 30 s report interval a node's ranks' heartbeats change once in 30 s: passes every 2 s score the job once
    in 15 s, and the episodes stand between them."""
    from api.core.db import session_scope
    from api.database.tables import JobWatch

    spec = {
        **SPEC,
        "progress": {"report_interval_s": 30},
        "resiliency": {
            "heartbeat_timeout_s": 90,
            "initial_heartbeat_timeout_s": 120,
            "stragglers": {"window_s": 300, "threshold": 0.85},
        },
    }
    job_id = running_job(admin, make_job, **spec)
    start = past()
    for t in range(0, 40, 2):
        now = start + timedelta(seconds=t)
        beat(admin, job_id, now, {r: 1.5 if r == 5 else 1.0 for r in range(8)}, step=t + 1)
        run_pass(now)
    with session_scope() as session:
        watch = session.get(JobWatch, job_id)
        assert watch is not None
        passes = [round(p - start.timestamp()) for p in watch.stragglers["passes"]]
    assert passes == [0, 16, 32]
