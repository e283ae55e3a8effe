"""`/v1/webhooks`: admin-only subscriptions, secret shown once, URL policy, delivery log, redelivery."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.webhooks.messages import DEFAULT_EVENT_TYPES
from tests.support.embedded_app import post_events
from tests.support.receivers import Receiver


def test_create_shows_the_secret_once_and_never_again(admin: TestClient, receiver: Receiver) -> None:
    created = admin.post("/v1/webhooks", json={"url": receiver.url + "/hook"})
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["secret"].startswith("whsec_") and len(body["secret"]) > 40
    assert body["event_types"] == [t.value for t in DEFAULT_EVENT_TYPES]
    assert body["format"] == "standard" and body["label_selector"] == {}
    listed = admin.get("/v1/webhooks")
    one = admin.get(f"/v1/webhooks/{body['id']}")
    for response in (listed, one):
        assert response.status_code == 200
        assert "secret" not in response.text and body["secret"] not in response.text
    assert [w["id"] for w in listed.json()] == [body["id"]]


def test_default_event_types_are_the_restart_rungs_hangs_exclusions_stragglers_anomalies_nodes_and_job_ends() -> None:
    assert {t.value for t in DEFAULT_EVENT_TYPES} == {
        "inprocess_restart",
        "injob_restart",
        "job_restart",
        "hang_detected",
        "node_excluded",
        "straggler_detected",
        "straggler_cleared",
        "restart_storm",
        "progress_stalled",
        "recovery_stuck",
        "node_quarantined",
        "node_released",
        "succeeded",
        "failed",
        "cancelled",
    }


def test_webhooks_need_an_admin_token(client: TestClient, make_job: Callable[..., dict[str, Any]]) -> None:
    job = make_job()
    client.headers.pop("Authorization", None)
    assert client.get("/v1/webhooks").status_code == 401
    trainer = {"Authorization": f"Bearer {job['token']}"}
    assert client.get("/v1/webhooks", headers=trainer).status_code == 403
    assert client.post("/v1/webhooks", json={"url": "http://127.0.0.1/x"}, headers=trainer).status_code == 403


def test_private_targets_are_refused_naming_url(admin: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    from api.core.config import get_settings

    monkeypatch.setenv("FTPLANE_WEBHOOK_ALLOW_PRIVATE", "false")
    get_settings.cache_clear()
    for url in (
        "http://127.0.0.1:8080/hook",
        "http://localhost/hook",
        "http://169.254.169.254/latest",
        "http://[::1]/",
    ):
        response = admin.post("/v1/webhooks", json={"url": url})
        assert response.status_code == 422, (url, response.text)
        error = response.json()["error"]
        assert error["fields"][0]["field"] == "url"
        assert "FTPLANE_WEBHOOK_ALLOW_PRIVATE" in error["message"]
    public = admin.post("/v1/webhooks", json={"url": "https://93.184.216.34/hook"})
    assert public.status_code == 201, public.text


def test_bad_bodies_are_refused_naming_the_field(admin: TestClient) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"url": "ftp://example.com/x"}, "url"),
        ({"url": "http://127.0.0.1/x", "event_types": ["restarted"]}, "event_types[0]"),
        ({"url": "http://127.0.0.1/x", "event_types": []}, "event_types"),
        ({"url": "http://127.0.0.1/x", "format": "teams"}, "format"),
        ({"url": "http://127.0.0.1/x", "label_selector": {"team": "has space"}}, "label_selector.team"),
        ({"url": "http://127.0.0.1/x", "secret": "mine"}, "secret"),
    ]
    for body, field in cases:
        response = admin.post("/v1/webhooks", json=body)
        assert response.status_code == 422, (body, response.text)
        fields = [f["field"] for f in response.json()["error"].get("fields", [])]
        assert field in fields, (body, fields)


def test_delete_removes_the_subscription_and_its_log(
    admin: TestClient, receiver: Receiver, make_job: Callable[..., dict[str, Any]], enqueued: list[Any]
) -> None:
    hook = admin.post("/v1/webhooks", json={"url": receiver.url + "/hook"}).json()
    post_events(admin, make_job(), {"key": "r1", "type": "injob_restart"})
    assert len(admin.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["items"]) == 1
    assert admin.delete(f"/v1/webhooks/{hook['id']}").status_code == 204
    assert admin.get(f"/v1/webhooks/{hook['id']}/deliveries").status_code == 404
    assert admin.delete(f"/v1/webhooks/{hook['id']}").status_code == 404
    assert admin.get("/v1/webhooks").json() == []


def test_delivery_log_pages_newest_first(
    admin: TestClient, receiver: Receiver, make_job: Callable[..., dict[str, Any]]
) -> None:
    hook = admin.post("/v1/webhooks", json={"url": receiver.url + "/hook"}).json()
    job = make_job()
    post_events(admin, job, *({"key": f"r{i}", "type": "inprocess_restart"} for i in range(5)))
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = admin.get(f"/v1/webhooks/{hook['id']}/deliveries", params=params).json()
        seen += [d["id"] for d in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert len(seen) == len(set(seen)) == 5
    bad = admin.get(f"/v1/webhooks/{hook['id']}/deliveries", params={"cursor": "nonsense"})
    assert bad.status_code == 422 and bad.json()["error"]["fields"][0]["field"] == "cursor"
    pending = admin.get(f"/v1/webhooks/{hook['id']}/deliveries", params={"status": "pending"}).json()
    assert len(pending["items"]) == 5


def test_redeliver_unknown_delivery_is_404(admin: TestClient, receiver: Receiver) -> None:
    hook = admin.post("/v1/webhooks", json={"url": receiver.url + "/hook"}).json()
    response = admin.post(f"/v1/webhooks/{hook['id']}/deliveries/msg_nope/redeliver")
    assert response.status_code == 404
    assert response.json()["error"]["fields"][0]["field"] == "delivery_id"
    assert admin.post("/v1/webhooks/nope/deliveries/msg_nope/redeliver").status_code == 404


def test_neither_secret_nor_target_url_reaches_the_logs(
    admin: TestClient,
    receiver: Receiver,
    make_job: Callable[..., dict[str, Any]],
    enqueued: list[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from workers.tasks.webhooks import deliver_webhook

    caplog.set_level(logging.DEBUG)
    path = "/services/T000/B000/url-is-a-secret-too"  # like a Slack incoming-webhook URL
    receiver.script[path] = [500]
    hook = admin.post("/v1/webhooks", json={"url": receiver.url + path}).json()
    post_events(admin, make_job(), {"key": "r1", "type": "job_restart"})
    deliver_webhook(enqueued[0][0])
    assert len(receiver.at(path)) == 1
    assert "webhook" in caplog.text  # the try was logged...
    assert hook["secret"] not in caplog.text  # ...without the secret
    assert hook["secret"].removeprefix("whsec_") not in caplog.text
    assert "url-is-a-secret-too" not in caplog.text  # ...and without the target URL


def test_unknown_webhook_is_404_naming_it(admin: TestClient) -> None:
    for method, path in (("get", "/v1/webhooks/nope"), ("get", "/v1/webhooks/nope/deliveries")):
        response = admin.request(method.upper(), path)
        assert response.status_code == 404
        assert response.json()["error"]["fields"][0]["field"] == "webhook_id"


def test_a_subscription_hears_of_its_own_projects_jobs_only(
    admin: TestClient, receiver: Receiver, make_job: Callable[..., dict[str, Any]]
) -> None:
    for project in ("team-a", "team-b"):
        assert admin.post("/v1/projects", json={"name": project}).status_code == 201
    hooks = {
        project: admin.post(
            "/v1/webhooks",
            json={"url": f"{receiver.url}/{project}", "event_types": ["checkpoint_saved"], "project": project},
        ).json()
        for project in ("team-a", "team-b")
    }
    job = make_job(project="team-a")
    post_events(admin, job, {"key": "c1", "type": "checkpoint_saved", "step": 10})
    deliveries = {p: admin.get(f"/v1/webhooks/{h['id']}/deliveries").json()["items"] for p, h in hooks.items()}
    assert [d["job_id"] for d in deliveries["team-a"]] == [job["id"]]
    assert deliveries["team-b"] == []
