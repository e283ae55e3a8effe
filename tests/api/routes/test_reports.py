"""Events (idempotent by key) and heartbeats (liveness) as trainers report them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient

from tests.conftest import row_counts


def trainer(client: TestClient, job: dict[str, Any]) -> dict[str, str]:
    return {"Authorization": f"Bearer {job['token']}"}


def event(key: str, type_: str = "checkpoint_saved", **extra: Any) -> dict[str, Any]:
    return {"key": key, "type": type_, "step": 10, "details": {"blocking_s": 0.5}, **extra}


def test_resent_event_batch_is_stored_once(admin: TestClient, make_job: Any) -> None:
    job = make_job()
    batch = {"events": [event("a"), event("b", "checkpoint_loaded"), event("a")]}
    first = admin.post(f"/v1/jobs/{job['id']}/events", json=batch, headers=trainer(admin, job))
    assert first.status_code == 200
    assert first.json() == {"stored": 2, "duplicates": 0}
    again = admin.post(f"/v1/jobs/{job['id']}/events", json=batch, headers=trainer(admin, job))
    assert again.status_code == 200
    assert again.json() == {"stored": 0, "duplicates": 2}
    items = admin.get(f"/v1/jobs/{job['id']}/events").json()["items"]
    assert sorted(e["key"] for e in items) == ["a", "b"]


def test_events_filter_by_type_and_time_and_paginate(admin: TestClient, make_job: Any) -> None:
    job = make_job()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    batch = [
        event(f"k{i}", "rank_failed" if i % 3 == 0 else "checkpoint_saved", ts=(t0 + timedelta(minutes=i)).isoformat())
        for i in range(10)
    ]
    admin.post(f"/v1/jobs/{job['id']}/events", json={"events": batch})
    failed = admin.get(f"/v1/jobs/{job['id']}/events", params={"type": "rank_failed"}).json()["items"]
    assert [e["key"] for e in failed] == ["k0", "k3", "k6", "k9"]
    window = admin.get(
        f"/v1/jobs/{job['id']}/events",
        params={"since": (t0 + timedelta(minutes=2)).isoformat(), "until": (t0 + timedelta(minutes=5)).isoformat()},
    ).json()["items"]
    assert [e["key"] for e in window] == ["k2", "k3", "k4"]
    keys, cursor = [], 0
    while True:
        page = admin.get(f"/v1/jobs/{job['id']}/events", params={"limit": 4, "cursor": cursor}).json()
        keys += [e["key"] for e in page["items"]]
        if not page["next_cursor"]:
            break
        cursor = page["next_cursor"]
    assert keys == [f"k{i}" for i in range(10)]
    for beyond in (2**63, 6467363569790502904805720064):  # past any row id (SQLite's INTEGER): a 422, not a 500
        refused = admin.get(f"/v1/jobs/{job['id']}/events", params={"cursor": beyond})
        assert refused.status_code == 422 and "cursor" in refused.text
    last = admin.get(f"/v1/jobs/{job['id']}/events", params={"cursor": 2**63 - 1}).json()
    assert last["items"] == [] and last["next_cursor"] is None


def test_a_bad_event_refuses_the_whole_batch(admin: TestClient, make_job: Any) -> None:
    job = make_job()
    before = row_counts()
    response = admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [event("ok"), event("bad", "made_up_type")]})
    assert response.status_code == 422
    assert "events[1].type" in [f["field"] for f in response.json()["error"]["fields"]]
    assert row_counts() == before


def test_batch_length_is_bounded(admin: TestClient, make_job: Any) -> None:
    job = make_job()
    response = admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [event(f"k{i}") for i in range(1001)]})
    assert response.status_code == 422
    assert response.json()["error"]["fields"][0]["field"] == "events"


def test_running_event_moves_job_to_running_and_failure_to_recovering(admin: TestClient, make_job: Any) -> None:
    from api import models
    from api.core.db import session_scope
    from api.services import lifecycle

    job = make_job()
    with session_scope() as session:  # as the submit task would
        row = models.jobs.get(session, job["id"])
        assert row is not None
        lifecycle.transition(session, row, lifecycle.JobStatus.SUBMITTED)
    url = f"/v1/jobs/{job['id']}/events"
    admin.post(url, json={"events": [{"key": "r0", "type": "running"}]}, headers=trainer(admin, job))
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "RUNNING"
    # A rank whose collective broke because a peer died reports first; its failure is a consequence: it moves
    # nothing, and the peer's failure gives the job its cause.
    broken = {"cause": "RuntimeError: Connection reset by peer", "consequence": True}
    consequence = {"key": "f0", "type": "rank_failed", "rank": 0, "details": broken}
    admin.post(url, json={"events": [consequence]}, headers=trainer(admin, job))
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "RUNNING"
    admin.post(
        url,
        json={"events": [{"key": "f1", "type": "rank_failed", "rank": 1, "details": {"cause": "boom"}}]},
        headers=trainer(admin, job),
    )
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["status"] == "RECOVERING" and body["status_reason"] == "boom"
    admin.post(url, json={"events": [{"key": "r1", "type": "running"}]}, headers=trainer(admin, job))
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "RUNNING"


def test_heartbeats_update_liveness_newest_wins(admin: TestClient, make_job: Any) -> None:
    job = make_job(procs_per_node=4)
    now = datetime.now(UTC)
    beats = [
        {"rank": r, "step": 5, "ts": (now - timedelta(seconds=1)).isoformat(), "throughput": 100.0} for r in range(4)
    ]
    beats.append({"rank": 2, "step": 7, "ts": now.isoformat(), "loss": 2.5})
    response = admin.post(
        f"/v1/jobs/{job['id']}/heartbeats", json={"attempt": 0, "heartbeats": beats}, headers=trainer(admin, job)
    )
    assert response.status_code == 200
    assert response.json() == {"accepted": 5, "faults": []}
    older = [{"rank": 2, "step": 3, "ts": (now - timedelta(seconds=30)).isoformat()}]
    admin.post(f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": older}, headers=trainer(admin, job))
    ranks = {r["rank"]: r for r in admin.get(f"/v1/jobs/{job['id']}/ranks").json()}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert ranks[2]["step"] == 7 and ranks[2]["loss"] == 2.5
    assert ranks[0]["step"] == 5 and ranks[0]["throughput"] == 100.0
    assert not any(r["stale"] for r in ranks.values())


def test_heartbeats_for_thousands_of_ranks_in_one_batch(admin: TestClient, make_job: Any) -> None:
    job = make_job(procs_per_node=64)  # the batch may name more ranks than one node holds
    beats = [{"rank": r, "step": 1} for r in range(5000)]
    response = admin.post(f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": beats}, headers=trainer(admin, job))
    assert response.status_code == 200 and response.json()["accepted"] == 5000
    assert row_counts()["rank_liveness"] == 5000


def test_fault_directive_rides_on_heartbeat_reply_until_fired(admin: TestClient, make_job: Any) -> None:
    from api import models
    from api.core.db import session_scope
    from api.services import lifecycle

    job = make_job()
    with session_scope() as session:
        row = models.jobs.get(session, job["id"])
        assert row is not None
        lifecycle.transition(session, row, lifecycle.JobStatus.SUBMITTED)
    fault = admin.post(f"/v1/jobs/{job['id']}/faults", json={"kind": "exception", "rank": 1, "at_step": 12})
    assert fault.status_code == 202 and fault.json()["delivery"] == "trainer"
    url = f"/v1/jobs/{job['id']}/heartbeats"
    rank0 = admin.post(url, json={"heartbeats": [{"rank": 0, "step": 3}]}, headers=trainer(admin, job)).json()
    assert rank0["faults"] == []
    rank1 = admin.post(url, json={"heartbeats": [{"rank": 1, "step": 3}]}, headers=trainer(admin, job)).json()
    assert rank1["faults"] == [
        {
            "id": fault.json()["id"],
            "kind": "exception",
            "rank": 1,
            "at_step": 12,
            "fraction": None,
            "duration_steps": None,
        }
    ]
    fired = {
        "key": f"fault:{fault.json()['id']}",
        "type": "fault_injected",
        "rank": 1,
        "step": 12,
        "details": {"fault_id": fault.json()["id"], "kind": "exception"},
    }
    admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [fired]}, headers=trainer(admin, job))
    after = admin.post(url, json={"heartbeats": [{"rank": 1, "step": 13}]}, headers=trainer(admin, job)).json()
    assert after["faults"] == []


def test_fault_request_validation(admin: TestClient, make_job: Any) -> None:
    job = make_job()
    url = f"/v1/jobs/{job['id']}/faults"
    assert admin.post(url, json={"kind": "crash", "rank": 0, "now": True}).status_code == 409  # still PENDING
    both = admin.post(url, json={"kind": "crash", "rank": 0, "now": True, "at_step": 3})
    assert both.status_code == 422 and "exactly one" in both.json()["error"]["message"]


def test_a_trainer_reporting_before_the_launch_is_committed_is_accepted(admin: TestClient, make_job: Any) -> None:
    job = make_job()  # still PENDING: the submit task has not committed its bookkeeping yet
    response = admin.post(
        f"/v1/jobs/{job['id']}/events", json={"events": [{"key": "r", "type": "running"}]}, headers=trainer(admin, job)
    )
    assert response.status_code == 200
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "RUNNING"
