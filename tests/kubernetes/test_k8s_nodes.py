"""Node health against the fake API: a node NotReady is noticed within its pods' 30 s toleration (not the
default 300 s), from the Node's conditions even when the pods would wait longer, and an EKS node-monitoring
condition blames the node at once; Node objects are read label-selected, from the API server's cache, at a
bounded rate; blamed nodes are cordoned or tainted only when so configured."""

from __future__ import annotations

import re

from api.schemas.causes import CauseClass
from tests.kubernetes.conftest import backend_for
from tests.kubernetes.k8s_support import JOB_ID, NS, SPEC, make_request, make_spec, running_attempt
from workers.backends.base import AttemptPhase
from workers.backends.kubernetes import manifests as m
from workers.backends.kubernetes import nodes


def condition(obj, kind):
    return next((c for c in obj["status"].get("conditions") or [] if c["type"] == kind), None)


def test_a_lost_nodes_pods_terminate_after_30_s_and_the_node_is_blamed(fake):
    backend = backend_for(fake, node_refresh_s=0.0)
    name = running_attempt(fake, backend)
    lost = fake.pod(name, NS, 1)["spec"]["nodeName"]
    fake.not_ready(lost)  # unreachable: the kubelet stopped reporting
    pod = fake.pod(name, NS, 1)
    assert condition(pod, "Ready")["status"] == "False" and not pod["metadata"].get("deletionTimestamp")
    assert backend.status(JOB_ID, 0, SPEC).phase == AttemptPhase.running  # within the grace: may be a blip

    fake.advance(29)
    assert not fake.pod(name, NS, 1)["metadata"].get("deletionTimestamp")
    fake.advance(2)  # past the 30 s toleration (the cluster's default would be 300 s)
    pod = fake.pod(name, NS, 1)
    assert pod["metadata"]["deletionTimestamp"] and pod["status"]["phase"] == "Running"  # Terminating
    assert condition(pod, "DisruptionTarget")["reason"] == "DeletionByTaintManager"
    assert fake.pod(name, NS, 0)["metadata"].get("deletionTimestamp") is None  # the healthy node's pod stays

    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed and status.failed_nodes == (lost,)
    assert status.cause.cause_class == CauseClass.node and f"node {lost}" in status.cause.message
    assert [e.node for e in status.events if e.type == "node_failed"] == [lost]


def test_node_conditions_blame_a_not_ready_node_even_when_its_pods_would_wait(fake):
    # the spec tolerates not-ready nodes for 10 minutes: its pods are not evicted, the Node still says it all
    patient = {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "toleration_seconds": 600,
    }
    spec = make_spec(scheduling={"tolerations": [patient]})
    backend = backend_for(fake, node_refresh_s=0.0)
    name = running_attempt(fake, backend, spec=spec)
    sick = fake.pod(name, NS, 0)["spec"]["nodeName"]
    fake.not_ready(sick, unreachable=False)
    fake.advance(31)
    assert not fake.pod(name, NS, 0)["metadata"].get("deletionTimestamp")
    status = backend.status(JOB_ID, 0, spec)
    assert status.phase == AttemptPhase.failed and status.failed_nodes == (sick,)
    assert status.cause.facts["reason"] == "NodeNotReady"
    said = rf"node {sick} has been NotReady for 3[12] s \(KubeletNotReady: container runtime is down\)"
    assert re.fullmatch(said, status.cause.message), status.cause.message  # times are kept to the second


def test_an_eks_health_condition_blames_the_node_at_once(fake):
    backend = backend_for(fake, node_refresh_s=0.0)
    name = running_attempt(fake, backend)
    sick = fake.pod(name, NS, 1)["spec"]["nodeName"]
    fake.set_condition(sick, "AcceleratedHardwareReady", "False", "NvidiaXID79Error", "GPU has fallen off the bus")
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed and status.failed_nodes == (sick,)
    assert status.cause.message == (
        f"node {sick} is unhealthy: AcceleratedHardwareReady is False (NvidiaXID79Error): GPU has fallen off the bus"
    )
    (event,) = [e for e in status.events if e.type == "node_unhealthy"]
    assert event.node == sick and event.details["condition"] == "AcceleratedHardwareReady"


def test_nodes_are_read_label_selected_a_page_at_a_time_at_a_bounded_rate(fake):
    backend = backend_for(fake, node_refresh_s=20.0)
    backend.node_health.page = 3  # 8 nodes: pages of 3, 3 and 2
    clock = [0.0]
    backend.node_health._clock = lambda: clock[0]
    spec = make_spec(scheduling={"node_selector": {"node.kubernetes.io/instance-type": "p5.48xlarge"}})
    name = running_attempt(fake, backend, spec=spec)

    def reads() -> list:
        return [r for r in fake.requests if r.path == "/api/v1/nodes"]

    for second in (0.0, 5.0, 10.0):
        clock[0] = second
        assert backend.status(JOB_ID, 0, spec).phase == AttemptPhase.running
    assert len(reads()) == 1  # one page for three passes
    assert reads()[0].query["labelSelector"] == ["node.kubernetes.io/instance-type=p5.48xlarge"]
    assert reads()[0].query["limit"] == ["3"] and "continue" not in reads()[0].query
    for second in (20.0, 40.0):
        clock[0] = second
        backend.status(JOB_ID, 0, spec)
    pages = reads()
    assert len(pages) == 3 and all(r.query.get("continue") for r in pages[1:])  # round-robin with the token
    (known,) = backend.node_health._selected.values()
    assert sorted(known.states) == fake.nodes and known.token is None  # a full round: every node read once

    # a pod that looks lost makes the next pass read its node, by name (at most every 2 s), not every node
    suspect = fake.pod(name, NS, 0)["spec"]["nodeName"]
    fake.not_ready(suspect)
    for second, expected in ((41.0, 1), (42.0, 1), (43.5, 2)):
        clock[0] = second
        backend.status(JOB_ID, 0, spec)
        assert len([r for r in fake.requests if r.path == f"/api/v1/nodes/{suspect}"]) == expected, second
    assert len(reads()) == 3


def test_blamed_nodes_are_tainted_or_cordoned_only_when_configured(fake):
    blamed = fake.nodes[0]
    off = backend_for(fake)
    off.launch(make_request(attempt=1, excluded=(blamed,)))
    assert not [r for r in fake.requests if r.path.startswith("/api/v1/nodes/")]

    taint = backend_for(fake, unhealthy_nodes="taint")
    taint.launch(make_request(attempt=2, excluded=(blamed,)))
    taint.launch(make_request(attempt=3, excluded=(blamed,)))  # idempotent: tainted once
    taints = [t for t in fake.node(blamed)["spec"]["taints"] if t["key"] == nodes.UNHEALTHY_TAINT]
    assert taints == [{"key": "ftplane.dev/unhealthy", "value": "true", "effect": "NoSchedule"}]
    assert len([r for r in fake.requests if r.method == "PATCH" and r.path.endswith(f"/nodes/{blamed}")]) == 1

    other = fake.nodes[1]
    cordon = backend_for(fake, unhealthy_nodes="cordon")
    cordon.launch(make_request(attempt=4, excluded=(other,)))
    assert fake.node(other)["spec"]["unschedulable"] is True
    # another job's pods keep off both
    other_job = make_request(job_id="another-job")
    off.launch(other_job)
    placed = fake.schedule(m.attempt_name("another-job", SPEC.name, 0), NS)
    assert len(placed) == 2 and blamed not in placed and other not in placed
