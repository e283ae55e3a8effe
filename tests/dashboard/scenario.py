"""A job with faults, restarts, checkpoints and a stale rank, made through the API as a trainer would."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient

from api.schemas.events import utcnow
from tests.conftest import tiny_spec
from tests.support.embedded_app import post_events, start


def job_with_restarts(admin: TestClient) -> dict[str, Any]:
    response = admin.post(
        "/v1/jobs",
        json=tiny_spec(
            name="llama-fsdp",
            procs_per_node=4,
            resiliency={"heartbeat_timeout_s": 30},
            labels={"team": "pretraining"},
        ),
    )
    assert response.status_code == 201, response.text
    job = dict(response.json())
    start(job)
    t0 = utcnow() - timedelta(minutes=10)

    def at(minutes: float) -> str:
        return (t0 + timedelta(minutes=minutes)).isoformat()

    post_events(
        admin,
        job,
        {"key": "run", "type": "running", "ts": at(0.5)},
        {"key": "c1", "type": "checkpoint_saved", "ts": at(2), "step": 100,
         "details": {"blocking_s": 0.42, "total_s": 3.5, "bytes": 734003200}},
        {"key": "f1", "type": "fault_injected", "ts": at(3), "rank": 1, "details": {"kind": "exception"}},
        {"key": "r1", "type": "inprocess_restart", "ts": at(3.1), "rank": 1, "step": 130,
         "details": {"cause": "rank 1: RuntimeError: injected exception", "cause_class": "exception"}},
        {"key": "c2", "type": "checkpoint_saved", "ts": at(5), "step": 200,
         "details": {"blocking_s": 0.38, "total_s": 3.1, "bytes": 734003200}},
        {"key": "h1", "type": "hang_detected", "ts": at(6), "rank": 2, "step": 240,
         "details": {"cause": "no heartbeat for 31.2 s (timeout 30 s) at step 240", "cause_class": "hang",
                     "silent_s": 31.2}},
        {"key": "r2", "type": "injob_restart", "ts": at(6.5), "step": 240,
         "details": {"cause": "worker group failed", "cause_class": "other", "restart_count": 1}},
    )  # fmt: skip
    now = utcnow()
    beats = [
        {"rank": 0, "step": 310, "ts": now.isoformat(), "throughput": 1200.0},
        {"rank": 1, "step": 310, "ts": now.isoformat(), "throughput": 1190.0},
        {"rank": 2, "step": 250, "ts": (now - timedelta(seconds=120)).isoformat()},  # silent: stale
    ]
    response = admin.post(
        f"/v1/jobs/{job['id']}/heartbeats",
        json={"heartbeats": beats},
        headers={"Authorization": f"Bearer {job['token']}"},
    )
    assert response.status_code == 200, response.text
    return job
