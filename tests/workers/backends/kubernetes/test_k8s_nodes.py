"""Node health against the fake API: a node NotReady or unreachable is waited out for as long as the pods tolerate
it, Kubernetes' 300 s or the spec's own toleration seconds (finding 11: a kubelet silent for 30 s failed the attempt
though its containers kept training), then blamed, from the Node's conditions even when the pods would wait for
ever, and an EKS node-monitoring
condition blames the node at once; Node objects are read label-selected, from the API server's cache, at a
bounded rate; blamed nodes are cordoned or tainted only when so configured."""

from __future__ import annotations

import re

from api.schemas.causes import CauseClass
from tests.workers.backends.kubernetes.conftest import backend_for
from tests.workers.backends.kubernetes.k8s_support import JOB_ID, NS, SPEC, make_request, make_spec, running_attempt
from workers.backends.base import AttemptPhase
from workers.backends.kubernetes import manifests as m
from workers.backends.kubernetes import nodes


def condition(obj, kind):
    return next((c for c in obj["status"].get("conditions") or [] if c["type"] == kind), None)


def test_an_unreachable_kubelet_is_waited_out_for_300_s_then_its_node_is_blamed(fake):
    backend = backend_for(fake, node_refresh_s=0.0)
    name = running_attempt(fake, backend)
    lost = fake.pod(name, NS, 1)["spec"]["nodeName"]
    fake.not_ready(lost)  # unreachable: the kubelet stopped reporting
    pod = fake.pod(name, NS, 1)
    assert condition(pod, "Ready")["status"] == "False" and not pod["metadata"].get("deletionTimestamp")
    assert backend.status(JOB_ID, 0, SPEC).phase == AttemptPhase.running  # within the grace: may be a blip

    fake.advance(31)  # a kubelet silent for half a minute: its containers go on training
    assert not fake.pod(name, NS, 1)["metadata"].get("deletionTimestamp")
    assert backend.status(JOB_ID, 0, SPEC).phase == AttemptPhase.running
    fake.advance(240)  # (the fake's clock is real time too: a margin for a slow machine)
    assert not fake.pod(name, NS, 1)["metadata"].get("deletionTimestamp")
    fake.advance(30)  # past the 300 s toleration
    pod = fake.pod(name, NS, 1)
    assert pod["metadata"]["deletionTimestamp"] and pod["status"]["phase"] == "Running"  # Terminating
    assert condition(pod, "DisruptionTarget")["reason"] == "DeletionByTaintManager"
    assert fake.pod(name, NS, 0)["metadata"].get("deletionTimestamp") is None  # the healthy node's pod stays

    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed and status.failed_nodes == (lost,)
    assert status.cause.cause_class == CauseClass.node and f"node {lost}" in status.cause.message
    assert [e.node for e in status.events if e.type == "node_failed"] == [lost]


def test_node_conditions_blame_a_not_ready_node_even_when_its_pods_would_wait(fake):
    # the spec tolerates not-ready nodes for ever: its pods are never evicted, the Node still says it all at 300 s
    patient = {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}
    spec = make_spec(scheduling={"tolerations": [patient]})
    backend = backend_for(fake, node_refresh_s=0.0)
    name = running_attempt(fake, backend, spec=spec)
    sick = fake.pod(name, NS, 0)["spec"]["nodeName"]
    fake.not_ready(sick, unreachable=False)
    fake.advance(301)
    assert not fake.pod(name, NS, 0)["metadata"].get("deletionTimestamp")
    status = backend.status(JOB_ID, 0, spec)
    assert status.phase == AttemptPhase.failed and status.failed_nodes == (sick,)
    assert status.cause.facts["reason"] == "NodeNotReady"
    said = rf"node {sick} has been NotReady for 30[12] s \(KubeletNotReady: container runtime is down\)"
    assert re.fullmatch(said, status.cause.message), status.cause.message  # times are kept to the second


def test_a_spec_tolerating_600_s_has_its_not_ready_node_blamed_after_600_s_as_its_pods_are_evicted(fake):
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
    fake.advance(301)  # past Kubernetes' default: the spec's pods still tolerate it, and so does ftplane
    assert not fake.pod(name, NS, 0)["metadata"].get("deletionTimestamp")
    assert backend.status(JOB_ID, 0, spec).phase == AttemptPhase.running
    fake.advance(240)  # (a margin for a slow machine: the fake's clock is real time too)
    assert backend.status(JOB_ID, 0, spec).phase == AttemptPhase.running
    fake.advance(60)  # past the spec's 600 s
    assert fake.pod(name, NS, 0)["metadata"].get("deletionTimestamp")  # the taint manager's eviction
    status = backend.status(JOB_ID, 0, spec)
    assert status.phase == AttemptPhase.failed and status.failed_nodes == (sick,)
    assert status.cause.cause_class == CauseClass.node and f"node {sick}" in status.cause.message


def test_what_the_pods_tolerate_is_read_as_the_taint_manager_reads_it():
    not_ready = {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}
    unreachable = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
    assert nodes.tolerated_s(None, "False") == nodes.tolerated_s([], "Unknown") == 300.0
    assert nodes.tolerated_s([{**not_ready, "tolerationSeconds": 600}], "False") == 600.0
    assert nodes.tolerated_s([{**not_ready, "tolerationSeconds": 600}], "Unknown") == 300.0  # the other taint
    assert nodes.tolerated_s([{**unreachable, "tolerationSeconds": 30}], "Unknown") == 30.0
    both = [{**not_ready, "tolerationSeconds": 900}, {"operator": "Exists", "tolerationSeconds": 120}]
    assert nodes.tolerated_s(both, "False") == 120.0  # the least of those that match
    assert nodes.tolerated_s([not_ready], "False") == 300.0  # for ever: ftplane still blames at 300 s
    assert nodes.tolerated_s([{**not_ready, "effect": "NoSchedule", "tolerationSeconds": 9}], "False") == 300.0


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
    spec = make_spec(
        resources={"gpus_per_node": 8},
        scheduling={"node_selector": {"node.kubernetes.io/instance-type": "p5.48xlarge"}},
    )
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


def test_a_node_whose_agent_still_reports_is_alive(admin, fake, supervised):
    """Kubernetes lost touch with a kubelet (unreachable past 300 s), but the node's agent reports: the attempt goes
    on. Once the agent falls silent too, the node is lost."""
    from datetime import UTC, datetime, timedelta

    from api.core.db import session_scope
    from api.database.tables import NodeLiveness
    from tests.support.supervision import supervise
    from tests.workers.backends.kubernetes.k8s_support import job_detail, start_job

    job_id, spec, a0 = start_job(admin, fake)
    partitioned = fake.pod(a0, NS, 1)["spec"]["nodeName"]
    fake.not_ready(partitioned)
    fake.advance(301)

    def reported(ago_s: float) -> None:
        seen = datetime.now(UTC) - timedelta(seconds=ago_s)
        with session_scope() as session:
            session.merge(NodeLiveness(job_id=job_id, node=partitioned, attempt=0, last_seen=seen))

    reported(0.5)
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["attempt"] == 0 and detail["status"] == "RUNNING"
    assert "its node agent still reports" in detail["attempts"][0]["cause"]
    reported(60)  # silent for a minute: three report intervals are long gone
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["attempt"] == 1 and detail["excluded_nodes"] == [partitioned]
