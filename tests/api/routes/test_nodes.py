"""`/v1/nodes`: the fleet's nodes, listed by state and page, one in detail, and released (cluster admins)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.core.db import session_scope
from api.services.node_reputation import ledger
from tests.conftest import row_counts


def report(admin: TestClient, job_id: str, *events: dict[str, Any]) -> None:
    body = {"events": [{"key": uuid.uuid4().hex, "attempt": 0, **e} for e in events]}
    assert admin.post(f"/v1/jobs/{job_id}/events", json=body).status_code == 200


def lost(node: str) -> dict[str, Any]:
    return {"type": "node_failed", "node": node, "details": {"cause": f"node {node} lost", "cause_class": "node"}}


def judge() -> None:
    with session_scope() as session:
        ledger.run_once(session)


@pytest.fixture
def fleet(admin: TestClient, make_job: Callable[..., dict[str, Any]]) -> dict[str, str]:
    """node-a quarantined (lost under two jobs), node-b suspect (one), node-c healthy (ran only)."""
    first, second = make_job(name="first"), make_job(name="second")
    report(admin, first["id"], lost("node-a"), lost("node-b"), {"type": "running", "node": "node-c"})
    report(admin, second["id"], lost("node-a"))
    judge()
    return {"first": first["id"], "second": second["id"]}


def test_nodes_by_state_and_page(admin: TestClient, fleet: dict[str, str]) -> None:
    everything = admin.get("/v1/nodes").json()
    assert [(n["name"], n["state"]) for n in everything["nodes"]] == [
        ("node-a", "quarantined"),
        ("node-b", "suspect"),
        ("node-c", "healthy"),
    ]
    a = everything["nodes"][0]
    assert a["faults"] == {"lost": 2} and a["jobs"] == 2 and a["last_fault"]["kind"] == "lost"
    assert set(a) >= {"name", "state", "faults", "last_fault", "jobs", "quarantined_until"}  # the agreed shape
    assert everything["nodes"][2]["last_fault"] is None and everything["nodes"][2]["quarantined_until"] is None
    for state, names in (("suspect", ["node-b"]), ("healthy", ["node-c"])):
        assert [n["name"] for n in admin.get("/v1/nodes", params={"state": state}).json()["nodes"]] == names
    first = admin.get("/v1/nodes", params={"limit": 2}).json()
    assert [n["name"] for n in first["nodes"]] == ["node-a", "node-b"] and first["next_cursor"] == "node-b"
    rest = admin.get("/v1/nodes", params={"limit": 2, "cursor": first["next_cursor"]}).json()
    assert [n["name"] for n in rest["nodes"]] == ["node-c"] and rest["next_cursor"] is None


def test_one_node_in_detail(admin: TestClient, fleet: dict[str, str]) -> None:
    detail = admin.get("/v1/nodes/node-a").json()
    assert {r["job_id"] for r in detail["runs"]} == {fleet["first"], fleet["second"]}
    assert detail["runs"][0]["job_name"] in ("first", "second") and detail["runs"][0]["project"] == "default"
    assert [f["kind"] for f in detail["recent_faults"]] == ["lost", "lost"]
    assert [h["action"] for h in detail["history"]] == ["quarantined"]  # both faults were read in one pass


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/nodes/Node_A", "name"),
        ("/v1/nodes/" + "a" * 254, "name"),
        ("/v1/nodes/-a", "name"),
        ("/v1/nodes?state=broken", "state"),
        ("/v1/nodes?cursor=Not_A_Name", "cursor"),
        ("/v1/nodes?limit=0", "limit"),
    ],
)
def test_bad_names_and_filters_are_422_naming_the_field(admin: TestClient, path: str, field: str) -> None:
    answer = admin.get(path)
    assert answer.status_code == 422, answer.text
    assert [f["field"] for f in answer.json()["error"]["fields"]] == [field]


def test_an_unknown_node_is_404(admin: TestClient, fleet: dict[str, str]) -> None:
    before = row_counts()
    for answer in (
        admin.get("/v1/nodes/no-such-node"),
        admin.post("/v1/nodes/no-such-node/release", json={"reason": "fixed"}),
    ):
        assert answer.status_code == 404 and answer.json()["error"]["fields"][0]["field"] == "name"
    assert row_counts() == before


def test_release_forgives_and_keeps_the_reason(admin: TestClient, fleet: dict[str, str]) -> None:
    released = admin.post("/v1/nodes/node-a/release", json={"reason": "GPU 3 replaced"})
    assert released.status_code == 200, released.text
    node = released.json()
    assert node["state"] == "healthy" and node["quarantined_until"] is None and "GPU 3 replaced" in node["reason"]
    last = node["history"][0]
    assert last["action"] == "released" and last["reason"] == "GPU 3 replaced" and "tests" in last["actor"]
    (told,) = admin.get(f"/v1/jobs/{fleet['second']}/events", params={"type": "node_released"}).json()["items"]
    assert told["details"]["reason"] == "GPU 3 replaced" and told["node"] == "node-a"
    judge()  # the faults before the release no longer count
    assert admin.get("/v1/nodes/node-a").json()["state"] == "healthy"
    (entry,) = [e for e in admin.get("/v1/audit").json()["items"] if e["object_type"] == "node"]
    assert entry["object_id"] == "node-a" and entry["details"]["reason"] == "GPU 3 replaced" and entry["outcome"] == 200
    # a suspect node's release forgives too; no quarantine, nothing to tell
    assert admin.post("/v1/nodes/node-b/release", json={"reason": "reseated"}).json()["state"] == "healthy"
    assert admin.get(f"/v1/jobs/{fleet['first']}/events", params={"type": "node_released"}).json()["items"] == []


@pytest.mark.parametrize(
    "body", [{}, {"reason": ""}, {"reason": "   "}, {"reason": "x" * 1001}, {"reason": "ok", "why": 1}]
)
def test_a_release_needs_a_reason(admin: TestClient, fleet: dict[str, str], body: dict[str, Any]) -> None:
    before = row_counts()
    answer = admin.post("/v1/nodes/node-a/release", json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["fields"][0]["field"] in ("reason", "why")
    assert row_counts() == before and admin.get("/v1/nodes/node-a").json()["state"] == "quarantined"


def test_the_jobs_own_nodes_route_still_answers(admin: TestClient, fleet: dict[str, str]) -> None:
    assert admin.get(f"/v1/jobs/{fleet['first']}/nodes").status_code == 200


def test_node_states_are_a_gauge(admin: TestClient, fleet: dict[str, str]) -> None:
    text = admin.get("/metrics").text
    for state, count in (("healthy", 1), ("suspect", 1), ("quarantined", 1)):
        assert f'ftplane_nodes{{state="{state}"}} {count}.0' in text
