"""Authorization matrix: every endpoint of the app × every kind of caller.

Callers: no token, a bad token; the viewer, operator and admin tokens of project A and of project B; a cluster
admin's token; a JWT of a real OIDC issuer on loopback (tests/support/oidc_issuer.py) per role (viewer and
operator of A through group bindings, admin of A through a subject binding, cluster admin through the
cluster-admin group); the trainer token of a job of A and that of a job of B.

Every object the paths name (a job, a webhook and its delivery, a token, a role binding, the project) is
project A's. Each caller's status is asserted: 401 without a valid credential; 404 for a caller without a role
in A (the object's existence is not revealed) and 422 naming the project when A is named in the body; 403
naming the role needed for a role too low; success otherwise. Across the whole matrix project B's callers read
no id of A's objects (lists included) and change nothing; no refused request changes the database; every
changing request of a known caller, and only those, leaves one audit row with its outcome.

Endpoints are read from the app itself, so a new one fails `test_every_endpoint_is_classified` until it is
given a policy in tests/reliability/authz_policy.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.conftest import configure_env, row_counts, tiny_spec
from tests.reliability import authz_policy
from tests.reliability.authz_policy import (
    ADMIN,
    AUDIT,
    BODIES,
    CALLERS,
    CLUSTER,
    CLUSTER_PAGE,
    DASHBOARD,
    DESTRUCTIVE,
    ENDPOINTS,
    IN_B,
    INGEST,
    OPERATOR,
    POLICY,
    PUBLIC,
    REPORTER,
    ROLE_IN_A,
    A,
    B,
    expected,
)
from tests.support.oidc_issuer import OidcIssuer


def test_every_endpoint_is_classified() -> None:
    unclassified = sorted(set(ENDPOINTS) - set(POLICY))
    assert not unclassified, f"give these endpoints an authorization policy in {authz_policy.__file__}: {unclassified}"
    gone = sorted(set(POLICY) - set(ENDPOINTS))
    assert not gone, f"these endpoints no longer exist; remove them from POLICY: {gone}"
    needs_body = [e for e in ENDPOINTS if e.split(" ")[0] in ("POST", "PATCH") and "{" not in e.split("/")[-1]]
    missing = [e for e in needs_body if e not in BODIES and not e.endswith(("/cancel", "/redeliver", "/logout"))]
    assert not missing, f"give these endpoints a valid request body in BODIES: {missing}"


@dataclass
class World:
    app: Any
    admin: TestClient
    tokens: dict[str, str | None]
    ids: dict[str, str]
    b_ids: set[str]  # ids of project B's objects
    issuer: OidcIssuer

    def fresh(self, name: str) -> str:
        """A new object of project A for a destructive endpoint."""
        if name == "token_id":
            return str(self.admin.post("/v1/tokens", json={"name": "victim", "project": A}).json()["id"])
        if name == "webhook_id":
            body = {"url": "http://127.0.0.1:9/hook", "project": A}
            return str(self.admin.post("/v1/webhooks", json=body).json()["id"])
        if name == "objective_id":
            body = {"project": A, "name": "victim", "target": 0.9}
            return str(self.admin.post("/v1/objectives", json=body).json()["id"])
        body = {"group": f"victim-{uuid.uuid4().hex[:8]}", "role": "viewer"}
        return str(self.admin.post(f"/v1/projects/{A}/bindings", json=body).json()["id"])


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[World]:
    """Projects A and B, a token per role in each, JWT bindings in A, a job in each (with its trainer token), and
    in A a webhook with a delivery, a token and a binding to act on."""
    with OidcIssuer(audience="ftplane-api") as issuer:
        configure_env(
            monkeypatch,
            tmp_path / "state",
            f"sqlite:///{tmp_path / 'ftplane.db'}",
            FTPLANE_WEBHOOK_ALLOW_PRIVATE="true",
            FTPLANE_OIDC_ISSUER=issuer.url,
            FTPLANE_OIDC_AUDIENCE="ftplane-api",
            FTPLANE_OIDC_CLUSTER_ADMIN_GROUP="platform",
            FTPLANE_OIDC_CLIENT_ID=issuer.client_id,
        )
        from api.core import queue
        from api.core.db import reset_caches, session_scope
        from api.main import create_app
        from api.models import tokens

        monkeypatch.setattr(queue, "send", lambda *args, **kwargs: True)
        app = create_app()
        with session_scope() as session:
            _, cluster_token = tokens.create_admin(session, "authz")
        admin = TestClient(app, headers={"Authorization": f"Bearer {cluster_token}"})
        held: dict[str, str | None] = {"nobody": None, "bad_token": "ftp_admin_not-a-token"}
        for project, suffix in ((A, "a"), (B, "b")):
            assert admin.post("/v1/projects", json={"name": project}).status_code == 201
            for role in ("viewer", "operator", "admin"):
                made = admin.post("/v1/tokens", json={"name": f"{role}-{suffix}", "project": project, "role": role})
                held[f"{role}_{suffix}"] = made.json()["token"]
        for binding in ({"group": "a-viewers", "role": "viewer"}, {"group": "a-ops", "role": "operator"}):
            assert admin.post(f"/v1/projects/{A}/bindings", json=binding).status_code == 201
        assert admin.post(f"/v1/projects/{A}/bindings", json={"subject": "alice", "role": "admin"}).status_code == 201
        held["jwt_viewer_a"] = issuer.token("vera", ["a-viewers"], lifetime_s=3600)
        held["jwt_operator_a"] = issuer.token("otto", ["a-ops", "a-viewers"], alg="ES256", lifetime_s=3600)
        held["jwt_admin_a"] = issuer.token("alice", [], lifetime_s=3600)
        held["jwt_cluster_admin"] = issuer.token("root", ["platform"], alg="ES256", lifetime_s=3600)
        held["cluster_admin"] = cluster_token

        mine = admin.post("/v1/jobs", json=tiny_spec(name="mine", project=A)).json()
        with session_scope() as session:  # launched, so that faults may be injected
            from api.models import jobs
            from api.services import lifecycle

            job = jobs.get(session, mine["id"])
            assert job is not None
            lifecycle.attempt_launched(session, job, lifecycle.current_attempt(session, job))
        other = admin.post("/v1/jobs", json=tiny_spec(name="other", project=B)).json()
        hook = admin.post(
            "/v1/webhooks", json={"url": "http://127.0.0.1:9/hook", "event_types": ["checkpoint_saved"], "project": A}
        ).json()
        b_hook = admin.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/b", "project": B}).json()
        trainer = {"Authorization": f"Bearer {mine['token']}"}
        admin.post(f"/v1/jobs/{mine['id']}/events", headers=trainer, **BODIES["POST /v1/jobs/{job_id}/events"]())
        delivery = admin.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["items"][0]
        on_node = {"events": [{"key": "on-node", "type": "checkpoint_saved", "node": "node-a", "step": 1}]}
        admin.post(f"/v1/jobs/{mine['id']}/events", headers=trainer, json=on_node)
        with session_scope() as session:  # the fleet's ledger records node-a, where the job ran
            from api.services import node_reputation

            node_reputation.run_once(session)
        held["own_trainer"], held["other_trainer"] = mine["token"], other["token"]
        world = World(
            app=app,
            admin=admin,
            tokens=held,
            ids={
                "job_id": mine["id"],
                "webhook_id": hook["id"],
                "delivery_id": delivery["id"],
                "project": A,
                "name": "node-a",
            },
            b_ids={other["id"], b_hook["id"]},
            issuer=issuer,
        )
        world.ids["token_id"] = world.fresh("token_id")
        world.ids["binding_id"] = world.fresh("binding_id")
        world.ids["objective_id"] = world.fresh("objective_id")
        with session_scope() as session:  # the fleet's summaries hold A's job
            from workers.supervision import summarize_goodput

            summarize_goodput.run_once(session)
        yield world
        reset_caches()


def aim(world: World, endpoint: str) -> dict[str, str]:
    """The ids a call to `endpoint` names (a fresh object for a destructive one)."""
    ids = dict(world.ids)
    if endpoint in DESTRUCTIVE:
        ids[DESTRUCTIVE[endpoint]] = world.fresh(DESTRUCTIVE[endpoint])
    return ids


def call(world: World, endpoint: str, caller: str, ids: dict[str, str] | None = None) -> httpx.Response:
    method, path = endpoint.split(" ", 1)
    if method == "MOUNT":
        method, path = "GET", path + "/css/dashboard.css"
    path = path.format(**(ids if ids is not None else aim(world, endpoint)))
    token = world.tokens[caller]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    client = TestClient(world.app, follow_redirects=False)
    return client.request(method, path, headers=headers, **BODIES.get(endpoint, dict)())


def audit_rows() -> int:
    from sqlalchemy import func, select

    from api.core.db import session_scope
    from api.database.tables import AuditEntry

    with session_scope() as session:
        return int(session.scalar(select(func.count()).select_from(AuditEntry)) or 0)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_authorization(world: World, endpoint: str) -> None:
    policy = POLICY.get(endpoint)
    if policy is None:
        pytest.fail(f"{endpoint} has no authorization policy (see test_every_endpoint_is_classified)")
    answers: dict[str, int] = {}
    changing = endpoint.split(" ")[0] in ("POST", "PATCH", "DELETE") and endpoint.startswith(
        ("POST /v1", "PATCH /v1", "DELETE /v1")
    )
    for caller in CALLERS:  # most privileged last: they may change things
        ids = aim(world, endpoint)
        before, audited = row_counts(), audit_rows()
        response = call(world, endpoint, caller, ids)
        answers[caller] = response.status_code
        assert response.status_code < 500, f"{endpoint} as {caller}: {response.status_code} {response.text[:300]}"
        refused = response.status_code in (401, 403, 404, 422) or _sent_to_login(response)
        if refused and policy != PUBLIC:
            assert row_counts() == before, f"{endpoint} refused {caller} but changed the database"
        if changing and endpoint not in INGEST:
            want_rows = 0 if caller in ("nobody", "bad_token") else 1
            assert audit_rows() - audited == want_rows, f"{endpoint} as {caller}: audit rows"
        elif policy != PUBLIC:
            assert audit_rows() == audited, f"{endpoint} as {caller} is not a change but was audited"
        # No read of project A's objects (/metrics is the whole cluster's: FTPLANE_METRICS_TOKEN closes it).
        if (caller in IN_B or caller == "other_trainer") and policy != PUBLIC:
            if response.status_code == 404:  # told exactly what a made-up id is told
                assert _as_for_nothing(world, endpoint, caller, ids, response), (endpoint, caller, response.text)
            else:
                for key in ("job_id", "webhook_id", "delivery_id", "token_id", "binding_id", "objective_id"):
                    assert ids[key] not in response.text or "{job_id}" in endpoint and policy == DASHBOARD, (
                        endpoint,
                        caller,
                        response.text[:300],
                    )
        if (caller.endswith("_a") or caller == "own_trainer") and policy != PUBLIC:
            for other in world.b_ids:  # no read of project B's objects by A's callers (cluster admins see all)
                assert other not in response.text, (endpoint, caller)
        if policy == PUBLIC:
            continue
        want = expected(policy, endpoint, caller)
        if want == "ok":
            assert 200 <= response.status_code < 300 or response.status_code == 286, (
                f"{endpoint} as {caller}: {response.status_code} {response.text[:300]}"
            )
        elif want == "login":
            assert _sent_to_login(response), f"{endpoint} as {caller}: {response.status_code}"
        else:
            assert response.status_code == want, f"{endpoint} as {caller}: {response.status_code} {response.text[:300]}"
            if want == 403 and caller in ROLE_IN_A:
                needed = {REPORTER: OPERATOR, AUDIT: ADMIN, CLUSTER_PAGE: CLUSTER}.get(policy, policy)
                said = response.text if policy == CLUSTER_PAGE else response.json()["error"]["message"]
                assert f"the {needed} role" in said, response.text
            if want == 422:
                assert response.json()["error"]["fields"][0]["field"] == "project", response.text
    if policy == PUBLIC:
        assert len(set(answers.values())) == 1, f"{endpoint} answers differently by caller: {answers}"


def _as_for_nothing(world: World, endpoint: str, caller: str, ids: dict[str, str], answer: httpx.Response) -> bool:
    """Whether `answer` is the answer to the same request naming objects that do not exist (ids swapped)."""
    made_up = {key: (value if key == "project" else uuid.uuid4().hex) for key, value in ids.items()}
    if "{project}" in endpoint and "{binding_id}" not in endpoint:
        made_up["project"] = "no-such-project"
    nothing = call(world, endpoint, caller, made_up)
    text = nothing.text
    for key, value in made_up.items():
        text = text.replace(value, ids[key])
    return nothing.status_code == answer.status_code and text == answer.text


def _sent_to_login(response: httpx.Response) -> bool:
    target = response.headers.get("location") or response.headers.get("hx-redirect") or ""
    return response.status_code in (303, 401) and target.startswith("/login")


def test_lists_hold_only_the_callers_projects(world: World) -> None:
    """Lists answer 200 to everyone with a role, with nothing of the projects they hold no role in."""
    for caller in ("viewer_b", "admin_b", "jwt_viewer_a", "admin_a"):
        client = TestClient(world.app, headers={"Authorization": f"Bearer {world.tokens[caller]}"})
        jobs = {j["project"] for j in client.get("/v1/jobs").json()["items"]}
        projects = {p["name"] for p in client.get("/v1/projects").json()}
        hooks = {h["project"] for h in client.get("/v1/webhooks").json()}
        own = B if caller.endswith("_b") else A
        assert jobs == {own} and projects == {own}, (caller, jobs, projects)
        assert hooks <= {own} and (hooks == {own}) == caller.startswith("admin"), (caller, hooks)
    root = TestClient(world.app, headers={"Authorization": f"Bearer {world.tokens['cluster_admin']}"})
    assert {j["project"] for j in root.get("/v1/jobs").json()["items"]} == {A, B}


def test_a_trainer_token_cannot_open_a_dashboard_session(world: World) -> None:
    client = TestClient(world.app, follow_redirects=False)
    for caller in ("own_trainer", "other_trainer"):
        response = client.post("/login", data={"token": world.tokens[caller], "next": "/"})
        assert response.status_code == 401 and "set-cookie" not in response.headers
    for caller in ("viewer_b", "cluster_admin"):
        response = client.post("/login", data={"token": world.tokens[caller], "next": "/"})
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
