"""Authorization matrix: every endpoint of the app × {no token, admin, the job's own trainer token,
another job's trainer token}.

Endpoints are read from the app itself, so a new one fails `test_every_endpoint_is_classified` until
it is given a policy here. A trainer token may only POST events and heartbeats of its own job;
everything it is refused leaves the database exactly as it was.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from starlette.routing import Mount

from tests.conftest import configure_env, row_counts, tiny_spec
from tests.reliability.conftest import bare_app

PUBLIC = "public"  # the same answer whoever asks (probes, metrics, docs, the login form, static files)
ADMIN = "admin"  # admin tokens only
REPORTER = "reporter"  # admins, and the trainer token of the job in the path
DASHBOARD = "dashboard"  # an admin's session; anyone else is sent to the login form

POLICY: dict[str, str] = {
    "GET /openapi.json": PUBLIC,
    "GET /docs": PUBLIC,
    "GET /docs/oauth2-redirect": PUBLIC,
    "GET /redoc": PUBLIC,
    "GET /healthz": PUBLIC,
    "GET /readyz": PUBLIC,
    "GET /metrics": PUBLIC,
    "GET /login": PUBLIC,
    "POST /login": PUBLIC,
    "POST /logout": PUBLIC,
    "MOUNT /static": PUBLIC,
    "POST /v1/jobs": ADMIN,
    "GET /v1/jobs": ADMIN,
    "GET /v1/jobs/{job_id}": ADMIN,
    "POST /v1/jobs/{job_id}/cancel": ADMIN,
    "POST /v1/jobs/{job_id}/faults": ADMIN,
    "POST /v1/jobs/{job_id}/events": REPORTER,
    "GET /v1/jobs/{job_id}/events": ADMIN,
    "POST /v1/jobs/{job_id}/heartbeats": REPORTER,
    "POST /v1/jobs/{job_id}/reports": REPORTER,
    "GET /v1/jobs/{job_id}/nodes": ADMIN,
    "GET /v1/jobs/{job_id}/ranks": ADMIN,
    "GET /v1/jobs/{job_id}/goodput": ADMIN,
    "POST /v1/tokens": ADMIN,
    "GET /v1/tokens": ADMIN,
    "DELETE /v1/tokens/{token_id}": ADMIN,
    "POST /v1/webhooks": ADMIN,
    "GET /v1/webhooks": ADMIN,
    "GET /v1/webhooks/{webhook_id}": ADMIN,
    "DELETE /v1/webhooks/{webhook_id}": ADMIN,
    "GET /v1/webhooks/{webhook_id}/deliveries": ADMIN,
    "POST /v1/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver": ADMIN,
    "GET /": DASHBOARD,
    "GET /ui/jobs": DASHBOARD,
    "GET /jobs/{job_id}": DASHBOARD,
    "GET /ui/jobs/{job_id}/live": DASHBOARD,
}

# What each endpoint is sent (a valid request, so that an allowed caller succeeds).
BODIES: dict[str, Callable[[], dict[str, Any]]] = {
    "POST /v1/jobs": lambda: {"json": tiny_spec(name="authz")},
    "POST /v1/jobs/{job_id}/faults": lambda: {"json": {"kind": "exception", "rank": 0, "at_step": 5}},
    "POST /v1/jobs/{job_id}/events": lambda: {
        "json": {"events": [{"key": uuid.uuid4().hex, "type": "checkpoint_saved", "step": 7}]}
    },
    "POST /v1/jobs/{job_id}/heartbeats": lambda: {"json": {"heartbeats": [{"rank": 0, "step": 7}]}},
    "POST /v1/jobs/{job_id}/reports": lambda: {
        "json": {"attempt": 0, "node": "n0", "heartbeats": [{"rank": 0, "step": 7}]}
    },
    "POST /v1/tokens": lambda: {"json": {"name": "authz"}},
    "POST /v1/webhooks": lambda: {"json": {"url": "http://127.0.0.1:9/hook"}},
    "POST /login": lambda: {"data": {"token": "not-a-token", "next": "/"}},
}
CALLERS = ("nobody", "admin", "own_trainer", "other_trainer")


def endpoints() -> list[str]:
    """Every route of the app, as 'METHOD /path' ('MOUNT /path' for mounted apps)."""
    app = bare_app()
    found = set()
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        if isinstance(route, Mount):
            found.add(f"MOUNT {context.path}")
            continue
        for method in getattr(route, "methods", None) or ():
            if method != "HEAD":
                found.add(f"{method} {context.path}")
    return sorted(found)


ENDPOINTS = endpoints()


def test_every_endpoint_is_classified() -> None:
    unclassified = sorted(set(ENDPOINTS) - set(POLICY))
    assert not unclassified, f"give these endpoints an authorization policy in {__file__}: {unclassified}"
    gone = sorted(set(POLICY) - set(ENDPOINTS))
    assert not gone, f"these endpoints no longer exist; remove them from POLICY: {gone}"
    needs_body = [e for e in ENDPOINTS if e.startswith("POST ") and "{" not in e.split("/")[-1]]
    missing = [e for e in needs_body if e not in BODIES and not e.endswith(("/cancel", "/redeliver", "/logout"))]
    assert not missing, f"give these endpoints a valid request body in BODIES: {missing}"


@dataclass
class World:
    app: Any
    tokens: dict[str, str | None]
    ids: dict[str, str]


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[World]:
    """Two jobs (each with its trainer token), an admin token to revoke, a webhook with a delivery."""
    configure_env(
        monkeypatch, tmp_path / "state", f"sqlite:///{tmp_path / 'ftplane.db'}", FTPLANE_WEBHOOK_ALLOW_PRIVATE="true"
    )
    from api.core import queue
    from api.core.db import reset_caches, session_scope
    from api.main import create_app
    from api.models import tokens

    monkeypatch.setattr(queue, "send", lambda *args, **kwargs: True)
    app = create_app()
    with session_scope() as session:
        _, admin_token = tokens.create_admin(session, "authz")
    admin = TestClient(app, headers={"Authorization": f"Bearer {admin_token}"})
    mine = admin.post("/v1/jobs", json=tiny_spec(name="mine")).json()
    other = admin.post("/v1/jobs", json=tiny_spec(name="other")).json()
    victim = admin.post("/v1/tokens", json={"name": "victim"}).json()
    hook = admin.post(
        "/v1/webhooks", json={"url": "http://127.0.0.1:9/hook", "event_types": ["checkpoint_saved"]}
    ).json()
    trainer = {"Authorization": f"Bearer {mine['token']}"}
    admin.post(f"/v1/jobs/{mine['id']}/events", headers=trainer, **BODIES["POST /v1/jobs/{job_id}/events"]())
    delivery = admin.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["items"][0]
    yield World(
        app=app,
        tokens={"nobody": None, "admin": admin_token, "own_trainer": mine["token"], "other_trainer": other["token"]},
        ids={"job_id": mine["id"], "token_id": victim["id"], "webhook_id": hook["id"], "delivery_id": delivery["id"]},
    )
    reset_caches()


def call(world: World, endpoint: str, caller: str) -> httpx.Response:
    method, path = endpoint.split(" ", 1)
    if method == "MOUNT":
        method, path = "GET", path + "/css/dashboard.css"
    path = path.format(**world.ids)
    token = world.tokens[caller]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    client = TestClient(world.app, follow_redirects=False)
    return client.request(method, path, headers=headers, **BODIES.get(endpoint, dict)())


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_authorization(world: World, endpoint: str) -> None:
    policy = POLICY.get(endpoint)
    if policy is None:
        pytest.fail(f"{endpoint} has no authorization policy (see test_every_endpoint_is_classified)")
    answers: dict[str, int] = {}
    for caller in ("nobody", "other_trainer", "own_trainer", "admin"):  # admins last: they may delete
        before = row_counts()
        response = call(world, endpoint, caller)
        answers[caller] = response.status_code
        assert response.status_code < 500, f"{endpoint} as {caller}: {response.status_code} {response.text[:300]}"
        refused = response.status_code in (401, 403) or _sent_to_login(response)
        if refused:
            assert row_counts() == before, f"{endpoint} refused {caller} but changed the database"
            assert world.ids["job_id"] not in response.text or endpoint.startswith("GET /jobs/")
        if policy == ADMIN:
            want = {"nobody": 401, "own_trainer": 403, "other_trainer": 403}.get(caller)
            if want is not None:
                assert response.status_code == want, f"{endpoint} as {caller}: {response.status_code}"
            else:
                assert not refused, f"{endpoint} refused an admin: {response.status_code} {response.text[:300]}"
        elif policy == REPORTER:
            if caller == "nobody":
                assert response.status_code == 401
            elif caller == "other_trainer":
                assert response.status_code == 403, f"{endpoint}: another job's token got {response.status_code}"
            else:
                assert 200 <= response.status_code < 300, f"{endpoint} as {caller}: {response.text[:300]}"
        elif policy == DASHBOARD:
            if caller == "admin":
                assert response.status_code in (200, 286), f"{endpoint} as admin: {response.status_code}"
            else:
                assert _sent_to_login(response), f"{endpoint} as {caller}: {response.status_code}"
    if policy == PUBLIC:
        assert len(set(answers.values())) == 1, f"{endpoint} answers differently by caller: {answers}"


def _sent_to_login(response: httpx.Response) -> bool:
    target = response.headers.get("location") or response.headers.get("hx-redirect") or ""
    return response.status_code in (303, 401) and target.startswith("/login")


def test_a_trainer_token_cannot_open_a_dashboard_session(world: World) -> None:
    client = TestClient(world.app, follow_redirects=False)
    for caller in ("own_trainer", "other_trainer"):
        response = client.post("/login", data={"token": world.tokens[caller], "next": "/"})
        assert response.status_code == 401 and "set-cookie" not in response.headers
    response = client.post("/login", data={"token": world.tokens["admin"], "next": "/"})
    assert response.status_code == 303 and "set-cookie" in response.headers


def test_a_revoked_trainer_token_reports_nothing(world: World) -> None:
    from sqlalchemy import update

    from api.core.db import session_scope
    from api.database.tables import ApiToken
    from api.schemas.events import utcnow

    with session_scope() as session:
        session.execute(update(ApiToken).where(ApiToken.job_id == world.ids["job_id"]).values(revoked_at=utcnow()))
    before = row_counts()
    response = call(world, "POST /v1/jobs/{job_id}/events", "own_trainer")
    assert response.status_code == 401 and row_counts() == before
