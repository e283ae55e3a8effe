"""The launch duty hands the fleet's quarantined nodes to the backend; one that cannot avoid them (local: every
node runs on this machine) launches anyway and says so in the attempt's `submitted` event."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from fastapi.testclient import TestClient

from api.core.db import session_scope
from api.schemas.spec import JobSpec
from api.services.node_reputation import ledger
from tests.support.supervision import ScriptedBackend, supervise


@dataclass
class OnThisHost(ScriptedBackend):
    """A backend that cannot move jobs off its nodes, which are named as the local backend names them."""

    can_exclude_nodes: bool = False

    @dataclass(frozen=True)
    class Node:
        name: str

    def nodes(self, job_id: str, attempt: int, spec: JobSpec) -> list[OnThisHost.Node]:
        return [self.Node(f"Host-n{i}") for i in range(spec.nodes)]


def quarantine(admin: TestClient, make_job: Any, node: str) -> None:
    for name in ("first", "second"):
        job = make_job(name=name)
        body = {"events": [{"key": uuid.uuid4().hex, "type": "node_failed", "node": node, "attempt": 0}]}
        assert admin.post(f"/v1/jobs/{job['id']}/events", json=body).status_code == 200
    with session_scope() as session:
        ledger.run_once(session)
    assert admin.get(f"/v1/nodes/{node}").json()["state"] == "quarantined"


def submitted(admin: TestClient, job_id: str) -> dict[str, Any]:
    (event,) = admin.get(f"/v1/jobs/{job_id}/events", params={"type": "submitted"}).json()["items"]
    return dict(event)


def test_a_backend_that_can_avoid_them_gets_them_and_says_nothing(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    quarantine(admin, make_job, "ip-10-0-3-7")
    job = make_job(name="later")
    supervise(job["id"], force_launch=True)
    assert backend.launches[-1].quarantined_nodes == ("ip-10-0-3-7",)
    assert "note" not in submitted(admin, job["id"])["details"]


def test_the_local_backend_cannot_avoid_its_own_node_and_says_so(
    admin: TestClient, make_job: Any, monkeypatch: Any, app: Any
) -> None:
    from tests.support.supervision import use_backend

    local = OnThisHost()
    use_backend(monkeypatch, local)
    quarantine(admin, make_job, "host-n1")
    quarantine(admin, make_job, "elsewhere-n0")  # another machine's: not one this job runs on
    job = make_job(name="later", nodes=2)
    supervise(job["id"], force_launch=True)
    assert local.launches[-1].quarantined_nodes == ("elsewhere-n0", "host-n1")
    note = submitted(admin, job["id"])["details"]["note"]
    assert "cannot avoid the quarantined node(s) host-n1:" in note and "elsewhere" not in note
    single = make_job(name="single", nodes=1)  # runs on host-n0 only
    supervise(single["id"], force_launch=True)
    assert "note" not in submitted(admin, single["id"])["details"]
