"""The failed rank's last lines in the cause of the job's end: a launcher that gave up knows only its exit status;
the rank failure its node agent reported (with the rank's tail and the exception read from it) is the cause of the
`failed` event, tail included, as the root-cause rule (ftplane/contract.py) picks it."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.schemas.causes import Cause, CauseClass
from tests.support.supervision import ScriptedBackend, supervise, use_backend
from workers.backends.base import AttemptPhase, AttemptReading

TAIL = 'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\nValueError: bad lr'


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch, app: Any) -> ScriptedBackend:
    scripted = ScriptedBackend()
    use_backend(monkeypatch, scripted)
    return scripted


def test_the_jobs_end_carries_the_root_causes_tail(admin: TestClient, make_job: Any, backend: ScriptedBackend) -> None:
    job = make_job(resiliency={"max_in_job_restarts": 0, "max_job_restarts": 0})
    supervise(job["id"], force_launch=True)
    trainer = {"Authorization": f"Bearer {backend.launches[0].token}"}
    # as the node agent reports them (failure_context.py): the rank among the facts
    raised = {"cause": "raised ValueError: bad lr (exit code 1)", "cause_class": "exception", "exit_code": 1, "rank": 1}
    collateral = {"cause": "exit code 1", "cause_class": "crash", "exit_code": 1, "rank": 0}
    failures = [
        {
            "key": "r1",
            "type": "rank_failed",
            "rank": 1,
            "details": {**raised, "exception": "ValueError: bad lr", "tail": TAIL},
        },
        {"key": "r0", "type": "rank_failed", "rank": 0, "details": collateral},
    ]
    assert admin.post(f"/v1/jobs/{job['id']}/events", json={"events": failures}, headers=trainer).status_code == 200
    exited = Cause(CauseClass.crash, "ft_launcher on node n0 exited with exit code 1", {"node": "n0", "exit_code": 1})
    backend.statuses[0] = AttemptReading(AttemptPhase.failed, cause=exited)
    supervise()
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["status"] == "FAILED" and "raised ValueError: bad lr" in body["status_reason"]
    events = admin.get(f"/v1/jobs/{job['id']}/events", params={"type": "failed"}).json()["items"]
    (failed,) = events
    details = failed["details"]
    assert details["tail"] == TAIL and details["exception"] == "ValueError: bad lr" and details["rank"] == 1
    assert details["cause_class"] == "exception" and "rank 1 raised ValueError: bad lr" in details["cause"]
