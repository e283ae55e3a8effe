"""Reading how an attempt ends from its backend (workers/supervision/reconcile_attempts.py), and what the
lifecycle makes of it: success, the climb to a job restart without the failed node, the restart budget, and
restarts that make no progress."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from api.schemas.causes import Cause, CauseClass
from tests.support.supervision import ScriptedBackend, supervise
from tests.workers.supervision.conftest import EXIT_1, event_types
from workers.backends.base import AttemptPhase, AttemptReading, ObservedEvent


def test_success(admin: TestClient, make_job: Any, backend: ScriptedBackend) -> None:
    job = make_job()
    supervise(job["id"], force_launch=True)
    backend.statuses[0] = AttemptReading(AttemptPhase.succeeded)
    supervise(job["id"])
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "SUCCEEDED"
    assert event_types(admin, job["id"])[-1] == "succeeded"
    assert backend.released == [job["id"]]
    late = TestClient(admin.app).post(
        f"/v1/jobs/{job['id']}/events",
        json={"events": [{"key": "late", "type": "checkpoint_saved"}]},
        headers={"Authorization": f"Bearer {backend.launches[0].token}"},
    )
    assert late.status_code == 401  # a finished job's trainer tokens are revoked


def test_succeeded_says_the_highest_step_the_ranks_reported_their_running_included(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    """A run that ended before its first step sent no heartbeat: the step its ranks said they resumed from is the
    highest they reported (goodput's tail starts from it); heartbeats past it count over it."""

    def final_step(beats: list[dict[str, Any]]) -> Any:
        backend.statuses.pop(0, None)  # the attempt runs until the ranks have reported
        job = make_job()
        supervise(job["id"], force_launch=True)
        resumed = [{"key": f"run:r{r}", "type": "running", "rank": r, "step": 200} for r in range(2)]
        assert admin.post(f"/v1/jobs/{job['id']}/events", json={"events": resumed}).status_code == 200
        if beats:
            assert admin.post(f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": beats}).status_code == 200
        backend.statuses[0] = AttemptReading(AttemptPhase.succeeded)
        supervise(job["id"])
        items = admin.get(f"/v1/jobs/{job['id']}/events", params={"type": "succeeded"}).json()["items"]
        return items[0]["details"].get("final_step")

    assert final_step([]) == 200
    assert final_step([{"rank": 0, "step": 203}, {"rank": 1, "step": 204}]) == 204


def test_a_job_restart_launches_its_next_attempt_once_the_old_one_has_stopped(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    """The old attempt's teardown is asked for, not waited on (a pass goes on with other jobs meanwhile); a later
    pass launches the new attempt once the backend says the old one is gone, so two never run at once."""
    job = make_job(resiliency={"max_job_restarts": 1, "max_in_job_restarts": 0})
    supervise(job["id"], force_launch=True)
    backend.stopping.add(0)
    backend.statuses[0] = AttemptReading(AttemptPhase.failed, cause=Cause(CauseClass.crash, "exit code 1"))
    supervise(job["id"])
    supervise(job["id"])
    detail = admin.get(f"/v1/jobs/{job['id']}").json()
    assert detail["attempt"] == 1 and detail["attempts"][1]["status"] == "PENDING"
    assert backend.cancels == [0] and [r.attempt for r in backend.launches] == [0]
    backend.stopping.clear()
    supervise(job["id"])
    assert [r.attempt for r in backend.launches] == [0, 1]
    assert admin.get(f"/v1/jobs/{job['id']}").json()["attempts"][1]["status"] == "RUNNING"


def test_failure_climbs_to_job_restart_excluding_the_node_then_budget_ends_it(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job = make_job(resiliency={"max_job_restarts": 1, "max_in_job_restarts": 2})
    supervise(job["id"], force_launch=True)
    backend.statuses[0] = AttemptReading(
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
    seen = event_types(admin, job["id"])
    for expected in ("rank_failed", "injob_restart", "node_excluded", "job_restart", "submitted"):
        assert expected in seen
    assert seen.count("injob_restart") == 2
    restart = [e for e in admin.get(f"/v1/jobs/{job['id']}/events").json()["items"] if e["type"] == "job_restart"][0]
    assert restart["attempt"] == 1 and "OOMKilled" in restart["details"]["cause"]

    admin.post(f"/v1/jobs/{job['id']}/heartbeats", json={"attempt": 1, "heartbeats": [{"rank": 0, "step": 5}]})
    backend.statuses[1] = AttemptReading(AttemptPhase.failed, cause=EXIT_1)
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
        backend.statuses[attempt] = AttemptReading(AttemptPhase.failed, cause=EXIT_1)
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
        backend.statuses[attempt] = AttemptReading(AttemptPhase.failed, cause=EXIT_1)
        supervise(job["id"])
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["status"] == "RECOVERING" and body["attempt"] == 4
