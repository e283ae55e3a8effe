"""A node blamed by two jobs is quarantined, and every later attempt (its hot spares too) is placed elsewhere on the
fake API server, through the real kubernetes client and the supervision duties, until a release brings it back."""

from __future__ import annotations

import time
from typing import Any

from api.core.db import session_scope
from api.services.node_reputation import ledger
from tests.fake_kubernetes import FakeKube
from tests.support.supervision import supervise
from tests.workers.backends.kubernetes.k8s_support import NS, events_of, start_job, submit
from workers.backends.kubernetes import manifests as m


def judge_nodes() -> None:
    with session_scope() as session:
        ledger.run_once(session)


def not_in(fake: FakeKube, attempt: str) -> list[str]:
    """The names the attempt's pod template keeps out (`matchFields metadata.name NotIn`)."""
    job = fake.get("jobs", NS, attempt)
    assert job is not None
    affinity = job["spec"]["template"]["spec"].get("affinity") or {}
    terms = affinity.get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", {})
    fields = [f for t in terms.get("nodeSelectorTerms", []) for f in t.get("matchFields", [])]
    return [v for f in fields if f["key"] == "metadata.name" and f["operator"] == "NotIn" for v in f["values"]]


def lose(fake: FakeKube, admin: Any, job_id: str, node: str) -> None:
    """`node` goes away under the job's running attempt: reconcile records node_failed and restarts the job."""
    fake.lose_node(node)
    deadline = time.monotonic() + 60
    while not events_of(admin, job_id, "node_failed"):  # the pass that reads the loss (its pod watch may lag)
        assert time.monotonic() < deadline, f"no node_failed for job {job_id}"
        supervise()
    (failed,) = events_of(admin, job_id, "node_failed")
    assert failed["node"] == node
    fake.ready(node)


def test_a_node_two_jobs_lost_is_left_out_of_new_placements_and_spares_until_released(
    admin: Any, fake: FakeKube, supervised: Any
) -> None:
    first, spec, a0 = start_job(admin, fake)
    bad = fake.pod(a0, NS, 1)["spec"]["nodeName"]
    lose(fake, admin, first, bad)
    judge_nodes()
    assert admin.get(f"/v1/nodes/{bad}").json()["state"] == "suspect"

    second, _, b0 = start_job(admin, fake)  # the node is back and free: the scheduler's first fit takes it again
    assert bad in [p["spec"]["nodeName"] for p in fake.pods(b0, NS)]
    lose(fake, admin, second, bad)
    judge_nodes()
    node = admin.get(f"/v1/nodes/{bad}").json()
    assert node["state"] == "quarantined" and node["faults"] == {"lost": 2}

    # a new job, with a hot spare: the template every pod (spare included) is made from keeps the node out
    third, spec3 = submit(admin, resiliency={"max_job_restarts": 2, "exclude_failed_nodes": True, "spare_nodes": 1})
    c0 = m.attempt_name(third, spec3.name, 0)
    assert not_in(fake, c0) == [bad]
    placed = fake.schedule(c0, NS)
    assert len(placed) == 3 and bad not in placed
    # a job that asks for no exclusions of its own is kept off it too
    fourth, spec4 = submit(admin, resiliency={"max_job_restarts": 2, "exclude_failed_nodes": False})
    assert not_in(fake, m.attempt_name(fourth, spec4.name, 0)) == [bad]

    released = admin.post(f"/v1/nodes/{bad}/release", json={"reason": "NIC reseated"})
    assert released.status_code == 200 and released.json()["state"] == "healthy"
    for job_id in (third, fourth):
        admin.post(f"/v1/jobs/{job_id}/cancel")
    supervise()
    fifth, spec5 = submit(admin)
    e0 = m.attempt_name(fifth, spec5.name, 0)
    assert not_in(fake, e0) == []
    assert bad in fake.schedule(e0, NS)  # back in placement: the first fit takes it
