"""Bearer tokens: admins do everything, a trainer token reports for its own job only."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.conftest import tiny_spec


def test_missing_or_bad_token_is_401(client: TestClient) -> None:
    assert client.get("/v1/jobs").status_code == 401
    bad = client.get("/v1/jobs", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and bad.headers["www-authenticate"] == "Bearer"
    assert client.post("/v1/jobs", json=tiny_spec()).status_code == 401


def test_trainer_token_reports_for_its_job_only(admin: TestClient, make_job: Any) -> None:
    mine, other = make_job(name="mine"), make_job(name="other")
    headers = {"Authorization": f"Bearer {mine['token']}"}
    batch = {"events": [{"key": "k", "type": "checkpoint_saved"}]}
    beats = {"heartbeats": [{"rank": 0, "step": 1}]}
    client = TestClient(admin.app)
    assert client.post(f"/v1/jobs/{mine['id']}/events", json=batch, headers=headers).status_code == 200
    assert client.post(f"/v1/jobs/{mine['id']}/heartbeats", json=beats, headers=headers).status_code == 200
    assert client.post(f"/v1/jobs/{other['id']}/events", json=batch, headers=headers).status_code == 403
    assert client.post(f"/v1/jobs/{other['id']}/heartbeats", json=beats, headers=headers).status_code == 403
    for method, path in [
        ("GET", "/v1/jobs"),
        ("GET", f"/v1/jobs/{mine['id']}"),
        ("GET", f"/v1/jobs/{mine['id']}/events"),
        ("POST", f"/v1/jobs/{mine['id']}/cancel"),
        ("POST", "/v1/tokens"),
    ]:
        assert client.request(method, path, headers=headers, json={"name": "x"}).status_code == 403, path


def test_admin_tokens_are_stored_hashed_and_revocable(admin: TestClient, admin_token: str) -> None:
    from sqlalchemy import select

    from api.core.db import session_scope
    from api.database.tables import ApiToken

    created = admin.post("/v1/tokens", json={"name": "ci"}).json()
    with session_scope() as session:
        digests = list(session.scalars(select(ApiToken.digest)))
    assert created["token"] not in digests and admin_token not in digests
    listing = admin.get("/v1/tokens").text
    assert created["token"] not in listing and admin_token not in listing
    other = TestClient(admin.app, headers={"Authorization": f"Bearer {created['token']}"})
    assert other.get("/v1/jobs").status_code == 200
    assert admin.delete(f"/v1/tokens/{created['id']}").status_code == 204
    assert other.get("/v1/jobs").status_code == 401


def test_auth_disabled_allows_anonymous_admin(monkeypatch: Any, app: Any) -> None:
    from api.core.config import get_settings

    monkeypatch.setenv("FTPLANE_AUTH", "disabled")
    get_settings.cache_clear()
    assert TestClient(app).get("/v1/jobs").status_code == 200
