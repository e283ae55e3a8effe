"""An attempt's status through its life (pending to succeeded, and each way it fails), read by the backend
through the real `kubernetes` client from the fake API server."""

from __future__ import annotations

import time

from api.schemas.causes import Cause, CauseClass
from tests.workers.backends.kubernetes.k8s_support import (
    A0,
    A1,
    JOB_ID,
    NS,
    SPEC,
    backend_for,
    make_request,
    make_spec,
    objects_of,
    running_attempt,
)
from workers.backends.base import AttemptPhase
from workers.backends.kubernetes import manifests as m


def test_pending_scheduled_running_succeeded(fake, backend):
    backend.launch(make_request())
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.pending
    assert status.cause is not None and "waiting for the scheduler (0/2" in status.cause.message
    assert status.cause.cause_class == CauseClass.scheduling

    nodes = fake.schedule(A0, NS)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.pending
    assert [e.type for e in status.events] == ["scheduled"]
    assert status.events[0].details["nodes"] == sorted(nodes)

    fake.run(A0, NS)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.running and status.cause is None
    assert [e.type for e in status.events] == ["scheduled", "running"]
    uid = fake.get("jobs", NS, A0)["metadata"]["uid"]
    assert [e.key for e in status.events] == [f"k8s:{uid}:scheduled", f"k8s:{uid}:running"]
    # a steady running attempt costs one read (its Job): its pods come from the watch, no Event is listed
    before = len(fake.requests)
    again = backend.status(JOB_ID, 0, SPEC)
    assert [e.key for e in again.events] == [e.key for e in status.events]  # idempotent keys
    assert [r.path.rsplit("/", 1)[-1] for r in fake.requests[before:]] == [A0]

    fake.succeed(A0, NS)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.succeeded
    assert status.failed_nodes == ()


def test_in_pod_failure_reports_exit_code_and_node(fake, backend):
    running_attempt(fake, backend)
    node = fake.pod(A0, NS, 1)["spec"]["nodeName"]
    fake.exit(A0, NS, 1, 1)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert status.cause.message == f"exit code 1 on node {node}"
    assert status.cause.cause_class == CauseClass.crash
    assert status.cause.facts == {"node": node, "reason": "Error", "exit_code": 1}
    assert status.failed_nodes == ()  # a crashing program is not the node's fault
    (event,) = [e for e in status.events if e.type == "rank_failed"]
    assert event.node == node and event.details["exit_code"] == 1 and event.details["node_rank"] == 1
    # the event carries the structured cause (as `Cause.details()` writes it) and what it always did
    assert event.details["cause"] == status.cause.message and event.details["cause_class"] == "crash"
    assert event.details["reason"] == "Error" and event.details["node"] == node
    assert event.details["pod"] == fake.pod(A0, NS, 1)["metadata"]["name"]
    assert Cause.of(event.details) == status.cause
    assert event.key.startswith("k8s:") and event.key.endswith(":Error")
    # the Job controller stopped the other pod; that is collateral, not a second cause
    assert [p["metadata"]["labels"][m.COMPLETION_INDEX_LABEL] for p in fake.pods(A0, NS)] == ["1"]
    assert backend.status(JOB_ID, 0, SPEC).cause == status.cause


def test_oom_killed(fake, backend):
    running_attempt(fake, backend)
    node = fake.pod(A0, NS, 0)["spec"]["nodeName"]
    fake.oom(A0, NS, 0)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert status.cause.message == f"exit code 137 (OOMKilled) on node {node}"
    assert status.cause.cause_class == CauseClass.crash
    assert status.cause.facts["exit_code"] == 137 and status.cause.facts["signal"] == "SIGKILL"
    assert status.cause.facts["reason"] == "OOMKilled"
    assert status.failed_nodes == ()


def test_eviction_blames_the_node(fake, backend):
    running_attempt(fake, backend)
    node = fake.pod(A0, NS, 1)["spec"]["nodeName"]
    fake.evict(A0, NS, 1)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert status.cause.message.startswith(f"pod evicted on node {node}: The node was low on resource: memory")
    assert status.cause.cause_class == CauseClass.preempted
    assert status.failed_nodes == (node,)  # the kubelet evicted it for the node's own pressure
    (event,) = [e for e in status.events if e.type in ("preempted", "node_failed", "rank_failed")]
    assert event.type == "preempted" and event.node == node


def test_node_loss_then_job_restart_excludes_the_node(fake, backend):
    running_attempt(fake, backend)
    lost = fake.pod(A0, NS, 1)["spec"]["nodeName"]
    fake.lose_node(lost)

    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert status.failed_nodes == (lost,)
    assert f"node {lost} lost (NodeNotReady)" in status.cause.message
    assert status.cause.cause_class == CauseClass.node and status.cause.facts["node"] == lost
    (event,) = [e for e in status.events if e.type == "node_failed"]
    assert event.node == lost and event.details["node_rank"] == 1
    assert event.details["cause_class"] == "node" and event.details["reason"] == "NodeLost"

    # what the supervisor does for a job-level restart: cancel, then launch attempt + 1 without the node
    backend.cancel(JOB_ID, 0, SPEC)
    backend.launch(make_request(attempt=1, excluded=status.failed_nodes))
    job = fake.get("jobs", NS, A1)
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    not_in = {"key": "metadata.name", "operator": "NotIn", "values": [lost]}
    assert terms == [{"matchFields": [not_in]}]
    fake.ready(lost)  # even back, the node is not used again
    placed = fake.schedule(A1, NS)
    assert lost not in placed and len(placed) == 2
    fake.run(A1, NS)
    assert backend.status(JOB_ID, 1, SPEC).phase == AttemptPhase.running
    assert objects_of(fake, A0) == []
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["FTPLANE_ATTEMPT"] == "1"


def test_spent_budget_attempt_reports_failure_and_nothing_is_relaunched(fake, backend):
    spec = make_spec(resiliency={"max_job_restarts": 1})
    running_attempt(fake, backend, spec=spec)
    fake.exit(A0, NS, 0, 1)
    assert backend.status(JOB_ID, 0, spec).phase == AttemptPhase.failed
    backend.cancel(JOB_ID, 0, spec)
    running_attempt(fake, backend, attempt=1, spec=spec)
    node = fake.pod(A1, NS, 1)["spec"]["nodeName"]
    fake.exit(A1, NS, 1, 3)
    final = backend.status(JOB_ID, 1, spec)
    # the budget decision is the supervisor's; the backend says what happened, and launches nothing itself
    assert final.phase == AttemptPhase.failed
    assert final.cause.message == f"exit code 3 on node {node}"
    assert final.cause.cause_class == CauseClass.crash
    assert not any(name.endswith("-a2") for (_, _, name) in fake.objects)
    assert final.phase == backend.status(JOB_ID, 1, spec).phase


def test_pod_deleted_by_someone_fails_the_attempt_without_blaming_the_node(fake, backend):
    running_attempt(fake, backend)
    pod = fake.pod(A0, NS, 0)
    fake.delete("pods", NS, pod["metadata"]["name"])
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert status.failed_nodes == ()
    assert (
        status.cause.message
        == f"pod {pod['metadata']['name']} on node {pod['spec']['nodeName']} was deleted before it finished"
    )
    assert status.cause.cause_class == CauseClass.other and status.cause.facts["reason"] == "Deleted"


def test_image_pull_errors_pending_then_failed(fake, request):
    clock = [time.time()]
    backend = backend_for(fake, image_pull_grace_s=300, clock=lambda: clock[0])
    request.addfinalizer(backend.close)
    backend.launch(make_request())
    fake.schedule(A0, NS)
    fake.image_pull_error(A0, NS)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.pending
    assert status.cause.message.startswith(f"image {SPEC.image} cannot be pulled (ImagePullBackOff)")
    assert status.cause.cause_class == CauseClass.scheduling
    clock[0] = time.time() + 301  # from now: the pod was bound (the grace's start) before it, however slow the set-up
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert "still failing after 30" in status.cause.message
    assert status.cause.cause_class == CauseClass.scheduling and status.cause.facts["reason"] == "ImagePullBackOff"


def test_invalid_image_fails_at_once(fake, backend):
    backend.launch(make_request())
    fake.schedule(A0, NS)
    fake.image_pull_error(A0, NS, reason="InvalidImageName")
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert "(InvalidImageName)" in status.cause.message
    assert status.cause.cause_class == CauseClass.scheduling


def test_unschedulable_is_pending_with_the_schedulers_words(fake, backend):
    for node in fake.nodes[1:]:
        fake.delete("nodes", "", node)
    backend.launch(make_request())
    fake.schedule(A0, NS)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.pending
    assert status.cause.message.startswith("waiting for nodes (0/2 pods running): 0/1 nodes are available: ")
    assert "1 Insufficient nvidia.com/gpu" in status.cause.message
    assert status.cause.cause_class == CauseClass.scheduling and status.cause.facts["reason"] == "Unschedulable"


def test_missing_attempt(backend):
    status = backend.status(JOB_ID, 7, SPEC)
    assert status.phase == AttemptPhase.missing
    assert "no Job" in status.cause.message


def test_a_lost_node_is_the_cause_even_when_a_rank_elsewhere_failed_first(fake, backend):
    running_attempt(fake, backend)
    sick = fake.pod(A0, NS, 1)
    fake.not_ready(sick["spec"]["nodeName"])  # its kubelet stops reporting: the node controller's NodeNotReady
    fake.exit(A0, NS, 0, 1)  # rank 0's node sees its peers vanish and fails; the Job terminates pod 1 (in vain)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert status.failed_nodes == (sick["spec"]["nodeName"],)
    assert status.cause.message.startswith(f"node {sick['spec']['nodeName']} lost (NodeNotReady)")
    assert status.cause.cause_class == CauseClass.node
    assert sorted(e.type for e in status.events if e.type.endswith("_failed")) == [
        "node_failed",
        "rank_failed",
    ]
