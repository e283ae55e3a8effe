"""Supervision decisions through the Backend interface, with a scripted backend."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.schemas.causes import Cause, CauseClass
from tests.support.supervision import ScriptedBackend, last_seen, supervise, use_backend
from workers.backends.base import AttemptPhase, AttemptStatus, ObservedEvent


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch, app: Any) -> ScriptedBackend:
    scripted = ScriptedBackend()
    use_backend(monkeypatch, scripted)
    return scripted


EXIT_1 = Cause(CauseClass.crash, "exit code 1", {"exit_code": 1})


def types(admin: TestClient, job_id: str) -> list[str]:
    return [e["type"] for e in admin.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["items"]]


def test_submit_launches_attempt_zero_once(admin: TestClient, make_job: Any, backend: ScriptedBackend) -> None:
    job = make_job()
    supervise(job["id"], force_launch=True)
    supervise(job["id"], force_launch=True)  # a redelivered submit task
    assert len(backend.launches) == 1
    launch = backend.launches[0]
    assert launch.attempt == 0 and launch.token.startswith("ftp_job_")
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["status"] == "SUBMITTED"
    assert types(admin, job["id"]) == ["submitted"]
    beat = TestClient(admin.app).post(
        f"/v1/jobs/{job['id']}/heartbeats",
        json={"heartbeats": [{"rank": 0, "step": 1}]},
        headers={"Authorization": f"Bearer {launch.token}"},
    )
    assert beat.status_code == 200  # the launch token is a valid trainer token


def test_launch_failure_ends_failed_with_cause(admin: TestClient, make_job: Any, backend: ScriptedBackend) -> None:
    backend.fail_launch = True
    job = make_job()
    supervise(job["id"], force_launch=True)
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["status"] == "FAILED"
    assert "cluster unreachable" in body["status_reason"]
    failed = [e for e in admin.get(f"/v1/jobs/{job['id']}/events").json()["items"] if e["type"] == "failed"]
    assert "cluster unreachable" in failed[0]["details"]["cause"]


def test_success(admin: TestClient, make_job: Any, backend: ScriptedBackend) -> None:
    job = make_job()
    supervise(job["id"], force_launch=True)
    backend.statuses[0] = AttemptStatus(AttemptPhase.succeeded)
    supervise(job["id"])
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "SUCCEEDED"
    assert types(admin, job["id"])[-1] == "succeeded"
    assert backend.released == [job["id"]]
    late = TestClient(admin.app).post(
        f"/v1/jobs/{job['id']}/events",
        json={"events": [{"key": "late", "type": "checkpoint_saved"}]},
        headers={"Authorization": f"Bearer {backend.launches[0].token}"},
    )
    assert late.status_code == 401  # a finished job's trainer tokens are revoked


def test_retryable_launch_error_is_retried_not_fatal(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    backend.fail_launch, backend.retryable = True, True
    job = make_job()
    supervise(job["id"], force_launch=True)
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["status"] == "PENDING" and "cluster unreachable" in body["attempts"][0]["cause"]
    backend.fail_launch = False
    supervise(job["id"], force_launch=True)
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "SUBMITTED"
    assert len(backend.launches) == 1


def test_failure_climbs_to_job_restart_excluding_the_node_then_budget_ends_it(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job = make_job(resiliency={"max_job_restarts": 1, "max_in_job_restarts": 2})
    supervise(job["id"], force_launch=True)
    backend.statuses[0] = AttemptStatus(
        AttemptPhase.failed,
        cause=Cause(CauseClass.crash, "exit code 137 (OOMKilled) on node n7", {"exit_code": 137}),
        in_job_restarts=2,
        failed_nodes=("n7",),
        events=[ObservedEvent(key="obs-1", type="rank_failed", rank=1, node="n7", details={"cause": "exit 137"})],
    )
    supervise(job["id"])
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["attempt"] == 1 and body["job_restarts"] == 1
    assert body["status"] == "RECOVERING"
    assert body["excluded_nodes"] == ["n7"]
    assert backend.cancels == [0]
    assert [r.attempt for r in backend.launches] == [0, 1]
    assert backend.launches[1].excluded_nodes == ("n7",)
    seen = types(admin, job["id"])
    for expected in ("rank_failed", "injob_restart", "node_excluded", "job_restart", "submitted"):
        assert expected in seen
    assert seen.count("injob_restart") == 2
    restart = [e for e in admin.get(f"/v1/jobs/{job['id']}/events").json()["items"] if e["type"] == "job_restart"][0]
    assert restart["attempt"] == 1 and "OOMKilled" in restart["details"]["cause"]

    admin.post(f"/v1/jobs/{job['id']}/heartbeats", json={"attempt": 1, "heartbeats": [{"rank": 0, "step": 5}]})
    backend.statuses[1] = AttemptStatus(AttemptPhase.failed, cause=EXIT_1)
    supervise(job["id"])
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["status"] == "FAILED"
    assert "job restart budget (1) spent" in body["status_reason"]
    assert len(backend.launches) == 2


def test_restart_loop_without_progress_fails_before_the_budget_is_spent(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job = make_job(resiliency={"max_job_restarts": 50})
    supervise(job["id"], force_launch=True)
    for attempt in range(5):
        beats = {"attempt": attempt, "heartbeats": [{"rank": 0, "step": 7}]}
        admin.post(f"/v1/jobs/{job['id']}/heartbeats", json=beats)
        backend.statuses[attempt] = AttemptStatus(AttemptPhase.failed, cause=EXIT_1)
        supervise(job["id"])
        if admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "FAILED":
            break
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["status"] == "FAILED"
    assert "no progress" in body["status_reason"] and "step 7" in body["status_reason"]
    assert body["job_restarts"] == 2  # three failures at step 7, not fifty


def test_progress_between_failures_keeps_restarting(admin: TestClient, make_job: Any, backend: ScriptedBackend) -> None:
    job = make_job(resiliency={"max_job_restarts": 5})
    supervise(job["id"], force_launch=True)
    for attempt in range(4):
        beats = {"attempt": attempt, "heartbeats": [{"rank": 0, "step": 10 * (attempt + 1)}]}
        admin.post(f"/v1/jobs/{job['id']}/heartbeats", json=beats)
        backend.statuses[attempt] = AttemptStatus(AttemptPhase.failed, cause=EXIT_1)
        supervise(job["id"])
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["status"] == "RECOVERING" and body["attempt"] == 4


def test_silent_rank_is_a_hang_and_a_long_one_escalates(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    from api.schemas.events import utcnow

    job = make_job(resiliency={"heartbeat_timeout_s": 10, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [{"key": "run", "type": "running"}]})
    now = utcnow()
    admin.post(
        f"/v1/jobs/{job['id']}/heartbeats",
        json={"heartbeats": [{"rank": 0, "step": 4, "ts": now.isoformat()}, {"rank": 1, "step": 4}]},
    )
    supervise(job["id"])
    assert "hang_detected" not in types(admin, job["id"])

    last_seen(job["id"], {1: 12}, now)
    supervise(job["id"])
    supervise(job["id"])  # the same silence is recorded once
    hangs = [e for e in admin.get(f"/v1/jobs/{job['id']}/events").json()["items"] if e["type"] == "hang_detected"]
    assert len(hangs) == 1 and hangs[0]["rank"] == 1 and "no heartbeat for" in hangs[0]["details"]["cause"]
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "RECOVERING"

    last_seen(job["id"], {1: 25}, now)
    supervise(job["id"])
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["attempt"] == 1 and "hang not recovered in-job" in body["status_reason"]


def test_cancel_of_a_launched_job_tears_it_down(admin: TestClient, make_job: Any, backend: ScriptedBackend) -> None:
    job = make_job()
    supervise(job["id"], force_launch=True)
    assert admin.post(f"/v1/jobs/{job['id']}/cancel").json()["cancel_requested"] is True
    supervise(job["id"])
    assert backend.cancels == [0]
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "CANCELLED"


def test_ranks_restarting_after_a_failure_get_the_initial_timeout(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    from api.core.db import session_scope
    from api.schemas.events import utcnow

    job = make_job(resiliency={"heartbeat_timeout_s": 5, "initial_heartbeat_timeout_s": 60, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    now = utcnow()
    admin.post(
        f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": [{"rank": 0, "step": 9}, {"rank": 1, "step": 9}]}
    )
    last_seen(job["id"], {0: 20, 1: 20}, now)  # silent for 4× the timeout...
    failure = {"key": "f", "type": "rank_failed", "rank": 1, "ts": (now - timedelta(seconds=18)).isoformat()}
    admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [failure]})  # ...because they are restarting
    supervise(job["id"])
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["attempt"] == 0 and "hang_detected" not in types(admin, job["id"])

    last_seen(job["id"], {0: 100, 1: 100}, now)
    with session_scope() as session:  # the restart began long ago and nothing has come back
        from sqlalchemy import update

        from api.database.tables import Event

        session.execute(update(Event).where(Event.key == "f").values(ts=now - timedelta(seconds=90)))
    supervise(job["id"])
    hangs = [e for e in admin.get(f"/v1/jobs/{job['id']}/events").json()["items"] if e["type"] == "hang_detected"]
    assert hangs and "after a restart began" in hangs[0]["details"]["cause"]


def test_a_rank_the_launcher_restarted_for_a_hang_is_recorded_hung_but_not_escalated(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    """The launcher shares the timeout: it may kill a hung rank (reported as a failure) before a pass sees the
    rank overdue. A rank already silent for the timeout when the restart began was hung."""
    from api.schemas.events import utcnow

    job = make_job(resiliency={"heartbeat_timeout_s": 20, "initial_heartbeat_timeout_s": 120, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    now = utcnow()
    admin.post(
        f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": [{"rank": 0, "step": 41}, {"rank": 1, "step": 41}]}
    )
    last_seen(job["id"], {0: 21.0, 1: 0.5}, now)  # rank 0 hung; rank 1 waited on it in a collective
    # 20.4 s after rank 0's last beat the launcher's timeout fired and rank 1's collective failed
    killed = {"key": "k", "type": "rank_failed", "rank": 1, "ts": (now - timedelta(seconds=0.6)).isoformat()}
    admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [killed]})
    supervise(job["id"])
    supervise(job["id"])  # recorded once
    hangs = [e for e in admin.get(f"/v1/jobs/{job['id']}/events").json()["items"] if e["type"] == "hang_detected"]
    assert [(h["rank"], h["step"]) for h in hangs] == [(0, 41)]
    assert "when a restart began: the launcher is recovering it" in hangs[0]["details"]["cause"]
    assert hangs[0]["details"]["silent_s"] >= 21
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["attempt"] == 0 and body["status"] != "FAILED"  # not escalated: the launcher has it


def test_a_fault_outside_the_ranks_code_reaches_the_node_agent_once(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job = make_job()
    supervise(job["id"], force_launch=True)
    admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [{"key": "run", "type": "running"}]})
    fault = admin.post(f"/v1/jobs/{job['id']}/faults", json={"kind": "crash", "rank": 1, "now": True}).json()
    assert fault["delivery"] == "agent"
    beat = admin.post(f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": [{"rank": 1, "step": 2}]}).json()
    assert beat["faults"] == []  # not handed to the rank's code
    report = {"attempt": 0, "node": "n0", "agent": {"ranks": [{"rank": 0, "alive": True}]}}
    reply = admin.post(f"/v1/jobs/{job['id']}/reports", json=report).json()
    assert reply["faults"] == []  # rank 1 is not on this node
    report = {"attempt": 0, "node": "n1", "agent": {"ranks": [{"rank": 1, "alive": True}]}}
    reply = admin.post(f"/v1/jobs/{job['id']}/reports", json=report).json()
    assert [(f["id"], f["kind"], f["rank"], f["delivery"]) for f in reply["faults"]] == [
        (fault["id"], "crash", 1, "agent")
    ]
    again = admin.post(f"/v1/jobs/{job['id']}/reports", json=report).json()
    assert again["faults"] == []  # at most once
