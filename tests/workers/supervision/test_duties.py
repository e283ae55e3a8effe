"""Each supervision duty on its own: a slow backend holds up only its job, hangs are found while the backend
cannot be read, pending attempts time out, and attempts move through the lifecycle's statuses."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.schemas.spec import JobSpec
from tests.support.supervision import ScriptedBackend, last_seen, supervise, use_backend
from workers.backends.base import AttemptPhase, AttemptReading


class SlowForOneJob(ScriptedBackend):
    """Blocks the status read of one job until released; answers every other job at once."""

    def __init__(self) -> None:
        super().__init__()
        self.slow_job: str | None = None
        self.release = threading.Event()
        self.unreadable = False

    def status(self, job_id: str, attempt: int, spec: JobSpec) -> AttemptReading:
        if self.unreadable:
            raise ConnectionError("cluster API unreachable")
        if job_id == self.slow_job:
            assert self.release.wait(30)
        return super().status(job_id, attempt, spec)


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch, app: Any) -> SlowForOneJob:
    scripted = SlowForOneJob()
    use_backend(monkeypatch, scripted)
    return scripted


def status_of(admin: TestClient, job_id: str) -> str:
    return str(admin.get(f"/v1/jobs/{job_id}").json()["status"])


def test_a_slow_backend_read_delays_only_its_own_job(admin: TestClient, make_job: Any, backend: SlowForOneJob) -> None:
    from api.core.db import session_scope
    from workers.supervision import reconcile_attempts

    slow, fast = make_job(), make_job()
    for job in (slow, fast):
        supervise(job["id"], force_launch=True)
    backend.slow_job = slow["id"]
    backend.statuses[0] = AttemptReading(AttemptPhase.succeeded)
    reads = reconcile_attempts.BackendReads()

    started = time.monotonic()
    with session_scope() as session:
        reconcile_attempts.run_once(session, reads, wait_s=0.5)
    assert time.monotonic() - started < 5  # the pass did not wait for the slow read
    assert status_of(admin, fast["id"]) == "SUCCEEDED"
    assert status_of(admin, slow["id"]) == "SUBMITTED"
    assert reads.pending() == {(slow["id"], 0)}

    with session_scope() as session:  # a read in flight is not started twice
        reconcile_attempts.run_once(session, reads, wait_s=0.1)
    assert reads.pending() == {(slow["id"], 0)}

    backend.release.set()
    with session_scope() as session:  # the late result is applied by a later pass
        reconcile_attempts.run_once(session, reads, wait_s=5)
    assert status_of(admin, slow["id"]) == "SUCCEEDED"
    assert reads.pending() == set()


def test_hangs_are_detected_while_the_backend_cannot_be_read(
    admin: TestClient, make_job: Any, backend: SlowForOneJob
) -> None:
    from api.schemas.events import utcnow

    job = make_job(resiliency={"heartbeat_timeout_s": 10, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    supervise()  # the backend says running: the attempt is RUNNING
    assert admin.get(f"/v1/jobs/{job['id']}").json()["attempts"][0]["status"] == "RUNNING"
    now = utcnow()
    admin.post(
        f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": [{"rank": 0, "step": 3}, {"rank": 1, "step": 3}]}
    )
    last_seen(job["id"], {1: 12}, now)
    backend.unreadable = True
    supervise()
    hangs = admin.get(f"/v1/jobs/{job['id']}/events", params={"type": "hang_detected"}).json()["items"]
    assert [(h["rank"], h["details"]["cause_class"]) for h in hangs] == [(1, "hang")]
    assert hangs[0]["details"]["silent_s"] >= 12


def test_an_attempt_pending_past_its_timeout_is_a_scheduling_failure(
    admin: TestClient, make_job: Any, backend: SlowForOneJob
) -> None:
    from api.core.db import session_scope
    from api.database.tables import Attempt
    from api.schemas.causes import Cause, CauseClass
    from api.schemas.events import utcnow

    job = make_job(resiliency={"pending_timeout_s": 60, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    waiting = Cause(CauseClass.scheduling, "0/2 nodes are available: 2 Insufficient nvidia.com/gpu")
    backend.statuses[0] = AttemptReading(AttemptPhase.pending, cause=waiting)
    backend.statuses[1] = AttemptReading(AttemptPhase.pending, cause=waiting)
    supervise()
    detail = admin.get(f"/v1/jobs/{job['id']}").json()
    assert detail["status"] == "SUBMITTED" and detail["attempts"][0]["status"] == "LAUNCHED"
    assert detail["attempts"][0]["cause"] == waiting.message  # what it waits for, shown while it waits

    def launched_long_ago(number: int) -> None:
        with session_scope() as session:
            row = session.query(Attempt).filter_by(job_id=job["id"], number=number).one()
            row.launched_at = utcnow() - timedelta(seconds=61)

    launched_long_ago(0)
    supervise()
    detail = admin.get(f"/v1/jobs/{job['id']}").json()
    assert detail["attempt"] == 1 and detail["attempts"][0]["status"] == "FAILED"
    supervise()  # the launch duty's next pass (or the task sent for it)
    assert backend.cancels == [0]  # the partial attempt was torn down before the next one launched
    assert [r.attempt for r in backend.launches] == [0, 1]
    failed = admin.get(f"/v1/jobs/{job['id']}/events", params={"type": "scheduling_failed"}).json()["items"]
    assert failed[0]["details"]["cause_class"] == "scheduling"
    assert "Insufficient nvidia.com/gpu" in failed[0]["details"]["cause"]

    launched_long_ago(1)
    supervise()
    detail = admin.get(f"/v1/jobs/{job['id']}").json()
    assert detail["status"] == "FAILED" and "pending timeout 60 s" in detail["status_reason"]
    ended = admin.get(f"/v1/jobs/{job['id']}/events", params={"type": "failed"}).json()["items"]
    assert ended[0]["details"]["cause_class"] == "scheduling"


def test_attempts_move_through_the_lifecycle_statuses(admin: TestClient, make_job: Any, backend: SlowForOneJob) -> None:
    job = make_job()

    def attempt_status() -> str:
        return str(admin.get(f"/v1/jobs/{job['id']}").json()["attempts"][0]["status"])

    assert attempt_status() == "PENDING"
    supervise(job["id"], force_launch=True)
    assert attempt_status() == "LAUNCHED"
    supervise()
    assert attempt_status() == "RUNNING"
    backend.statuses[0] = AttemptReading(AttemptPhase.succeeded)
    supervise()
    assert attempt_status() == "SUCCEEDED"


def test_a_cancelled_pending_job_ends_its_attempt_too(admin: TestClient, make_job: Any, backend: SlowForOneJob) -> None:
    job = make_job()
    admin.post(f"/v1/jobs/{job['id']}/cancel")
    detail = admin.get(f"/v1/jobs/{job['id']}").json()
    assert detail["status"] == "CANCELLED" and detail["attempts"][0]["status"] == "CANCELLED"
    supervise()
    assert backend.launches == [] and backend.released == [job["id"]]
