"""ETTR objectives: an objective below its target sends one signed `objective_breached` (not one per pass) naming
the jobs and causes that spent its budget; a recovery then a new breach sends again; the burn rate breaches too;
bad objectives are 422 naming the field; GET shows the budget; the delivery log holds the message."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from standardwebhooks import Webhook

from api.core.db import session_scope
from tests.api.test_fleet_goodput import NOW, history, launched_job, post, summarize
from tests.api.webhooks.test_delivery import deliveries, subscribe
from tests.conftest import row_counts
from tests.support.receivers import Receiver
from workers.supervision import evaluate_objectives
from workers.tasks.webhooks import deliver_webhook

Enqueued = list[tuple[str, float | None]]


def evaluate(at: Any = None) -> int:
    with session_scope() as session:
        return evaluate_objectives.run_once(session, at or NOW)


@pytest.fixture
def crashed(admin: TestClient, make_job: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """Team a's job: a crash, an in-job restart and steps redone (ETTR about 0.76); team b's: none."""
    job = launched_job(admin, make_job, name="crashy", labels={"team": "a"})
    post(admin, job, history(crash=True))
    other = launched_job(admin, make_job, name="calm", labels={"team": "b"})
    post(admin, other, history(crash=False))
    summarize()
    return job


def test_below_target_sends_one_signed_breach_then_again_after_a_recovery(
    admin: TestClient,
    receiver: Receiver,
    enqueued: Enqueued,
    crashed: dict[str, Any],
    make_job: Callable[..., dict[str, Any]],
) -> None:
    hook = subscribe(admin, receiver, event_types=["objective_breached"], label_selector={"team": "a"})
    other = subscribe(admin, receiver, "/b", event_types=["objective_breached"], label_selector={"team": "b"})
    made = admin.post(
        "/v1/objectives", json={"name": "team-a", "selector": {"team": "a"}, "target": 0.9, "window": "1d"}
    )
    assert made.status_code == 201, made.text
    objective = made.json()

    assert evaluate() == 1
    assert len(enqueued) == 1  # team b's subscription does not hear of team a's objective
    assert deliver_webhook(enqueued[0][0]) == "delivered"
    [got] = receiver.at("/hook")
    payload = Webhook(hook["secret"]).verify(got.body, got.headers)
    assert payload["type"] == "objective_breached"
    data = payload["data"]
    assert data["objective"]["id"] == objective["id"] and data["breach"]["reason"] == "below_target"
    assert data["status"]["ettr"] < 0.9 and data["status"]["budget_left"] < 0
    assert [j["id"] for j in data["jobs"]] == [crashed["id"]]
    assert list(data["causes"])[0] == "recompute" and "restart" in data["causes"]
    assert deliveries(admin, other) == []
    [logged] = deliveries(admin, hook)
    assert (logged["event_type"], logged["event_id"], logged["job_id"]) == ("objective_breached", None, None)

    assert evaluate(NOW + timedelta(minutes=2)) == 1  # still breached: nothing more
    assert len(enqueued) == 1
    # Twenty clean hours of team a lift the day's ETTR above 0.9: recovered, nothing sent.
    add(admin, make_job, "steady", [("submitted", -22 * 3600), ("running", -22 * 3600 + 60), ("succeeded", -2 * 3600)])
    assert evaluate(NOW + timedelta(minutes=4)) == 1
    assert admin.get(f"/v1/objectives/{objective['id']}").json()["breached_since"] is None
    assert len(enqueued) == 1
    # A job stuck restarting for hours: breached again, announced again.
    stuck = [("submitted", -4 * 3600), ("running", -4 * 3600 + 60), ("rank_failed", -3.8 * 3600), ("failed", -1800)]
    add(admin, make_job, "stuck", stuck)
    assert evaluate(NOW + timedelta(minutes=6)) == 1
    assert len(enqueued) == 2
    assert deliver_webhook(enqueued[1][0]) == "delivered"
    second = Webhook(hook["secret"]).verify(receiver.at("/hook")[-1].body, receiver.at("/hook")[-1].headers)
    assert second["data"]["breach"]["id"] != data["breach"]["id"]
    assert second["data"]["jobs"][0]["name"] == "stuck" and list(second["data"]["causes"])[0] == "restart"


def add(admin: TestClient, make_job: Callable[..., dict[str, Any]], name: str, steps: list[tuple[str, float]]) -> None:
    """A team-a job with these events, at seconds from NOW."""
    job = launched_job(admin, make_job, name=name, labels={"team": "a"})
    run = {"restart_count": 0, "iteration": 0, "start_step": 0}
    events = [
        {
            "key": f"{kind}{i}",
            "type": kind,
            "ts": (NOW + timedelta(seconds=t)).isoformat(),
            **({"details": run} if kind == "running" else {}),
        }
        for i, (kind, t) in enumerate(steps)
    ]
    post(admin, job, events)
    summarize()


def test_get_shows_the_budget_and_who_spent_it(admin: TestClient, crashed: dict[str, Any]) -> None:
    made = admin.post("/v1/objectives", json={"selector": {"team": "a"}, "target": 0.5, "window": "1d"}).json()
    body = admin.get(f"/v1/objectives/{made['id']}").json()
    status = body["status"]
    assert status["breached"] is False and status["reason"] is None and 0.5 < status["ettr"] < 0.9
    assert status["budget_gpu_hours"] == pytest.approx(0.5 * status["wall_gpu_hours"])
    assert status["budget_left"] == pytest.approx(1 - status["lost_gpu_hours"] / status["budget_gpu_hours"])
    assert status["top_jobs"][0]["job_id"] == crashed["id"] and "restart" in status["top_causes"]
    listed = admin.get("/v1/objectives").json()
    assert [o["id"] for o in listed] == [made["id"]] and listed[0]["status"]["ettr"] == pytest.approx(status["ettr"])
    assert admin.delete(f"/v1/objectives/{made['id']}").status_code == 204
    assert admin.get(f"/v1/objectives/{made['id']}").status_code == 404


def test_a_fast_burn_breaches_before_the_window_falls_below_target(
    admin: TestClient, make_job: Callable[..., dict[str, Any]], enqueued: Enqueued, crashed: dict[str, Any]
) -> None:
    """Ten clean days of team a three weeks ago keep the 4-week window's ETTR near 1, above the target 0.9; over
    the last day (1/28 of the window) the crashed job's ETTR of about 0.76 burns the budget at (1 - 0.76) /
    (1 - 0.9), about 2.4 times the pace that spends it over the window: above 2 breaches, 3 does not."""
    old = launched_job(admin, make_job, name="steady", labels={"team": "a"})
    begin = NOW - timedelta(days=20)
    run = {"restart_count": 0, "iteration": 0, "start_step": 0}
    post(
        admin,
        old,
        [
            {"key": "s", "type": "submitted", "ts": begin.isoformat()},
            {"key": "r", "type": "running", "ts": (begin + timedelta(seconds=60)).isoformat(), "details": run},
            {"key": "e", "type": "succeeded", "ts": (begin + timedelta(days=10)).isoformat()},
        ],
    )
    summarize()
    calm = admin.post("/v1/objectives", json={"selector": {"team": "a"}, "target": 0.9, "window": "4w", "burn_rate": 3})
    fast = admin.post("/v1/objectives", json={"selector": {"team": "a"}, "target": 0.9, "window": "4w", "burn_rate": 2})
    assert evaluate() == 2
    calm_now = admin.get(f"/v1/objectives/{calm.json()['id']}").json()
    fast_now = admin.get(f"/v1/objectives/{fast.json()['id']}").json()
    assert calm_now["status"]["ettr"] > 0.99 and 2 < calm_now["status"]["burn_rate"] < 3
    assert calm_now["breached_since"] is None and calm_now["status"]["breached"] is False
    assert fast_now["breached_since"] is not None and fast_now["status"]["reason"] == "burn_rate"
    assert len(enqueued) == 0  # nobody subscribed: the breach is recorded all the same


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"target": 1.0}, "target"),
        ({"target": 0}, "target"),
        ({"target": "0.9"}, "target"),
        ({"target": 0.9, "window": "0h"}, "window"),
        ({"target": 0.9, "window": "7"}, "window"),
        ({"target": 0.9, "selector": {"bad key!": "a"}}, "selector"),
        ({"target": 0.9, "selector": {"team": "not ok"}}, "selector"),
        ({"target": 0.9, "burn_rate": 0.5}, "burn_rate"),
        ({"target": 0.9, "project": "nope"}, "project"),
        ({"target": 0.9, "extra": 1}, "extra"),
    ],
)
def test_bad_objectives_are_422_naming_the_field(admin: TestClient, body: dict[str, Any], field: str) -> None:
    before = row_counts()
    response = admin.post("/v1/objectives", json=body)
    assert response.status_code == 422, response.text
    named = [f["field"] for f in response.json()["error"]["fields"]]
    assert named and named[0].split(".")[0] == field, named
    assert row_counts() == before


def test_slack_message_of_a_breach(admin: TestClient, receiver: Receiver, enqueued: Enqueued, crashed: Any) -> None:
    hook = subscribe(admin, receiver, "/slack", event_types=["objective_breached"], format="slack")
    admin.post("/v1/objectives", json={"name": "all", "target": 0.95, "window": "1d"})
    evaluate()
    assert deliver_webhook(enqueued[0][0]) == "delivered"
    message = Webhook(hook["secret"]).verify(receiver.at("/slack")[0].body, receiver.at("/slack")[0].headers)
    assert "ETTR objective breached" in message["text"] and "crashy" in str(message["blocks"])
