"""Restart anomalies from a job's events: a restart storm once per episode, progress that stalls across restart
cycles, a recovery that never finishes (queue waits aside); each an event with its evidence, and a webhook."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient

from tests.api.services.stragglers.support import events_of, past, running_job
from tests.support.supervision import ScriptedBackend


def post(admin: TestClient, job_id: str, *events: dict[str, Any]) -> None:
    response = admin.post(f"/v1/jobs/{job_id}/events", json={"events": list(events)})
    assert response.status_code == 200, response.text


def restart(n: int, at: datetime, cause: str = "crash") -> dict[str, Any]:
    return {
        "key": f"injob_restart:{n}",
        "type": "injob_restart",
        "ts": at.isoformat(),
        "details": {"restart_count": n, "cause": f"rank 1 {cause}", "cause_class": cause},
    }


def saved(step: int, at: datetime) -> dict[str, Any]:
    details = {"step": step, "blocking_s": 0.1}
    return {"key": f"ckpt:{step}", "type": "checkpoint_saved", "ts": at.isoformat(), "step": step, "details": details}


def running(n: int, at: datetime) -> dict[str, Any]:
    details = {"restart_count": n}
    return {"key": f"running:{n}", "type": "running", "ts": at.isoformat(), "rank": 0, "details": details}


def queued(key: str, at: datetime, state: str) -> dict[str, Any]:
    return {"key": key, "type": "queued", "ts": at.isoformat(), "details": {"queue_state": state}}


def watch(now: datetime) -> None:
    from api.core.db import session_scope
    from workers.supervision import detect_restart_anomalies

    with session_scope() as session:
        detect_restart_anomalies.run_once(session, now)


SPEC = {"resiliency": {"max_in_job_restarts": 50, "anomalies": {"storm_restarts": 3, "storm_window_s": 600}}}


def test_a_restart_storm_is_announced_once_per_episode(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job_id = running_job(admin, make_job, **SPEC)
    start = past()
    for n in range(1, 6):  # five restarts a minute apart, training resuming after each, checkpoints moving on
        post(admin, job_id, saved(10 * n, start + timedelta(seconds=60 * n - 30)))
        post(
            admin,
            job_id,
            restart(n, start + timedelta(seconds=60 * n)),
            running(n, start + timedelta(seconds=60 * n + 5)),
        )
        watch(start + timedelta(seconds=60 * n + 10))
    (storm,) = events_of(admin, job_id, "restart_storm")
    d = storm["details"]
    assert d["restarts"] == 3 and d["threshold"] == 3 and d["window_s"] == 600 and d["by_rung"] == {"injob": 3}
    assert d["by_cause"] == {"crash": 3} and len(d["evidence"]) == 3
    assert "restart storm: 3 restarts within 10 min" in d["cause"]
    assert events_of(admin, job_id, "progress_stalled") == []  # every cycle saved a newer checkpoint
    watch(start + timedelta(seconds=60 * 5 + 700))  # the window empties: the episode is over
    post(admin, job_id, *(restart(n, start + timedelta(seconds=1100 + n)) for n in range(6, 9)))
    watch(start + timedelta(seconds=1110))
    assert len(events_of(admin, job_id, "restart_storm")) == 2  # a new storm, a new event


def test_restart_cycles_that_do_not_move_the_checkpoint_are_a_stall(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job_id = running_job(admin, make_job, resiliency={"max_in_job_restarts": 50, "anomalies": {"stalled_cycles": 3}})
    start = past()
    post(admin, job_id, saved(40, start + timedelta(seconds=10)), restart(1, start + timedelta(seconds=20)))
    for n in range(2, 5):  # three more cycles, none saving past step 40
        post(admin, job_id, restart(n, start + timedelta(seconds=20 + 3000 * n)))
        watch(start + timedelta(seconds=25 + 3000 * n))
    (stall,) = events_of(admin, job_id, "progress_stalled")
    d = stall["details"]
    assert d["checkpoint_step"] == 40 and stall["step"] == 40 and d["cycles"] == 3 and d["cause_class"] == "no_progress"
    assert "3 restart cycles in a row without a newer checkpoint (step 40)" in d["cause"]
    assert stall["key"] == "progress_stalled:ckpt40:injob_restart:1"  # the stall began at the first restart on it
    assert events_of(admin, job_id, "restart_storm") == []  # 3000 s apart: no storm


def test_a_recovery_that_never_resumes_training_is_stuck_queue_time_aside(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    start = past()
    job_id = running_job(
        admin, make_job, started=start - timedelta(hours=1), resiliency={"anomalies": {"cycle_timeout_s": 600}}
    )
    post(admin, job_id, restart(1, start))
    post(admin, job_id, queued("q1", start + timedelta(seconds=10), "waiting"))
    post(admin, job_id, queued("q2", start + timedelta(seconds=410), "admitted"))
    watch(start + timedelta(seconds=900))  # 900 s, 400 of them queued: 500 s of recovery
    assert events_of(admin, job_id, "recovery_stuck") == []
    watch(start + timedelta(seconds=1100))
    (stuck,) = events_of(admin, job_id, "recovery_stuck")
    assert stuck["key"] == "recovery_stuck:injob_restart:1" and stuck["details"]["waited_s"] == 700
    assert "no training since the injob restart" in stuck["details"]["cause"]
    watch(start + timedelta(seconds=1200))
    assert len(events_of(admin, job_id, "recovery_stuck")) == 1  # once per restart
    post(admin, job_id, restart(2, start + timedelta(seconds=1300)), running(2, start + timedelta(seconds=1310)))
    watch(start + timedelta(seconds=3000))
    assert len(events_of(admin, job_id, "recovery_stuck")) == 1  # training resumed after that one


def test_anomalies_reach_webhook_subscriptions(
    admin: TestClient, make_job: Any, backend: ScriptedBackend, receiver: Any, monkeypatch: Any
) -> None:
    from api.core.config import get_settings
    from api.core.db import session_scope
    from api.database.tables import WebhookDelivery

    monkeypatch.setenv("FTPLANE_WEBHOOK_ALLOW_PRIVATE", "true")  # the receiver is on 127.0.0.1
    get_settings.cache_clear()
    sub = admin.post("/v1/webhooks", json={"url": receiver.url + "/hook"})  # the default types
    assert sub.status_code == 201, sub.text
    job_id = running_job(admin, make_job, **SPEC)
    start = past()
    post(admin, job_id, *(restart(n, start + timedelta(seconds=n)) for n in range(1, 4)))
    watch(start + timedelta(seconds=10))
    with session_scope() as session:
        payloads = [d.payload for d in session.query(WebhookDelivery).all() if d.payload]
    (storm,) = [p for p in payloads if p["type"] == "restart_storm"]
    assert storm["data"]["event"]["details"]["restarts"] == 3 and storm["data"]["job"]["id"] == job_id
