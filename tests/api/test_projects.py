"""Projects and role bindings over the API: jobs go to `default` unless their spec says otherwise, an unknown
project is refused naming it, names and bindings are unique."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import row_counts, tiny_spec


@pytest.fixture(autouse=True)
def no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    from api.core import queue

    monkeypatch.setattr(queue, "send", lambda *args, **kwargs: True)


def test_jobs_go_to_default_and_an_unknown_project_is_422_naming_it(admin: TestClient) -> None:
    assert admin.post("/v1/jobs", json=tiny_spec()).json()["project"] == "default"
    before = row_counts()
    refused = admin.post("/v1/jobs", json=tiny_spec(project="nope"))
    assert refused.status_code == 422 and refused.json()["error"]["fields"][0]["field"] == "project"
    assert "unknown project 'nope'" in refused.json()["error"]["message"]
    assert admin.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/h", "project": "nope"}).status_code == 422
    assert admin.post("/v1/tokens", json={"name": "x", "project": "nope", "role": "viewer"}).status_code == 422
    assert row_counts() == before
    assert admin.post("/v1/jobs", json=tiny_spec(project="Not_A_Label")).status_code == 422


def test_projects_and_bindings_are_unique_and_checked(admin: TestClient) -> None:
    made = admin.post("/v1/projects", json={"name": "vision", "gpu_limit": 64})
    assert made.status_code == 201 and made.json()["gpu_limit"] == 64
    assert admin.post("/v1/projects", json={"name": "vision"}).status_code == 409
    assert [p["name"] for p in admin.get("/v1/projects").json()] == ["default", "vision"]
    assert admin.get("/v1/projects/vision").json()["name"] == "vision"
    assert admin.get("/v1/projects/nope").status_code == 404
    bind: dict[str, Any] = {"group": "cv", "role": "operator"}
    assert admin.post("/v1/projects/vision/bindings", json=bind).status_code == 201
    assert admin.post("/v1/projects/vision/bindings", json=bind).status_code == 409
    both = admin.post("/v1/projects/vision/bindings", json={"group": "g", "subject": "s", "role": "viewer"})
    assert both.status_code == 422 and "exactly one of group or subject" in both.text
    assert admin.post("/v1/projects/vision/bindings", json={"role": "viewer"}).status_code == 422
    assert admin.post("/v1/projects/vision/bindings", json={"group": "g", "role": "owner"}).status_code == 422
    listed = admin.get("/v1/projects/vision/bindings").json()
    assert [(b["kind"], b["value"], b["role"]) for b in listed] == [("group", "cv", "operator")]


def test_tokens_carry_one_role_in_one_project(admin: TestClient) -> None:
    assert admin.post("/v1/projects", json={"name": "vision"}).status_code == 201
    viewer = admin.post("/v1/tokens", json={"name": "v", "project": "vision"}).json()
    assert (viewer["role"], viewer["project"]) == ("viewer", "vision")
    assert admin.post("/v1/tokens", json={"name": "x", "role": "operator"}).status_code == 422
    assert admin.post("/v1/tokens", json={"name": "x", "project": "vision", "role": "cluster-admin"}).status_code == 422
    project_admin = admin.post("/v1/tokens", json={"name": "a", "project": "vision", "role": "admin"}).json()
    lead = TestClient(admin.app, headers={"Authorization": f"Bearer {project_admin['token']}"})
    refused = lead.post("/v1/tokens", json={"name": "escalate"})
    assert refused.status_code == 403 and "cluster-admin" in refused.json()["error"]["message"]
    assert lead.post("/v1/tokens", json={"name": "x", "project": "default", "role": "admin"}).status_code == 422
    assert lead.post("/v1/tokens", json={"name": "ops", "project": "vision", "role": "operator"}).status_code == 201
    assert {t["project"] for t in lead.get("/v1/tokens").json()} == {"vision"}
    root = next(t for t in admin.get("/v1/tokens").json() if t["role"] == "cluster-admin")
    assert lead.delete(f"/v1/tokens/{root['id']}").status_code == 404  # not its to see
