"""Delivery: outbox rows in the event's transaction, signed with Standard Webhooks, retried with
backoff under one webhook-id, ending in the log; the sweep finds deliveries whose task was lost."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from standardwebhooks import Webhook

from api.core.db import session_scope
from api.database.tables import WebhookDelivery
from api.schemas.events import utcnow
from api.webhooks import outbox
from tests.support.embedded_app import post_events, start
from tests.support.receivers import Receiver
from workers.tasks.webhooks import deliver_webhook, sweep_webhook_deliveries

Enqueued = list[tuple[str, float | None]]


def subscribe(admin: TestClient, receiver: Receiver, path: str = "/hook", **body: Any) -> dict[str, Any]:
    response = admin.post("/v1/webhooks", json={"url": receiver.url + path, **body})
    assert response.status_code == 201, response.text
    return dict(response.json())


def deliveries(admin: TestClient, hook: dict[str, Any]) -> list[dict[str, Any]]:
    return list(admin.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["items"])


def test_a_restart_is_delivered_signed_with_the_job_summary(
    admin: TestClient, receiver: Receiver, make_job: Callable[..., dict[str, Any]], enqueued: Enqueued
) -> None:
    hook = subscribe(admin, receiver)
    job = make_job(labels={"team": "research", "model": "llama"})
    start(job)
    post_events(admin, job, {"key": "up", "type": "running"})
    post_events(
        admin,
        job,
        {
            "key": "r1",
            "type": "injob_restart",
            "rank": 1,
            "step": 40,
            "details": {"cause": "exit code 137", "cause_class": "crash", "exit_code": 137},
        },
    )
    assert len(enqueued) == 1 and enqueued[0][1] is None  # enqueued once the event was committed
    assert deliver_webhook(enqueued[0][0]) == "delivered"

    [got] = receiver.at("/hook")
    payload = Webhook(hook["secret"]).verify(got.body, got.headers)
    assert got.headers["webhook-id"] == enqueued[0][0]
    assert got.headers["content-type"] == "application/json"
    assert payload["type"] == "injob_restart"
    event = payload["data"]["event"]
    assert (event["type"], event["rank"], event["step"], event["details"]["cause"]) == (
        "injob_restart",
        1,
        40,
        "exit code 137",
    )
    assert (event["details"]["cause_class"], event["details"]["exit_code"]) == ("crash", 137)
    summary = payload["data"]["job"]
    assert {k: summary[k] for k in ("id", "name", "status", "attempt", "labels")} == {
        "id": job["id"],
        "name": "tiny",
        "status": "RECOVERING",  # what the restart did to the job, when it was stored
        "attempt": 0,
        "labels": {"team": "research", "model": "llama"},
    }
    with pytest.raises(Exception, match="signature"):
        Webhook(hook["secret"]).verify(got.body.replace(b"137", b"138"), got.headers)

    [logged] = deliveries(admin, hook)
    assert logged["id"] == got.headers["webhook-id"]
    assert (logged["status"], logged["attempts"], logged["last_status_code"], logged["last_error"]) == (
        "delivered",
        1,
        200,
        None,
    )
    assert logged["event_type"] == "injob_restart" and logged["next_try_at"] is None
    assert deliver_webhook(enqueued[0][0]) == "skipped"  # a duplicate task does not send twice
    assert len(receiver.at("/hook")) == 1


def test_every_rung_hang_exclusion_and_job_end_is_announced_but_not_the_rest(
    admin: TestClient, receiver: Receiver, make_job: Callable[..., dict[str, Any]], enqueued: Enqueued
) -> None:
    subscribe(admin, receiver)
    job = make_job()
    start(job)
    announced = ["inprocess_restart", "injob_restart", "job_restart", "hang_detected", "node_excluded"]
    quiet = ["running", "checkpoint_saved", "heartbeat_lost", "rank_failed", "fault_injected"]
    post_events(admin, job, *({"key": t, "type": t} for t in quiet + announced))
    for delivery_id, _ in enqueued:
        deliver_webhook(delivery_id)
    assert [r.json()["type"] for r in receiver.at("/hook")] == announced

    pending = make_job(name="never-launched")  # cancelling a PENDING job ends it at once
    assert admin.post(f"/v1/jobs/{pending['id']}/cancel").status_code == 202
    deliver_webhook(enqueued[-1][0])
    last = receiver.at("/hook")[-1].json()
    assert last["type"] == "cancelled" and last["data"]["job"]["status"] == "CANCELLED"
    assert last["data"]["job"]["id"] == pending["id"]


def test_a_resent_event_is_not_delivered_twice(
    admin: TestClient, receiver: Receiver, make_job: Callable[..., dict[str, Any]], enqueued: Enqueued
) -> None:
    subscribe(admin, receiver)
    job = make_job()
    event = {"key": "r1", "type": "job_restart"}
    assert post_events(admin, job, event)["stored"] == 1
    assert post_events(admin, job, event)["duplicates"] == 1
    assert len(enqueued) == 1


def test_event_type_filter_and_label_selector(
    admin: TestClient, receiver: Receiver, make_job: Callable[..., dict[str, Any]], enqueued: Enqueued
) -> None:
    only_job_restarts = subscribe(admin, receiver, "/a", event_types=["job_restart"])
    only_vision = subscribe(admin, receiver, "/b", label_selector={"team": "vision", "tier": "prod"})
    research = make_job(labels={"team": "research"})
    vision = make_job(name="vision", labels={"team": "vision", "tier": "prod", "extra": "ok"})
    post_events(admin, research, {"key": "1", "type": "injob_restart"}, {"key": "2", "type": "job_restart"})
    post_events(admin, vision, {"key": "1", "type": "injob_restart"})
    a = deliveries(admin, only_job_restarts)
    b = deliveries(admin, only_vision)
    assert [(d["event_type"], d["job_id"]) for d in a] == [("job_restart", research["id"])]
    assert [(d["event_type"], d["job_id"]) for d in b] == [("injob_restart", vision["id"])]


def test_500_then_200_sends_the_same_webhook_id_twice(
    admin: TestClient,
    receiver: Receiver,
    make_job: Callable[..., dict[str, Any]],
    enqueued: Enqueued,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outbox, "FIRST_RETRY_S", 0.01)  # due again at once
    receiver.script["/hook"] = [500]
    hook = subscribe(admin, receiver)
    post_events(admin, make_job(), {"key": "r1", "type": "job_restart", "details": {"cause": "node lost"}})
    delivery_id = enqueued[0][0]

    assert deliver_webhook(delivery_id) == "retrying"
    [logged] = deliveries(admin, hook)
    assert (logged["status"], logged["attempts"], logged["last_status_code"]) == ("pending", 1, 500)
    assert "HTTP 500" in logged["last_error"] and "receiver says no" in logged["last_error"]
    assert logged["next_try_at"] is not None
    retry_id, countdown = enqueued[-1]  # the retry was scheduled as a delayed task
    assert retry_id == delivery_id and countdown is not None and 0 < countdown <= 0.01

    assert deliver_webhook(retry_id) == "delivered"
    first, second = receiver.at("/hook")
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == delivery_id
    assert first.body == second.body  # the stored message, not rebuilt
    for got in (first, second):
        Webhook(hook["secret"]).verify(got.body, got.headers)
    [logged] = deliveries(admin, hook)
    assert (logged["status"], logged["attempts"], logged["last_status_code"]) == ("delivered", 2, 200)


def test_failures_back_off_and_end_failed_in_the_log(
    admin: TestClient,
    receiver: Receiver,
    make_job: Callable[..., dict[str, Any]],
    enqueued: Enqueued,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outbox, "FIRST_RETRY_S", 0.01)
    monkeypatch.setattr(outbox, "MAX_ATTEMPTS", 3)
    receiver.script["/hook"] = [503, 503, 503, 503]
    hook = subscribe(admin, receiver)
    post_events(admin, make_job(), {"key": "r1", "type": "injob_restart"})
    delivery_id = enqueued[0][0]
    outcomes = [deliver_webhook(delivery_id) for _ in range(4)]
    assert outcomes == ["retrying", "retrying", "failed", "skipped"]
    [logged] = deliveries(admin, hook)
    assert (logged["status"], logged["attempts"], logged["last_status_code"]) == ("failed", 3, 503)
    assert "gave up after 3 tries" in logged["last_error"]
    assert logged["next_try_at"] is None
    assert len(receiver.at("/hook")) == 3


def test_backoff_is_exponential_jittered_capped_and_spans_hours() -> None:
    rng = random.Random(7)
    delays = [outbox.retry_delay(n, rng) for n in range(1, outbox.MAX_ATTEMPTS)]
    for n, delay in enumerate(delays, start=1):
        base = min(outbox.MAX_RETRY_S, outbox.FIRST_RETRY_S * 2 ** (n - 1))
        assert base / 2 <= delay <= base
    assert len({round(d, 6) for d in delays}) == len(delays)  # jittered: no two alike
    assert 1 <= delays[0] <= 2
    assert max(delays) <= outbox.MAX_RETRY_S
    assert 3 * 3600 < sum(delays) < 12 * 3600  # retried over hours, not forever


def test_redirects_are_not_followed(
    admin: TestClient, receiver: Receiver, make_job: Callable[..., dict[str, Any]], enqueued: Enqueued
) -> None:
    receiver.script["/hook"] = [302]
    hook = subscribe(admin, receiver)
    post_events(admin, make_job(), {"key": "r1", "type": "injob_restart"})
    assert deliver_webhook(enqueued[0][0]) == "retrying"
    assert [r.path for r in receiver.requests] == ["/hook"]  # /elsewhere never asked
    [logged] = deliveries(admin, hook)
    assert logged["last_status_code"] == 302 and "redirect" in logged["last_error"]


def test_a_slow_receiver_times_out_within_the_bound(
    admin: TestClient,
    receiver: Receiver,
    make_job: Callable[..., dict[str, Any]],
    enqueued: Enqueued,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from api.core.config import get_settings

    monkeypatch.setenv("FTPLANE_WEBHOOK_TIMEOUT_S", "0.3")
    get_settings.cache_clear()
    receiver.delay_s["/hook"] = 2.0
    hook = subscribe(admin, receiver)
    post_events(admin, make_job(), {"key": "r1", "type": "injob_restart"})
    started = time.monotonic()
    assert deliver_webhook(enqueued[0][0]) == "retrying"
    assert time.monotonic() - started < 1.5
    [logged] = deliveries(admin, hook)
    assert logged["last_status_code"] is None and "timed out after 0.3 s" in logged["last_error"]


def test_the_address_is_checked_again_at_delivery_time(
    admin: TestClient,
    receiver: Receiver,
    make_job: Callable[..., dict[str, Any]],
    enqueued: Enqueued,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from api.core.config import get_settings

    hook = subscribe(admin, receiver)  # allowed when made
    post_events(admin, make_job(), {"key": "r1", "type": "injob_restart"})
    monkeypatch.setenv("FTPLANE_WEBHOOK_ALLOW_PRIVATE", "false")  # ...no longer when sent
    get_settings.cache_clear()
    assert deliver_webhook(enqueued[0][0]) == "failed"
    assert receiver.requests == []
    [logged] = deliveries(admin, hook)
    assert logged["status"] == "failed" and "target refused" in logged["last_error"]


def test_slack_format_posts_a_slack_message(
    admin: TestClient, receiver: Receiver, make_job: Callable[..., dict[str, Any]], enqueued: Enqueued
) -> None:
    hook = subscribe(admin, receiver, "/slack", format="slack")
    job = make_job()
    details = {"cause": "node <ip-10-0-0-1> lost", "cause_class": "node", "tail": "step 3\nValueError: <bad lr>"}
    post_events(admin, job, {"key": "r1", "type": "job_restart", "details": details})
    deliver_webhook(enqueued[0][0])
    [got] = receiver.at("/slack")
    message = Webhook(hook["secret"]).verify(got.body, got.headers)
    assert set(message) == {"text", "blocks"}
    assert "tiny" in message["text"] and "job restart" in message["text"]
    assert "&lt;ip-10-0-0-1&gt;" in message["text"]  # Slack mrkdwn escaping
    assert message["blocks"][0]["type"] == "section"
    assert job["id"] in json.dumps(message["blocks"]) and "cause: node" in json.dumps(message["blocks"])
    assert message["blocks"][1]["text"]["text"] == "```step 3\nValueError: &lt;bad lr&gt;```"  # the failed rank's tail


def test_redeliver_sends_the_same_webhook_id_again(
    admin: TestClient, receiver: Receiver, make_job: Callable[..., dict[str, Any]], enqueued: Enqueued
) -> None:
    hook = subscribe(admin, receiver)
    post_events(admin, make_job(), {"key": "r1", "type": "injob_restart"})
    delivery_id = enqueued[0][0]
    deliver_webhook(delivery_id)
    response = admin.post(f"/v1/webhooks/{hook['id']}/deliveries/{delivery_id}/redeliver")
    assert response.status_code == 202, response.text
    assert (response.json()["status"], response.json()["attempts"]) == ("pending", 0)
    assert enqueued[-1] == (delivery_id, None)
    assert deliver_webhook(delivery_id) == "delivered"
    ids = [r.headers["webhook-id"] for r in receiver.at("/hook")]
    assert ids == [delivery_id, delivery_id]


def test_sweep_finds_deliveries_whose_task_was_lost(
    admin: TestClient, receiver: Receiver, make_job: Callable[..., dict[str, Any]], enqueued: Enqueued
) -> None:
    subscribe(admin, receiver)
    post_events(
        admin,
        make_job(),
        {"key": "lost", "type": "injob_restart"},
        {"key": "held", "type": "job_restart"},
        {"key": "done", "type": "hang_detected"},
    )
    lost, held, done = (d for d, _ in enqueued)
    deliver_webhook(done)
    now = utcnow()
    with session_scope() as session:
        claim = outbox.claim(session, held, now, lease=60)  # a worker is sending this one right now
        assert claim is not None
        assert outbox.claim(session, held, now, lease=60) is None  # ...and nobody else may
        session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == lost)
            .values(next_try_at=now - timedelta(seconds=outbox.SWEEP_GRACE_S + 1))
        )
    enqueued.clear()
    assert sweep_webhook_deliveries() == 1
    assert enqueued == [(lost, None)]
    assert deliver_webhook(lost) == "delivered"
    assert sweep_webhook_deliveries() == 0


def test_events_rolled_back_announce_nothing(
    admin: TestClient, receiver: Receiver, make_job: Callable[..., dict[str, Any]], enqueued: Enqueued
) -> None:
    from api import models
    from api.schemas.events import EventBatch, EventIn, EventType
    from api.services.ingest import reporting

    subscribe(admin, receiver)
    job_id = make_job()["id"]
    with pytest.raises(RuntimeError), session_scope() as session:
        job = models.jobs.get(session, job_id)
        assert job is not None
        reporting.ingest_events(session, job, EventBatch(events=[EventIn(key="x", type=EventType.job_restart)]))
        raise RuntimeError("the request failed after storing")
    assert enqueued == []
    with session_scope() as session:
        assert session.scalars(select(WebhookDelivery)).all() == []
