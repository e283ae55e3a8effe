"""Why an attempt does not start, against the fake API's scheduler and kubelets: the scheduler's own words for taints,
selectors, resources and exclusions; a volume that cannot be mounted (FailedMount); a Secret that is not there
(CreateContainerConfigError). Past resiliency.pending_timeout_s the partial attempt is torn down, freeing what it
held, before the next one (or for good, when the spec says fail)."""

from __future__ import annotations

from datetime import timedelta

from api.schemas.causes import CauseClass
from tests.support.supervision import supervise
from tests.workers.backends.kubernetes.conftest import backend_for
from tests.workers.backends.kubernetes.k8s_support import (
    JOB_ID,
    NS,
    SPEC,
    events_of,
    job_detail,
    make_request,
    make_spec,
    submit,
)
from workers.backends.base import AttemptPhase
from workers.backends.kubernetes import manifests as m

A0 = m.attempt_name(JOB_ID, SPEC.name, 0)
DEDICATED = {"key": "dedicated", "value": "p5", "effect": "NoSchedule"}


def only_nodes(fake, *specs: dict) -> None:
    for node in fake.nodes:
        fake.delete("nodes", "", node)
    for i, options in enumerate(specs):
        fake.add_node(f"ip-10-0-9-{i}", **options)


def pending_cause(fake, backend, spec=SPEC) -> str:
    fake.schedule(m.attempt_name(JOB_ID, spec.name, 0), NS)
    status = backend.status(JOB_ID, 0, spec)
    assert status.phase == AttemptPhase.pending and status.cause.cause_class == CauseClass.scheduling
    return str(status.cause.message)


def test_a_taint_the_pods_do_not_tolerate(fake, backend):
    only_nodes(fake, {"taints": [DEDICATED]}, {"taints": [DEDICATED]})
    backend.launch(make_request())
    assert pending_cause(fake, backend).endswith(
        "0/2 nodes are available: 2 node(s) had untolerated taint {dedicated: p5}. preemption: 0/2 nodes are "
        "available: 2 Preemption is not helpful for scheduling."
    )
    tolerant = make_spec(scheduling={"tolerations": [DEDICATED]})
    backend.launch(make_request(tolerant, job_id="tolerant"))
    assert len(fake.schedule(m.attempt_name("tolerant", tolerant.name, 0), NS)) == 2


def test_a_node_selector_no_node_matches(fake, backend):
    spec = make_spec(scheduling={"node_selector": {"node.kubernetes.io/instance-type": "p4de.24xlarge"}})
    backend.launch(make_request(spec))
    assert "8 node(s) didn't match Pod's node affinity/selector" in pending_cause(fake, backend, spec)


def test_nodes_without_efa_leave_an_efa_job_pending_with_the_reason(fake, backend):
    # what a GPU node group looks like when its EFA device plugin cannot run there (it did not tolerate the taint)
    no_efa = {"allocatable": {"cpu": "190", "memory": "1900Gi", "pods": "110", "nvidia.com/gpu": "8"}}
    only_nodes(fake, no_efa, no_efa)
    backend.launch(make_request())
    assert "2 Insufficient vpc.amazonaws.com/efa" in pending_cause(fake, backend)


def test_exclusions_that_leave_too_few_nodes_are_named(fake, backend):
    only_nodes(fake, {}, {})
    backend.launch(make_request(excluded=("ip-10-0-9-1",)))
    cause = pending_cause(fake, backend)
    assert "1 node(s) didn't match Pod's node affinity/selector" in cause
    assert "1 node(s) are excluded after failures of this job (ip-10-0-9-1)" in cause
    assert "the attempt stays pending until resiliency.pending_timeout_s ends it" in cause


def test_a_volume_that_cannot_be_mounted(fake, backend):
    backend.launch(make_request())
    fake.schedule(A0, NS)
    fake.mount_failure(A0, NS)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.pending and status.cause.facts["reason"] == "FailedMount"
    assert status.cause.message.startswith("a volume cannot be mounted on node ip-10-0-1-")
    assert "(FailedMount), 0/2 pods running: MountVolume.SetUp failed for volume" in status.cause.message
    assert "mount failed: exit status 5" in status.cause.message
    # the Events read were the Job's and its pods', by field selector: never the namespace's
    listed = [r for r in fake.requests if r.path.endswith("/events")]
    assert listed and all(r.query.get("fieldSelector") for r in listed)
    pods = [r for r in fake.requests if r.method == "GET" and r.path.endswith("/pods")]
    assert pods and all(r.query.get("labelSelector") for r in pods)  # listed a page at a time, then watched
    assert {r.query["fieldSelector"][0].split(",")[0] for r in listed} == {
        "involvedObject.kind=Job",
        "involvedObject.kind=Pod",
    }


def test_a_missing_secret_is_pending_then_failed(fake):
    clock = [0.0]
    backend = backend_for(fake)
    backend._clock = lambda: fake.now().timestamp() + clock[0]
    spec = make_spec(secret_env={"HF_TOKEN": {"secret": "huggingface-token", "key": "token"}})
    backend.launch(make_request(spec))
    fake.schedule(A0, NS)
    fake.config_error(A0, NS, 'secret "huggingface-token" not found')
    status = backend.status(JOB_ID, 0, spec)
    assert status.phase == AttemptPhase.pending
    assert '(CreateContainerConfigError): secret "huggingface-token" not found; Kubernetes keeps retrying' in (
        status.cause.message
    )
    clock[0] = 301
    status = backend.status(JOB_ID, 0, spec)
    assert status.phase == AttemptPhase.failed and "still failing after 30" in status.cause.message


def pending_too_long(job_id: str, number: int) -> None:
    from api.core.db import session_scope
    from api.database.tables import Attempt

    with session_scope() as session:
        row = session.query(Attempt).filter_by(job_id=job_id, number=number).one()
        row.launched_at = row.launched_at - timedelta(seconds=601)


def test_past_the_pending_timeout_the_partial_attempt_is_torn_down(admin, fake, supervised):
    only_nodes(fake, {})  # one node: one pod binds (and holds its GPUs), the other waits
    job_id, spec = submit(admin, resiliency={"pending_timeout_s": 600, "max_job_restarts": 1})
    a0 = m.attempt_name(job_id, spec.name, 0)
    assert len(fake.schedule(a0, NS)) == 1
    supervise()
    pending_too_long(job_id, 0)
    supervise()
    (failed,) = events_of(admin, job_id, "scheduling_failed")
    assert "0/1 nodes are available" in failed["details"]["cause"]
    supervise()  # the launch duty tears attempt 0 down before it launches attempt 1
    assert fake.get("jobs", NS, a0) is None and not [k for k in fake.objects if k[0] == "pods" and a0 in k[2]]
    a1 = m.attempt_name(job_id, spec.name, 1)
    assert len(fake.schedule(a1, NS)) == 1  # the node the partial attempt held is free again


def test_on_pending_timeout_fail_ends_the_job_and_frees_the_nodes(admin, fake, supervised):
    only_nodes(fake, {})
    job_id, spec = submit(admin, resiliency={"pending_timeout_s": 600, "on_pending_timeout": "fail"})
    a0 = m.attempt_name(job_id, spec.name, 0)
    fake.schedule(a0, NS)
    supervise()
    pending_too_long(job_id, 0)
    supervise()
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["status"] == "FAILED" and detail["attempt"] == 0
    assert fake.get("jobs", NS, a0) is None  # the release duty tore it down
