"""The audit log: every changing request with who, what, which object, when, from where and its outcome, written
in the same transaction as the change; read back with `GET /v1/audit?since=&actor=&project=`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import row_counts, tiny_spec


@pytest.fixture(autouse=True)
def no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    from api.core import queue

    monkeypatch.setattr(queue, "send", lambda *args, **kwargs: True)


def audit(client: TestClient, **params: Any) -> list[dict[str, Any]]:
    answer = client.get("/v1/audit", params=params)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["items"])


def test_every_change_is_recorded_with_its_actor_object_and_outcome(admin: TestClient, admin_token: str) -> None:
    started = datetime.now(UTC) - timedelta(seconds=1)
    assert admin.post("/v1/projects", json={"name": "vision", "gpu_limit": 8}).status_code == 201
    team = admin.post("/v1/tokens", json={"name": "vision-ops", "project": "vision", "role": "operator"}).json()
    ops = TestClient(admin.app, headers={"Authorization": f"Bearer {team['token']}"})
    job = ops.post("/v1/jobs", json=tiny_spec(project="vision")).json()
    assert ops.post(f"/v1/jobs/{job['id']}/faults", json={"kind": "crash", "rank": 0, "now": True}).status_code == 409
    assert ops.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    assert ops.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/h", "project": "vision"}).status_code == 403
    binding = admin.post("/v1/projects/vision/bindings", json={"group": "cv", "role": "viewer"}).json()
    assert admin.delete(f"/v1/projects/vision/bindings/{binding['id']}").status_code == 204
    assert admin.delete(f"/v1/tokens/{team['id']}").status_code == 204

    rows = audit(admin, project="vision")
    got = [(r["actor_name"], r["action"], r["object_type"], r["object_id"], r["outcome"]) for r in rows]
    assert got == [
        ("tests", "POST /v1/projects", "project", "vision", 201),
        ("tests", "POST /v1/tokens", "token", team["id"], 201),
        ("vision-ops", "POST /v1/jobs", "job", job["id"], 201),
        ("vision-ops", "POST /v1/jobs/{job_id}/faults", "job", job["id"], 409),
        ("vision-ops", "POST /v1/jobs/{job_id}/cancel", "job", job["id"], 202),
        ("vision-ops", "POST /v1/webhooks", "webhook", None, 403),
        ("tests", "POST /v1/projects/{project}/bindings", "binding", binding["id"], 201),
        ("tests", "DELETE /v1/projects/{project}/bindings/{binding_id}", "binding", binding["id"], 204),
        ("tests", "DELETE /v1/tokens/{token_id}", "token", team["id"], 204),
    ]
    assert all(r["address"] == "testclient" and r["ts"] >= started.isoformat()[:19] for r in rows)
    assert rows[1]["details"]["role"] == "operator" and rows[2]["actor"] == team["id"]
    assert "job is PENDING" in rows[3]["details"]["refused"] and "the admin role" in rows[5]["details"]["refused"]
    # Reads are not changes; a caller that was never known (401) leaves no row.
    assert TestClient(admin.app).post("/v1/jobs", json=tiny_spec()).status_code == 401
    assert len(audit(admin)) == len(audit(admin, since=started.isoformat()))


def test_filters_and_who_may_read(admin: TestClient) -> None:
    for name in ("a", "b"):
        assert admin.post("/v1/projects", json={"name": name}).status_code == 201
    tokens = {
        f"{role}_{p}": admin.post("/v1/tokens", json={"name": f"{role}-{p}", "project": p, "role": role}).json()
        for p in ("a", "b")
        for role in ("admin", "operator")
    }
    client = {k: TestClient(admin.app, headers={"Authorization": f"Bearer {v['token']}"}) for k, v in tokens.items()}
    for p in ("a", "b"):
        assert client[f"operator_{p}"].post("/v1/jobs", json=tiny_spec(project=p)).status_code == 201
    assert {r["project"] for r in audit(client["admin_a"])} == {"a"}
    assert [r["actor_name"] for r in audit(client["admin_a"], actor="operator-a")] == ["operator-a"]
    assert audit(client["admin_a"], actor=tokens["operator_b"]["id"]) == []
    assert client["admin_a"].get("/v1/audit", params={"project": "b"}).status_code == 404
    refused = client["operator_a"].get("/v1/audit")
    assert refused.status_code == 403 and "admin role" in refused.json()["error"]["message"]
    assert admin.post("/v1/tokens", json={"name": "another cluster admin"}).status_code == 201
    everything = audit(admin)
    assert {r["project"] for r in everything} == {"a", "b", None}  # a cluster admin's token: of no project
    assert None not in {r["project"] for r in audit(client["admin_b"])}
    later = audit(admin, since=(datetime.now(UTC) + timedelta(minutes=1)).isoformat())
    assert later == []
    page = admin.get("/v1/audit", params={"limit": 2}).json()
    rest = admin.get("/v1/audit", params={"cursor": page["next_cursor"], "limit": 1000}).json()
    assert [r["id"] for r in page["items"] + rest["items"]] == [r["id"] for r in everything]


def test_a_change_is_never_kept_without_its_row(admin: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The row goes in the change's own transaction: when it cannot be written, the change is not kept either."""
    from api.services import audit as audit_log

    begin = audit_log.begin

    def unwritable(*args: Any) -> Any:
        trail = begin(*args)
        if trail is not None:
            trail.entry.outcome = None  # type: ignore[assignment]  # NOT NULL: the insert fails at commit
        return trail

    monkeypatch.setattr(audit_log, "begin", unwritable)
    before = row_counts()
    failing = TestClient(admin.app, headers=dict(admin.headers), raise_server_exceptions=False)
    assert failing.post("/v1/jobs", json=tiny_spec()).status_code >= 500
    assert failing.post("/v1/projects", json={"name": "lost"}).status_code >= 500
    assert row_counts() == before
    monkeypatch.setattr(audit_log, "begin", begin)
    assert admin.get("/v1/jobs").json()["items"] == [] and audit(admin) == []


def test_a_host_change_is_read_like_any_row_even_for_a_user_without_a_passwd_entry(
    admin: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ftplane token create` in a container whose uid has no passwd entry and no USER still leaves its row."""
    import getpass

    from api.core.db import session_scope
    from api.services import audit

    def no_user() -> str:
        raise KeyError("getpwuid(): uid not found")

    monkeypatch.setattr(getpass, "getuser", no_user)
    with session_scope() as session:
        audit.host_change(session, "ftplane token create", "token", "t1", "default", name="ci", role="viewer")
    (row,) = [e for e in admin.get("/v1/audit").json()["items"] if e["action"] == "ftplane token create"]
    assert row["actor_kind"] == "host" and row["actor_name"].startswith("uid-") and row["actor"].startswith("host:uid-")
    assert (row["object_id"], row["project"], row["outcome"]) == ("t1", "default", 201)
