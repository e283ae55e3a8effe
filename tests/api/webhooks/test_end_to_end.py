"""End to end: a real Celery worker (with beat) delivers a restart stored through the API to a
real local receiver, signed, within 2 s; retries a 500 under the same webhook-id; and its beat
sweep finds a delivery whose task was lost."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from standardwebhooks import Webhook

from tests.conftest import tiny_spec
from tests.support.embedded_app import point_at, post_events
from tests.support.processes import CeleryWorker
from tests.support.receivers import Receiver
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def live(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[TestClient]:
    """The API in-process, and a real worker + beat as a subprocess on the same database and broker."""
    point_at(
        monkeypatch,
        tmp_path,
        FTPLANE_QUEUE=f"ftplane-test-{uuid.uuid4().hex[:8]}",
        FTPLANE_SUPERVISE_INTERVAL_S="3600",  # supervision is not under test here
    )
    from api.core.db import reset_caches, session_scope
    from api.main import create_app
    from api.models import tokens

    app = create_app()
    with session_scope() as session:
        _, token = tokens.create_admin(session, "tests")
    try:
        with (
            CeleryWorker(os.environ, tmp_path / "worker.log"),
            TestClient(app, headers={"Authorization": f"Bearer {token}"}) as client,
        ):
            yield client
    finally:
        reset_caches()


def deliveries(client: TestClient, hook: dict[str, Any]) -> list[dict[str, Any]]:
    return list(client.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["items"])


def newest_delivered(client: TestClient, hook: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The delivery log, once its newest delivery is delivered."""
    log = deliveries(client, hook)
    return log if log[0]["status"] == "delivered" else None


def test_restart_delivered_by_a_real_worker_within_two_seconds(live: TestClient, receiver: Receiver) -> None:
    from api.core.db import session_scope
    from api.database.tables import WebhookDelivery
    from api.schemas.events import utcnow

    hook = live.post("/v1/webhooks", json={"url": receiver.url + "/ok", "event_types": ["injob_restart"]}).json()
    job = live.post("/v1/jobs", json=tiny_spec(command=["python", "-c", "pass"])).json()

    # The first delivery also waits for the worker to start.
    post_events(live, job, {"key": "warm-up", "type": "injob_restart"})
    receiver.wait_for("/ok", 1, timeout=90)

    stored_at = time.monotonic()
    post_events(live, job, {"key": "r1", "type": "injob_restart", "details": {"cause": "exit code 1"}})
    got = receiver.wait_for("/ok", 2, timeout=10)[1]
    assert got.at - stored_at < 2.0, f"delivered {got.at - stored_at:.2f} s after the event was stored"
    payload = Webhook(hook["secret"]).verify(got.body, got.headers)
    assert payload["type"] == "injob_restart" and payload["data"]["job"]["id"] == job["id"]
    assert payload["data"]["event"]["details"]["cause"] == "exit code 1"
    # the worker marks a delivery delivered once the receiver's answer is back: a moment after it arrived
    log = wait_for(
        "both deliveries marked delivered",
        lambda: (found := deliveries(live, hook)) and all(d["status"] == "delivered" for d in found) and found,
        timeout=10,
    )
    assert got.headers["webhook-id"] in {d["id"] for d in log} and len(log) == 2

    # A receiver answering 500, then 200, gets the same webhook-id twice.
    receiver.script["/flaky"] = [500]
    flaky = live.post("/v1/webhooks", json={"url": receiver.url + "/flaky", "event_types": ["job_restart"]}).json()
    post_events(live, job, {"key": "r2", "type": "job_restart"})
    first, second = receiver.wait_for("/flaky", 2, timeout=20)
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    for request in (first, second):
        Webhook(flaky["secret"]).verify(request.body, request.headers)
    log = wait_for("the retried delivery to be recorded", lambda: newest_delivered(live, flaky), 5)
    assert (log[0]["status"], log[0]["attempts"], log[0]["last_status_code"]) == ("delivered", 2, 200)

    # A delivery whose task was lost (no task queued at all) is found by the beat's sweep.
    lost_id = log_id = deliveries(live, hook)[0]["id"]
    with session_scope() as session:
        session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == log_id)
            .values(status="pending", next_try_at=utcnow() - timedelta(minutes=5), delivered_at=None)
        )
    got = receiver.wait_for("/ok", 3, timeout=40)[2]
    assert got.headers["webhook-id"] == lost_id
