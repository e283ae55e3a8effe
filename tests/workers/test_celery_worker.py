"""A real Celery worker (with beat) on Redis, and on the embedded broker, runs a real local job to the end."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import REDIS_URL, configure_env, require, tiny_spec
from tests.support.processes import CeleryWorker
from tests.support.waiting import wait_for


def wait_status(client: TestClient, job_id: str, wanted: set[str], timeout: float) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        body: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        return body if body["status"] in wanted else None

    return dict(wait_for(f"job {job_id} to be one of {sorted(wanted)}", reached, timeout, interval=0.2))


pytestmark = pytest.mark.slow  # each test runs a real Celery worker through a job


@pytest.fixture(params=["redis", "embedded"])
def worker_client(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[TestClient]:
    extra = {"FTPLANE_SUPERVISE_INTERVAL_S": "0.5", "FTPLANE_QUEUE": f"ftplane-test-{uuid.uuid4().hex[:8]}"}
    if request.param == "redis":
        extra["FTPLANE_REDIS_URL"] = require(REDIS_URL, "FTPLANE_TEST_REDIS_URL")
    configure_env(monkeypatch, tmp_path / "state", f"sqlite:///{tmp_path / 'ftplane.db'}", **extra)
    if request.param == "redis":
        from api.core.config import get_settings
        from workers.celery_app import celery_app, configure

        monkeypatch.setenv("FTPLANE_REDIS_URL", extra["FTPLANE_REDIS_URL"])
        get_settings.cache_clear()
        configure(celery_app, get_settings())
    from api.core.db import session_scope
    from api.main import create_app
    from api.models import tokens

    app = create_app()
    with session_scope() as session:
        _, token = tokens.create_admin(session, "tests")
    with (
        CeleryWorker(os.environ, tmp_path / "worker.log"),
        TestClient(app, headers={"Authorization": f"Bearer {token}"}) as client,
    ):
        yield client


def test_submitted_job_runs_to_success_through_the_worker(worker_client: TestClient) -> None:
    job = worker_client.post("/v1/jobs", json=tiny_spec()).json()
    body = wait_status(worker_client, job["id"], {"SUCCEEDED", "FAILED"}, timeout=90)
    assert body["status"] == "SUCCEEDED", body
    types = [e["type"] for e in worker_client.get(f"/v1/jobs/{job['id']}/events").json()["items"]]
    assert types == ["submitted", "succeeded"]


def test_failing_job_ends_failed_with_cause(worker_client: TestClient) -> None:
    spec = tiny_spec(
        command=["python", "-c", "import sys; sys.exit(3)"],
        resiliency={"max_in_job_restarts": 0, "max_job_restarts": 0},
    )
    job = worker_client.post("/v1/jobs", json=spec).json()
    body = wait_status(worker_client, job["id"], {"SUCCEEDED", "FAILED"}, timeout=90)
    assert body["status"] == "FAILED"
    assert "exit code 1" in body["status_reason"] and "budget (0) spent" in body["status_reason"]
