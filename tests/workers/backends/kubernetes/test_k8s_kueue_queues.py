"""Kueue's queues as they stand (finding 6) and its served API versions (finding 16).

Kueue admits a Workload only when its ClusterQueue covers every resource the pods request (EFA devices and huge
pages included) within quota; nothing ftplane shipped such a queue, so the examples never ran, and no timeout ran
while queued. deploy/eks/kueue ships ResourceFlavor, ClusterQueue and LocalQueue covering what the examples
request; a Workload its queue can never admit is reported with Kueue's words, and `resiliency.queued_timeout_s`
ends a job that waits too long. The Workload API version is discovered: v1beta1, v1beta2 (Kueue 0.15+)."""

from __future__ import annotations

from datetime import timedelta

import yaml

from api.schemas.spec import JobSpec
from tests.fake_kubernetes import FakeKube
from tests.support.paths import REPO
from tests.support.supervision import supervise
from tests.workers.backends.kubernetes.k8s_support import (
    JOB_ID,
    NS,
    events_of,
    job_detail,
    make_request,
    make_spec,
    submit,
)
from workers.backends.base import AttemptPhase
from workers.backends.kubernetes import manifests as m

QUEUES = REPO / "deploy/eks/kueue"
PLURALS = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues"}


def shipped_queues(fake: FakeKube, *, without: str | None = None) -> None:
    """deploy/eks/kueue's objects in the fake cluster (optionally with one resource left out of the queue)."""
    for path in ("resource-flavor.yaml", "cluster-queue.yaml", "local-queue.yaml"):
        obj = yaml.safe_load((QUEUES / path).read_text())
        if without and obj["kind"] == "ClusterQueue":
            for group in obj["spec"]["resourceGroups"]:
                group["coveredResources"].remove(without)
                for flavor in group["flavors"]:
                    flavor["resources"] = [r for r in flavor["resources"] if r["name"] != without]
        fake.create(PLURALS[obj["kind"]], obj["metadata"].get("namespace", ""), obj)


def queued_example() -> JobSpec:
    return JobSpec.model_validate(yaml.safe_load((REPO / "examples/eks-llama-queued.yaml").read_text()))


def test_the_shipped_queue_admits_the_queued_example(fake, backend):
    shipped_queues(fake)
    spec = queued_example()
    backend.launch(make_request(spec))
    job = fake.get("jobs", NS, m.attempt_name(JOB_ID, spec.name, 0))
    assert job["spec"].get("suspend") is False  # admitted by Kueue, resumed
    assert len(fake.pods(job["metadata"]["name"], NS)) == 3  # 2 nodes and a spare
    workload = fake.list("workloads", NS)[0]
    assert workload["status"]["admission"]["clusterQueue"] == "training"


def test_a_queue_that_does_not_cover_efa_never_admits_and_says_why(fake, backend):
    shipped_queues(fake, without="vpc.amazonaws.com/efa")
    spec = queued_example()
    backend.launch(make_request(spec))
    status = backend.status(JOB_ID, 0, spec)
    assert status.phase == AttemptPhase.pending
    assert "resource vpc.amazonaws.com/efa unavailable in ClusterQueue" in status.cause.message
    (never,) = [e for e in status.events if e.details.get("inadmissible")]
    assert never.type == "queued" and never.details["queue_state"] == "waiting"
    assert "cannot admit it as it stands" in never.details["cause"] and never.details["kueue_reason"] == "Pending"


def test_a_request_beyond_the_queues_quota_is_inadmissible_too(fake, backend):
    shipped_queues(fake)
    spec = make_spec(queue="pretraining", nodes=9)  # 72 GPUs over a 64-GPU quota
    backend.launch(make_request(spec))
    status = backend.status(JOB_ID, 0, spec)
    assert "insufficient quota for nvidia.com/gpu in flavor p5, request > maximum capacity (72 > 64)" in (
        status.cause.message
    )
    assert [e for e in status.events if e.details.get("inadmissible")]


def test_the_workload_api_version_is_discovered(fake, backend):
    fake.kueue_versions = ("v1beta2",)  # a Kueue that no longer serves v1beta1
    spec = make_spec(queue="team-a")
    backend.launch(make_request(spec))
    status = backend.status(JOB_ID, 0, spec)
    assert status.phase == AttemptPhase.pending and "no Kueue" not in status.cause.message
    assert status.cause.message.startswith("queued in LocalQueue team-a: couldn't assign flavors")
    reads = [r.path for r in fake.requests if r.path.endswith("/workloads")]
    assert reads and all("/kueue.x-k8s.io/v1beta2/" in p for p in reads)


def test_a_404_on_the_workloads_is_not_kueue_missing(fake, backend):
    spec = make_spec(queue="team-a")
    backend.launch(make_request(spec))
    fake.fail("GET", r"/workloads$", 404, times=10)
    status = backend.status(JOB_ID, 0, spec)
    assert status.phase == AttemptPhase.pending and "no Kueue" not in status.cause.message
    assert "status unknown" in status.cause.message


def test_queued_timeout_ends_a_job_that_waits_too_long(admin, fake, supervised):
    from api.core.db import session_scope
    from api.database.tables import Attempt

    shipped_queues(fake, without="vpc.amazonaws.com/efa")
    body = {"queue": "pretraining", "resiliency": {"queued_timeout_s": 1800, "max_job_restarts": 3}}
    job_id, spec = submit(admin, **body)
    supervise()
    assert job_detail(admin, job_id)["status"] == "SUBMITTED"
    with session_scope() as session:  # half an hour and a minute in the queue
        row = session.query(Attempt).filter_by(job_id=job_id, number=0).one()
        row.launched_at = row.launched_at - timedelta(seconds=1860)
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["status"] == "FAILED" and detail["job_restarts"] == 0  # a restart would queue the same way
    (failed,) = events_of(admin, job_id, "scheduling_failed")
    assert failed["details"]["reason"] == "QueuedTimeout"
    assert "resource vpc.amazonaws.com/efa unavailable in ClusterQueue" in failed["details"]["cause"]
    refused = admin.post("/v1/jobs", json={**spec.model_dump(mode="json", exclude_defaults=True), "queue": None})
    assert refused.status_code == 422 and "resiliency.queued_timeout_s needs queue" in refused.text
