"""`GET /v1/jobs/{id}/goodput` on stored events (SQLite and PostgreSQL), and the dashboard/metrics slot."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.services.goodput.test_accounting import RESTART_SCENARIO_LOST
from tests.api.services.goodput.test_silences import HANG_SCENARIO_LOST

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def event(key: str, type_: str, t: float, **fields: Any) -> dict[str, Any]:
    return {"key": key, "type": type_, "ts": at(t), **fields}


def running(key: str, t: float, start_step: int, restart_count: int, ranks: int) -> list[dict[str, Any]]:
    """Every rank reports; the last one at t (the run's start)."""
    return [
        event(
            f"{key}:r{rank}",
            "running",
            t - 0.01 * (ranks - 1 - rank),
            rank=rank,
            step=start_step,
            details={"restart_count": restart_count, "iteration": 0, "start_step": start_step, "world_size": ranks},
        )
        for rank in range(ranks)
    ]


def saved(key: str, begin: float, step: int) -> dict[str, Any]:
    details = {"step": step, "blocking_s": 1.0, "total_s": 1.0, "bytes": 1000}
    return event(key, "checkpoint_saved", begin + 1, rank=0, step=step, details=details)


# test_accounting.test_in_job_restart_with_recompute, as a trainer and the supervisor would post it.
HISTORY = [
    event("submitted:a0", "submitted", 0),
    *running("run0", 10, 0, 0, 8),
    saved("ckpt100", 30, 100),
    event("fault", "fault_injected", 41, rank=1, details={"kind": "crash"}),
    event("rf", "rank_failed", 41.2, rank=0, step=150, details={"cause": "RuntimeError"}),
    event("launcher", "rank_failed", 43, rank=1, step=150, details={"cause": "exit code 1", "source": "launcher"}),
    event("injob:1", "injob_restart", 43, step=150, details={"restart_count": 1, "failed_step": 150}),
    *running("run1", 50, 100, 1, 8),
    saved("ckpt200", 70, 200),
    event("end", "succeeded", 74, details={"final_step": 200}),
]


def submitted(make_job: Any, **spec: Any) -> dict[str, Any]:
    from api import models
    from api.core.db import session_scope
    from api.services import lifecycle

    job = make_job(**spec)
    with session_scope() as session:  # as the launch would
        row = models.jobs.get(session, job["id"])
        assert row is not None
        lifecycle.transition(session, row, lifecycle.JobStatus.SUBMITTED)
    return dict(job)


# A node agent's `running` for ranks it saw start without word from them (it cannot know the step resumed from),
# later than the ranks' own: where the ranks said it themselves, the goodput is the same without these.
INFERRED_BY_THE_AGENT = [
    event(f"agent:r{count}", "running", t, step=0, details={"restart_count": count, "iteration": 0, "source": "agent"})
    for count, t in ((0, 10.5), (1, 51))
]


@pytest.mark.parametrize("agent_said_too", [False, True], ids=["ranks", "ranks-and-agent"])
def test_goodput_of_a_job_from_its_stored_events(admin: TestClient, make_job: Any, agent_said_too: bool) -> None:
    job = submitted(make_job, procs_per_node=8, checkpoint={"interval_steps": 100, "engine": "sync"})
    url = f"/v1/jobs/{job['id']}"
    history = HISTORY + INFERRED_BY_THE_AGENT if agent_said_too else HISTORY
    posted = admin.post(f"{url}/events", json={"events": history}, headers={"Authorization": f"Bearer {job['token']}"})
    assert posted.status_code == 200, posted.text

    response = admin.get(f"{url}/goodput")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["job_id"] == job["id"] and body["finished"] is True
    assert body["wall_s"] == pytest.approx(74)
    assert body["productive_s"] == pytest.approx(40)
    assert body["lost_s"] == pytest.approx({"queued": 0, "straggler": 0, **RESTART_SCENARIO_LOST})
    assert body["ettr"] == pytest.approx(40 / 74)
    assert body["failures"] == 1 and body["recomputed_steps"] == 50
    assert body["step_time_s"] == pytest.approx(0.2)
    assert [a["attempt"] for a in body["attempts"]] == [0]
    assert body["attempts"][0]["wall_s"] == pytest.approx(74)
    advice = body["advice"]
    assert advice["checkpoint_blocking_s"] == 1 and advice["mtbf_s"] is None
    assert advice["current"]["interval_steps"] == pytest.approx(100)
    assert "not enough failures yet" in advice["note"]


def test_goodput_before_launch_unknown_job_and_trainer_token(admin: TestClient, make_job: Any) -> None:
    job = make_job()
    body = admin.get(f"/v1/jobs/{job['id']}/goodput").json()
    assert body["wall_s"] == 0 and body["ettr"] is None and body["start"] is None

    missing = admin.get("/v1/jobs/nope/goodput")
    assert missing.status_code == 404 and "nope" in missing.json()["error"]["message"]

    refused = admin.get(f"/v1/jobs/{job['id']}/goodput", headers={"Authorization": f"Bearer {job['token']}"})
    assert refused.status_code == 403


def test_dashboard_and_metrics_show_the_ettr(admin: TestClient, make_job: Any) -> None:
    from api import models
    from api.core.db import session_scope
    from api.services import goodput_view

    job = submitted(make_job, procs_per_node=8)
    now = datetime.now(UTC)
    recent = [
        {"key": "s", "type": "submitted", "ts": (now - timedelta(seconds=100)).isoformat()},
        {
            "key": "r",
            "type": "running",
            "ts": (now - timedelta(seconds=80)).isoformat(),
            "step": 0,
            "details": {"restart_count": 0, "iteration": 0, "start_step": 0},
        },
    ]
    assert admin.post(f"/v1/jobs/{job['id']}/events", json={"events": recent}).status_code == 200

    with session_scope() as session:
        row = models.jobs.get(session, job["id"])
        assert row is not None
        view = goodput_view.goodput_of(session, row)
    # a running job's wall time runs to now: 100 s, and however long this test took since (a loaded machine's)
    assert view is not None and 100 - 0.01 <= view.wall_s <= 100 + (datetime.now(UTC) - now).total_seconds()
    assert view.ettr == pytest.approx((view.wall_s - 20) / view.wall_s, abs=0.001)
    assert dict(view.lost)["initialization"] == pytest.approx(20, abs=0.1)

    metrics = admin.get("/metrics").text
    line = next(x for x in metrics.splitlines() if x.startswith("ftplane_job_goodput_ratio") and job["id"] in x)
    wall = 100 + (datetime.now(UTC) - now).total_seconds()
    assert 0.8 - 0.001 <= float(line.rsplit(" ", 1)[1]) <= (wall - 20) / wall


def test_the_job_page_shows_goodput_and_the_interval_advice(admin: TestClient, make_job: Any) -> None:
    job = submitted(make_job, procs_per_node=8, checkpoint={"interval_steps": 100, "engine": "sync"})
    assert admin.post(f"/v1/jobs/{job['id']}/events", json={"events": HISTORY}).status_code == 200
    page = admin.get(f"/ui/jobs/{job['id']}/live")
    assert page.status_code == 200, page.text
    assert "ETTR <strong>54.1 %</strong>" in page.text  # 40 / 74
    assert "recompute" in page.text and "fault detection" in page.text
    assert "Now every 100 steps (20.0 s of training)" in page.text
    assert "Productive time of 2 runs from: the ranks&#39; SDK" in page.text
    assert "not enough failures yet (1 seen, 2 needed" in page.text


def test_advice_in_words() -> None:
    from api.schemas.goodput import Advice, IntervalPrediction
    from api.services.goodput_view import advice_lines

    def interval(seconds: float, steps: float, ettr: float) -> IntervalPrediction:
        return IntervalPrediction(interval_s=seconds, interval_steps=steps, lost_fraction=None, predicted_ettr=ettr)

    measured = {"checkpoints": 3, "failures": 2, "min_failures": 2, "step_time_s": 0.2}
    advice = Advice(
        checkpoint_blocking_s=2.0,
        mtbf_s=100.0,
        restart_cost_s=10.0,
        optimal=interval(20.0, 100.0, 0.7),
        current=interval(10.0, 50.0, 0.65),
        note="first-order Young/Daly",
        **measured,
    )
    assert advice_lines(advice) == (
        "Checkpoint every 100 steps (20.0 s of training): predicted ETTR 70.0 % "
        "(Young/Daly from C 2 s, M 100 s, R 10 s)",
        "Now every 50 steps (10.0 s of training): predicted ETTR 65.0 %",
    )
    nothing = Advice(
        checkpoint_blocking_s=None, mtbf_s=None, restart_cost_s=None, optimal=None, current=None, note="", **measured
    )
    assert advice_lines(nothing) == ()


def test_a_job_wide_hang_is_read_per_detection_pass(admin: TestClient, make_job: Any) -> None:
    """test_silences.test_hang_detected_by_silence, stored: the supervisor records a pass's hang_detected
    events (one per silent rank) with one time; a silence without silent_s (its cause is not read) is
    detected at its own time, after the pass. Expected: fault_detection 41..71 = 30 s, restart 71..80 = 9 s."""
    job = submitted(make_job, procs_per_node=8)
    silent = [
        event(f"hang:r{r}", "hang_detected", 71, rank=r, step=150, details={"cause": "quiet", "silent_s": 30 - r})
        for r in range(8)
    ]
    unmeasured = event("hang:old", "hang_detected", 72, rank=0, step=150, details={"cause": "no heartbeat for 20.0 s"})
    history = [
        event("submitted:a0", "submitted", 0),
        *running("run0", 10, 0, 0, 8),
        saved("ckpt100", 30, 100),
        *silent,
        unmeasured,
        event("injob:1", "injob_restart", 75, details={"restart_count": 1}),
        *running("run1", 80, 100, 1, 8),
        saved("ckpt200", 100, 200),
        event("end", "succeeded", 104, details={"final_step": 200}),
    ]
    assert admin.post(f"/v1/jobs/{job['id']}/events", json={"events": history}).status_code == 200
    body = admin.get(f"/v1/jobs/{job['id']}/goodput").json()
    assert body["lost_s"] == pytest.approx({"queued": 0, "straggler": 0, **HANG_SCENARIO_LOST})
    assert body["productive_s"] == pytest.approx(40) and body["failures"] == 1
