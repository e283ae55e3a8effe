"""Launching attempts (workers/supervision/launch_attempts.py) through a scripted backend: once per attempt,
a failed launch ends the job with its cause, a retryable one is tried again."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.support.supervision import ScriptedBackend, supervise
from tests.workers.supervision.conftest import event_types


def test_submit_launches_attempt_zero_once(admin: TestClient, make_job: Any, backend: ScriptedBackend) -> None:
    job = make_job()
    supervise(job["id"], force_launch=True)
    supervise(job["id"], force_launch=True)  # a redelivered submit task
    assert len(backend.launches) == 1
    launch = backend.launches[0]
    assert launch.attempt == 0 and launch.token.startswith("ftp_job_")
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["status"] == "SUBMITTED"
    assert event_types(admin, job["id"]) == ["submitted"]
    beat = TestClient(admin.app).post(
        f"/v1/jobs/{job['id']}/heartbeats",
        json={"heartbeats": [{"rank": 0, "step": 1}]},
        headers={"Authorization": f"Bearer {launch.token}"},
    )
    assert beat.status_code == 200  # the launch token is a valid trainer token


def test_launch_failure_ends_failed_with_cause(admin: TestClient, make_job: Any, backend: ScriptedBackend) -> None:
    backend.fail_launch = True
    job = make_job()
    supervise(job["id"], force_launch=True)
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["status"] == "FAILED"
    assert "cluster unreachable" in body["status_reason"]
    failed = [e for e in admin.get(f"/v1/jobs/{job['id']}/events").json()["items"] if e["type"] == "failed"]
    assert "cluster unreachable" in failed[0]["details"]["cause"]


def test_retryable_launch_error_is_retried_not_fatal(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    backend.fail_launch, backend.retryable = True, True
    job = make_job()
    supervise(job["id"], force_launch=True)
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["status"] == "PENDING" and "cluster unreachable" in body["attempts"][0]["cause"]
    backend.fail_launch = False
    supervise(job["id"], force_launch=True)
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "SUBMITTED"
    assert len(backend.launches) == 1
