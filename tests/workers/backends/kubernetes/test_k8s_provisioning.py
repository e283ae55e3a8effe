"""Nodes that exist and nodes a cluster can add (finding 5): Karpenter never launched a node for ftplane's pods,
which requested hugepages-2Mi, a resource no Karpenter instance type offers; the pods waited for ever (or out
their pending timeout). The fake's Karpenter NodePools offer instance types with the capacity Karpenter computes
(no huge pages) and record Karpenter's FailedScheduling Event when none fits; a managed node group's nodes may
allocate huge pages. A job whose pods no node can ever fit fails within a minute, naming the resource."""

from __future__ import annotations

from decimal import Decimal

import yaml

from api.schemas.spec import JobSpec
from tests.fake_kubernetes import FakeKube
from tests.fake_kubernetes.provisioning import P5_CAPACITY, InstanceType
from tests.fake_kubernetes.scheduler import GPU_NODE_ALLOCATABLE
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
from workers.backends.kubernetes import pending
from workers.backends.kubernetes.nodes import NodeState

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
HUGEPAGES = {"gpus_per_node": 8, "efa_per_node": 32, "cpu": "96", "memory": "1Ti", "hugepages": {"2Mi": "5120Mi"}}


def karpenter_cluster(fake: FakeKube) -> None:
    """A system node for the control plane and a Karpenter NodePool of p5.48xlarge: no GPU node until asked."""
    for node in fake.nodes:
        fake.delete("nodes", "", node)
    fake.add_node("system-1", allocatable={"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "80Gi"})
    fake.add_node_pool("gpu", [InstanceType("p5.48xlarge", P5_CAPACITY)], taints=[GPU_TAINT])


def launched(fake: FakeKube, spec: JobSpec) -> str:
    request = make_request(spec)
    fake.create("jobs", NS, m.job_manifest(request))
    name = m.attempt_name(request.job_id, spec.name, 0)
    fake.schedule(name, NS)
    return name


def test_karpenter_launches_nodes_for_what_its_instance_types_offer(fake):
    karpenter_cluster(fake)
    name = launched(fake, make_spec())
    assert fake.schedule(name, NS) == []  # no GPU node yet
    assert len(fake.provision()) == 2
    assert all(p["spec"]["nodeName"].startswith("gpu-p5-48xlarge-") for p in fake.pods(name, NS))


def test_karpenter_offers_no_huge_pages_and_says_so_on_the_pod(fake):
    karpenter_cluster(fake)
    name = launched(fake, make_spec(resources=HUGEPAGES))
    assert fake.provision() == []
    pod = fake.pod(name, NS, 0)
    (said,) = [
        e
        for e in fake.list("events", NS)
        if e["involvedObject"]["name"] == pod["metadata"]["name"] and e["source"]["component"] == "karpenter"
    ]
    assert said["reason"] == "FailedScheduling" and said["type"] == "Warning"
    assert said["message"].startswith('Failed to schedule pod, incompatible with nodepool "gpu"')
    assert (
        '"hugepages-2Mi":"5368709120"' in said["message"] and "no instance type satisfied resources" in said["message"]
    )


def test_a_managed_node_group_with_huge_pages_takes_the_same_pods(fake):
    name = launched(fake, make_spec(resources=HUGEPAGES))  # the default nodes allocate hugepages-2Mi
    assert all(p["spec"].get("nodeName") for p in fake.pods(name, NS))


def test_a_job_no_node_can_ever_fit_fails_within_a_minute_naming_the_resource(admin, fake, supervised):
    karpenter_cluster(fake)
    job_id, spec = submit(admin, resources=HUGEPAGES, resiliency={"max_job_restarts": 3, "pending_timeout_s": 3600})
    name = m.attempt_name(job_id, spec.name, 0)
    fake.schedule(name, NS)
    fake.provision()
    supervise()
    assert job_detail(admin, job_id)["status"] == "SUBMITTED"  # Karpenter may still be catching up
    fake.advance(31)
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["status"] == "FAILED" and detail["job_restarts"] == 0  # retrying cannot help
    (failed,) = events_of(admin, job_id, "scheduling_failed")
    assert failed["details"]["reason"] == "Unsatisfiable" and failed["details"]["resources"] == ["hugepages-2Mi"]
    assert "no Karpenter instance type offers huge pages" in failed["details"]["cause"]


HUGEPAGES_NOTE = "needs a managed node group whose nodes allocate huge pages"


def test_every_kubernetes_example_gets_karpenter_nodes_or_says_it_needs_a_node_group_with_huge_pages(fake):
    """No Karpenter instance type offers huge pages: an example that asks for them says so in a comment (it needs a
    managed node group allocating them); every other one gets nodes from the Karpenter NodePool."""
    karpenter_cluster(fake)
    examples = []
    for path in sorted((REPO / "examples").rglob("*.yaml")):
        text = path.read_text()
        body = yaml.safe_load(text)
        if isinstance(body, dict) and body.get("backend") == "kubernetes":
            spec = JobSpec.model_validate(body)
            examples.append(path.name)
            if spec.resources.hugepages:
                comments = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
                assert HUGEPAGES_NOTE in " ".join(comments.split()), f"{path.name}: huge pages, and no note"
                continue
            name = launched(fake, spec.model_copy(update={"queue": None}))
            fake.provision()
            assert all(p["spec"].get("nodeName") for p in fake.pods(name, NS)), path.name
    assert "eks-torchtitan.yaml" in examples and "eks-sdk.yaml" in examples and len(examples) >= 5


def test_an_efa_job_names_its_zone_or_is_refused(admin):
    """Finding 15: examples/byo/eks-sdk.yaml rendered no zone at all; EFA does not cross Availability Zones."""
    from tests.workers.backends.kubernetes.k8s_support import spec_body

    body = spec_body()
    body["scheduling"] = {}
    refused = admin.post("/v1/jobs", json=body)
    assert refused.status_code == 422 and "scheduling.zone is required for a job that asks for EFA" in refused.text
    for scheduling in (
        {"zone": "us-west-2c"},
        {"node_selector": {"topology.kubernetes.io/zone": "us-west-2c"}},
        {"affinity": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2c"]}]},
    ):
        assert admin.post("/v1/jobs", json={**body, "scheduling": scheduling}).status_code == 201
    spread = {"affinity": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]}]}
    assert admin.post("/v1/jobs", json={**body, "scheduling": spread}).status_code == 422
    byo = JobSpec.model_validate(yaml.safe_load((REPO / "examples/byo/eks-sdk.yaml").read_text()))
    pod = m.job_manifest(make_request(byo))["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["topology.kubernetes.io/zone"] == "us-west-2c"


def test_do_not_disrupt_blocks_consolidation_not_expiry(fake, backend):
    """Finding 8: the docs said karpenter.sh/do-not-disrupt protects runs; Karpenter's own docs say it blocks
    consolidation and drift, not expiry, repair or forceful termination. In the fake as in Karpenter: a pool's
    expireAfter drains a node under training; consolidation leaves it alone."""
    from tests.workers.backends.kubernetes.k8s_support import JOB_ID, SPEC
    from workers.backends.base import AttemptPhase

    karpenter_cluster(fake)
    fake.node_pools["gpu"].expire_after_s = 3600
    backend.launch(make_request())
    name = m.attempt_name(JOB_ID, SPEC.name, 0)
    fake.schedule(name, NS)
    fake.provision()
    fake.run(name, NS)
    assert backend.status(JOB_ID, 0, SPEC).phase == AttemptPhase.running
    node = fake.pod(name, NS, 0)["spec"]["nodeName"]
    assert fake.consolidate(node) is False  # the pods' do-not-disrupt holds consolidation off
    fake.advance(3601)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed and status.cause.cause_class.value == "preempted"
    assert "evicted through the Eviction API" in status.cause.message


def test_the_shipped_nodepool_never_expires_training_nodes():
    pool, node_class = yaml.safe_load_all((REPO / "deploy/eks/karpenter/nodepool.yaml").read_text())
    assert (pool["apiVersion"], pool["kind"], node_class["kind"]) == ("karpenter.sh/v1", "NodePool", "EC2NodeClass")
    template = pool["spec"]["template"]["spec"]
    assert template["expireAfter"] == "Never"  # expiry is forceful: do-not-disrupt does not stop it
    assert pool["spec"]["disruption"]["consolidationPolicy"] == "WhenEmpty"
    assert {"nodes": "0", "reasons": ["Drifted", "Underutilized"]} in pool["spec"]["disruption"]["budgets"]
    assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in template["taints"]
    zones = next(r["values"] for r in template["requirements"] if r["key"] == "topology.kubernetes.io/zone")
    assert len(zones) == 1  # EFA jobs are held to one zone


def test_the_node_class_finds_subnets_by_the_discovery_tag_not_a_zone_tag_aws_never_sets():
    """Finding 8: subnetSelectorTerms required a `topology.kubernetes.io/zone` tag that AWS subnets do not carry, so
    Karpenter found no subnet. They select by the discovery tag AWS's and Karpenter's guides use (the cluster's
    name); the zone stays the NodePool's requirement."""
    _, node_class = yaml.safe_load_all((REPO / "deploy/eks/karpenter/nodepool.yaml").read_text())
    cluster = yaml.safe_load((REPO / "deploy/eks/cluster.yaml").read_text())["metadata"]["name"]
    discovery = {"tags": {"karpenter.sh/discovery": cluster}}
    assert node_class["spec"]["subnetSelectorTerms"] == [discovery]
    assert node_class["spec"]["securityGroupSelectorTerms"] == [discovery]
    for terms in (node_class["spec"]["subnetSelectorTerms"], node_class["spec"]["securityGroupSelectorTerms"]):
        assert not any("topology.kubernetes.io/zone" in (term.get("tags") or {}) for term in terms)


NO_HUGEPAGES = {**GPU_NODE_ALLOCATABLE, "hugepages-2Mi": "0"}
SYSTEM_TAINT = {"key": "CriticalAddonsOnly", "value": "true", "effect": "NoSchedule"}


def cluster_without_autoscaler(fake: FakeKube, gpu_allocatable: dict[str, str]) -> None:
    """A tainted system node and two GPU nodes of a managed group, and nothing that adds nodes."""
    for node in fake.nodes:
        fake.delete("nodes", "", node)
    fake.add_node("system-1", taints=[SYSTEM_TAINT], allocatable={"cpu": "8", "memory": "32Gi", "pods": "110"})
    for i in (1, 2):
        fake.add_node(f"gpu-{i}", allocatable=gpu_allocatable)


def test_without_an_autoscaler_the_schedulers_own_word_fails_a_job_no_node_can_ever_fit(admin, fake, supervised):
    """Karpenter's or cluster-autoscaler's refusal is what says "never" within a minute; a cluster with neither
    left the job waiting out its pending timeout. The scheduler's word counts after a minute with no autoscaler's
    Event: every node refused for good or short of huge pages, and no node allocating that many."""
    cluster_without_autoscaler(fake, NO_HUGEPAGES)
    job_id, spec = submit(admin, resources=HUGEPAGES, resiliency={"max_job_restarts": 3, "pending_timeout_s": 3600})
    name = m.attempt_name(job_id, spec.name, 0)
    fake.schedule(name, NS)
    said = fake.pod(name, NS, 0)["status"]["conditions"][0]["message"]
    assert said.startswith("0/3 nodes are available: 2 Insufficient hugepages-2Mi, 1 node(s) had untolerated taint")
    assert said.endswith("2 No preemption victims found for incoming pod, 1 Preemption is not helpful for scheduling.")
    supervise()
    fake.advance(31)  # past the autoscalers' 30 s: none has spoken, one may yet
    supervise()
    assert job_detail(admin, job_id)["status"] == "SUBMITTED"
    fake.advance(30)  # a minute, and no autoscaler said anything of the pods
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["status"] == "FAILED" and detail["job_restarts"] == 0  # retrying cannot help
    (failed,) = events_of(admin, job_id, "scheduling_failed")
    assert failed["details"]["reason"] == "Unsatisfiable" and failed["details"]["resources"] == ["hugepages-2Mi"]
    assert "no autoscaler (Karpenter, cluster-autoscaler) said anything" in failed["details"]["cause"]
    assert "no node allocates that many huge pages" in failed["details"]["cause"]


def test_pods_waiting_for_gpus_that_other_pods_hold_are_never_unsatisfiable(fake, backend):
    """ "Insufficient nvidia.com/gpu" on every node, and no autoscaler: the nodes have GPUs, other pods hold them."""
    cluster_without_autoscaler(fake, GPU_NODE_ALLOCATABLE)
    other = make_request(make_spec(name="other-job"), job_id="0123456789abcdef0123456789abcdef")
    fake.create("jobs", NS, m.job_manifest(other))
    fake.schedule(m.attempt_name(other.job_id, "other-job", 0), NS)  # both GPU nodes taken
    spec = make_spec(resiliency={"pending_timeout_s": None})
    backend.launch(make_request(spec))
    name = m.attempt_name(JOB_ID, spec.name, 0)
    fake.schedule(name, NS)
    assert "2 Insufficient nvidia.com/gpu" in fake.pod(name, NS, 0)["status"]["conditions"][0]["message"]
    for _ in range(3):
        fake.advance(61)
        status = backend.status(JOB_ID, 0, spec)
        assert status.phase == AttemptPhase.pending and status.cause.facts.get("reason") != "Unsatisfiable"


def test_an_autoscaler_at_work_is_waited_for(fake, backend):
    cluster_without_autoscaler(fake, NO_HUGEPAGES)
    spec = make_spec(resources=HUGEPAGES)
    backend.launch(make_request(spec))
    name = m.attempt_name(JOB_ID, spec.name, 0)
    fake.schedule(name, NS)
    for pod in fake.pods(name, NS):  # e.g. a NodePool whose limits are reached for now
        fake.event(pod, "Nominated", "Pod should schedule on: nodeclaim/gpu-x7k2p", component="karpenter")
    fake.advance(61)
    assert backend.status(JOB_ID, 0, spec).phase == AttemptPhase.pending


def test_never_fits_reads_the_scheduler_and_where_it_cannot_tell_the_nodes():
    requested = {"nvidia.com/gpu": Decimal(8), "hugepages-2Mi": Decimal(5120 * 2**20)}
    small = {n: NodeState(n, "True", None, "", (), (("hugepages-2Mi", "1Gi"), ("nvidia.com/gpu", "8"))) for n in "ab"}
    big = {**small, "b": NodeState("b", "True", None, "", (), (("hugepages-2Mi", "20Gi"), ("nvidia.com/gpu", "8")))}
    up_to_1_33 = (
        "0/3 nodes are available: 1 node(s) had untolerated taint {CriticalAddonsOnly: true}, 2 Insufficient "
        "hugepages-2Mi. preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, 2 No "
        "preemption victims found for incoming pod."
    )
    assert pending.never_fits(up_to_1_33, requested, small) == ["hugepages-2Mi"]
    assert pending.never_fits(up_to_1_33, requested, big) == []  # node b has them: pods hold them now
    assert pending.never_fits(up_to_1_33, requested, {"a": small["a"]}) == []  # b not read yet: no telling
    from_1_34 = up_to_1_33.replace(
        "1 Preemption is not helpful for scheduling, 2 No preemption victims found for incoming pod",
        "3 Preemption is not helpful for scheduling",
    )
    assert pending.never_fits(from_1_34, requested, {}) == ["hugepages-2Mi"]  # the scheduler says so itself
    only_taints = (
        "0/2 nodes are available: 2 node(s) had untolerated taint {a: b}. preemption: 0/2 nodes are available: 2 "
        "Preemption is not helpful for scheduling."
    )
    assert pending.never_fits(only_taints, requested, {}) == []  # no resource of the pod's at fault: not this rule
    assert pending.never_fits("something else", requested, small) == []


def test_the_fake_scheduler_says_not_helpful_for_a_request_beyond_allocatable_as_1_34_does(fake):
    cluster_without_autoscaler(fake, NO_HUGEPAGES)
    fake.capacity_unresolvable = True
    name = launched(fake, make_spec(resources=HUGEPAGES))
    said = fake.pod(name, NS, 0)["status"]["conditions"][0]["message"]
    assert said.endswith("preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.")
