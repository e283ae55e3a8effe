"""Supervision with a scripted backend: a queued attempt has no pending timeout until its queue admits it,
preemptions restart the job from their own budget, and an unrecovered hang blames the silent ranks' nodes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.schemas.causes import Cause, CauseClass
from tests.support.supervision import ScriptedBackend, last_seen, supervise, use_backend
from workers.backends.base import AttemptPhase, AttemptReading, ObservedEvent


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch, app: Any) -> ScriptedBackend:
    scripted = ScriptedBackend()
    use_backend(monkeypatch, scripted)
    return scripted


K8S: dict[str, Any] = {"backend": "kubernetes", "image": "registry.example/t:1", "checkpoint": {"engine": "none"}}


def events(admin: TestClient, job_id: str, type_: str) -> list[dict[str, Any]]:
    items = admin.get(f"/v1/jobs/{job_id}/events", params={"type": type_, "limit": 1000}).json()["items"]
    return list(items)


def launched_long_ago(job_id: str, number: int, seconds: float) -> None:
    from api.core.db import session_scope
    from api.database.tables import Attempt
    from api.schemas.events import utcnow

    with session_scope() as session:
        row = session.query(Attempt).filter_by(job_id=job_id, number=number).one()
        row.launched_at = utcnow() - timedelta(seconds=seconds)


def queued(state: str) -> ObservedEvent:
    return ObservedEvent(key=f"k8s:uid:{state}", type="queued", details={"queue": "team-a", "queue_state": state})


def test_no_pending_timeout_while_queued_then_it_counts_from_the_admission(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job = make_job(**K8S, queue="team-a", resiliency={"pending_timeout_s": 60, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    waiting = Cause(CauseClass.scheduling, "queued in LocalQueue team-a: waiting for quota")
    backend.statuses[0] = AttemptReading(AttemptPhase.pending, cause=waiting, events=[queued("waiting")])
    supervise()
    launched_long_ago(job["id"], 0, 3600)  # an hour in the queue
    supervise()
    detail = admin.get(f"/v1/jobs/{job['id']}").json()
    assert detail["attempt"] == 0 and detail["attempts"][0]["status"] == "LAUNCHED"
    assert detail["attempts"][0]["cause"] == waiting.message
    assert [e["details"]["queue_state"] for e in events(admin, job["id"], "queued")] == ["waiting"]

    # admitted: the pods wait for nodes now, and the timeout counts from the admission
    unschedulable = Cause(CauseClass.scheduling, "waiting for nodes (0/1 pods running): 0/4 nodes are available")
    backend.statuses[0] = AttemptReading(AttemptPhase.pending, cause=unschedulable, events=[queued("admitted")])
    supervise()
    assert admin.get(f"/v1/jobs/{job['id']}").json()["attempt"] == 0  # admitted just now: not timed out
    from api.core.db import session_scope
    from api.database.tables import Event

    with session_scope() as session:
        admitted = session.query(Event).filter_by(job_id=job["id"], key="k8s:uid:admitted").one()
        admitted.ts = admitted.ts - timedelta(seconds=61)
    supervise()
    failed = events(admin, job["id"], "scheduling_failed")
    assert len(failed) == 1 and "after admission by the queue (pending timeout 60 s)" in failed[0]["details"]["cause"]
    assert failed[0]["details"]["reason"] == "PendingTimeout"
    assert admin.get(f"/v1/jobs/{job['id']}").json()["attempt"] == 1


def test_on_pending_timeout_fail_ends_the_job_and_releases_the_attempt(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job = make_job(**K8S, resiliency={"pending_timeout_s": 60, "max_job_restarts": 3, "on_pending_timeout": "fail"})
    supervise(job["id"], force_launch=True)
    waiting = Cause(CauseClass.scheduling, "image cannot be pulled (ImagePullBackOff); Kubernetes keeps retrying")
    backend.statuses[0] = AttemptReading(AttemptPhase.pending, cause=waiting)
    supervise()
    launched_long_ago(job["id"], 0, 61)
    supervise()
    detail = admin.get(f"/v1/jobs/{job['id']}").json()
    assert detail["status"] == "FAILED" and detail["attempt"] == 0
    assert "resiliency.on_pending_timeout is fail" in detail["status_reason"]
    assert backend.cancels == [0]  # the partial attempt is torn down (its GPUs freed) by the release duty
    assert [r.attempt for r in backend.launches] == [0]


def test_preemptions_restart_from_their_own_bounded_budget(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job = make_job(**K8S, resiliency={"max_job_restarts": 0, "max_preemptions": 2})
    supervise(job["id"], force_launch=True)
    preempted = Cause(CauseClass.preempted, "pod evicted on node n1 (drain)", {"node": "n1", "reason": "Evicted"})
    for attempt in range(3):
        backend.statuses[attempt] = AttemptReading(AttemptPhase.failed, cause=preempted, failed_nodes=("n1",))
    supervise()
    supervise()
    supervise()
    detail = admin.get(f"/v1/jobs/{job['id']}").json()
    assert detail["status"] == "FAILED" and detail["attempt"] == 2
    assert detail["status_reason"].endswith("preemption budget (2) spent")
    restarts = events(admin, job["id"], "job_restart")
    assert [(r["details"]["preemption"], r["details"]["preemption_budget"]) for r in restarts] == [(1, 2), (2, 2)]
    assert all(r["details"]["cause_class"] == "preempted" for r in restarts)
    assert detail["job_restarts"] == 2  # restarts made, though none was charged to max_job_restarts (0)


def hang_job(admin: TestClient, make_job: Any, silent: dict[int, float]) -> dict[str, Any]:
    from api.schemas.events import utcnow

    job = make_job(**K8S, nodes=2, resiliency={"heartbeat_timeout_s": 10, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [{"key": "run", "type": "running"}]})
    now = utcnow()
    beats = [{"rank": r, "step": 4, "node": "node-a" if r < 2 else "node-b"} for r in range(4)]
    assert admin.post(f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": beats}).status_code == 200
    supervise(job["id"])
    last_seen(job["id"], silent, now)
    supervise(job["id"])
    return dict(admin.get(f"/v1/jobs/{job['id']}").json())


def test_an_unrecovered_hang_blames_the_silent_ranks_nodes(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    detail = hang_job(admin, make_job, {3: 25})
    assert detail["attempt"] == 1 and "on node(s) node-b" in detail["status_reason"]
    assert detail["excluded_nodes"] == ["node-b"]
    supervise()  # the launch duty's next pass
    assert backend.launches[-1].excluded_nodes == ("node-b",)


def test_a_hang_of_every_node_blames_none(admin: TestClient, make_job: Any, backend: ScriptedBackend) -> None:
    detail = hang_job(admin, make_job, {0: 25, 1: 25, 2: 25, 3: 25})
    assert detail["attempt"] == 1 and detail["excluded_nodes"] == []
