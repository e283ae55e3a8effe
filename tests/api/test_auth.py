"""Bearer tokens: admins do everything, a trainer token reports for its own job only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
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


def test_the_last_admin_token_cannot_be_revoked(admin: TestClient, admin_token: str) -> None:
    """Revoking it would lock every admin out of the API: 409 naming it, until another admin token exists."""
    mine = next(t for t in admin.get("/v1/tokens").json() if t["role"] == "cluster-admin")
    refused = admin.delete(f"/v1/tokens/{mine['id']}")
    assert refused.status_code == 409, refused.text
    message = refused.json()["error"]["message"]
    assert mine["id"] in message and "last active cluster-admin" in message
    other = admin.post("/v1/tokens", json={"name": "ops"}).json()
    assert admin.delete(f"/v1/tokens/{mine['id']}").status_code == 204  # another admin remains
    ops = TestClient(admin.app, headers={"Authorization": f"Bearer {other['token']}"})
    last = ops.delete(f"/v1/tokens/{other['id']}")
    assert last.status_code == 409 and "'ops'" in last.json()["error"]["message"]
    assert ops.get("/v1/jobs").status_code == 200


@pytest.mark.postgres
def test_two_admins_revoking_each_other_at_once_leave_one(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The second revocation waits for the first (the admin tokens are locked) and then sees it is the last."""
    import threading
    import time

    from tests.conftest import configure_env

    configure_env(monkeypatch, tmp_path / "state", postgres_url)
    from api.core.db import session_scope
    from api.main import create_app
    from api.models import tokens

    app = create_app()
    with session_scope() as session:
        (a, token_a), (b, token_b) = tokens.create_admin(session, "a"), tokens.create_admin(session, "b")
        ids = {"a": a.id, "b": b.id}
    revoking = threading.Event()
    real_revoke = tokens.revoke

    def slow_revoke(session: Any, token_id: str) -> bool:
        revoking.set()
        time.sleep(0.5)  # the other request arrives meanwhile
        return real_revoke(session, token_id)

    monkeypatch.setattr(tokens, "revoke", slow_revoke)
    answers: dict[str, int] = {}

    def revoke(who: str, token: str, victim: str) -> None:
        client = TestClient(app, headers={"Authorization": f"Bearer {token}"}, raise_server_exceptions=False)
        answers[who] = client.delete(f"/v1/tokens/{ids[victim]}").status_code

    first = threading.Thread(target=revoke, args=("a", token_a, "b"))
    first.start()
    assert revoking.wait(10)
    second = threading.Thread(target=revoke, args=("b", token_b, "a"))
    second.start()
    first.join(30)
    second.join(30)
    assert answers == {"a": 204, "b": 409}, answers
    with session_scope() as session:
        active = [t for t in tokens.list_tokens(session) if t.role == "cluster-admin" and t.revoked_at is None]
    assert [t.name for t in active] == ["a"]
