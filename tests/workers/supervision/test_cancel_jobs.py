"""Cancellation (workers/supervision/cancel_jobs.py): a launched job's attempt is torn down."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.support.supervision import ScriptedBackend, supervise


def test_cancel_of_a_launched_job_tears_it_down(admin: TestClient, make_job: Any, backend: ScriptedBackend) -> None:
    job = make_job()
    supervise(job["id"], force_launch=True)
    assert admin.post(f"/v1/jobs/{job['id']}/cancel").json()["cancel_requested"] is True
    supervise(job["id"])
    assert backend.cancels == [0]
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "CANCELLED"


def test_a_cancelled_job_is_marked_cancelled_only_once_its_attempt_has_stopped(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    """The teardown is asked for, not waited on: the pass goes on, and the next one that finds the attempt gone
    marks the job."""
    job = make_job()
    supervise(job["id"], force_launch=True)
    backend.stopping.add(0)  # its processes take their grace
    admin.post(f"/v1/jobs/{job['id']}/cancel")
    supervise()
    detail = admin.get(f"/v1/jobs/{job['id']}").json()
    assert backend.cancels == [0] and detail["cancel_requested"] is True and detail["status"] != "CANCELLED"
    backend.stopping.clear()
    supervise()
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "CANCELLED"
