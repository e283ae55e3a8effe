"""What the spec's Kubernetes fields render to: where the pods may run (tolerations, node selector, zone,
affinity, exclusions), as whom, what a pod's failure means (podFailurePolicy, hot spares), Kueue, EFA, huge
pages and Secret-backed variables. Every rendering here is also checked strictly valid in
test_k8s_manifests.py (the `everything` spec)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from ftplane.contract import Env
from tests.workers.backends.kubernetes.k8s_support import JOB_ID, TOKEN, make_request, make_spec, validate_strict
from workers.backends.kubernetes import KubernetesBackend, placement, policy
from workers.backends.kubernetes import manifests as m


def job_of(**spec: Any) -> dict[str, Any]:
    return m.job_manifest(make_request(make_spec(**spec)))


def pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]


def env_of(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in pod_spec(job)["containers"][0]["env"]}


def test_kubernetes_not_ready_and_unreachable_tolerations_and_the_gpu_taint():
    tolerations = pod_spec(job_of())["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        assert {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300} in tolerations
    # Kubernetes' own convention: a kubelet silent for half a minute leaves its containers training
    assert placement.NOT_READY_TOLERATION_S == 300


def test_the_specs_tolerations_are_added_and_may_set_their_own_not_ready_toleration():
    own = [
        {"key": "dedicated", "operator": "Equal", "value": "p5", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "toleration_seconds": 5},
    ]
    tolerations = pod_spec(job_of(scheduling={"tolerations": own}))["tolerations"]
    assert {"key": "dedicated", "operator": "Equal", "value": "p5", "effect": "NoSchedule"} in tolerations
    unreachable = [t for t in tolerations if t.get("key") == "node.kubernetes.io/unreachable"]
    assert unreachable == [
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}
    ]


def test_node_selector_zone_affinity_and_exclusions_in_one_term():
    job = job_of(
        scheduling={
            "node_selector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
            "zone": "us-west-2c",
            "affinity": [{"key": "karpenter.sh/capacity-type", "operator": "NotIn", "values": ["spot"]}],
        }
    )
    assert pod_spec(job)["nodeSelector"] == {
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "topology.kubernetes.io/zone": "us-west-2c",
    }
    request = make_request(make_spec(scheduling={"affinity": [{"key": "a", "operator": "Exists"}]}), excluded=("n1",))
    (term,) = pod_spec(m.job_manifest(request))["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    # one term: the spec's requirements AND the exclusions (terms would be ORed)
    assert term == {
        "matchExpressions": [{"key": "a", "operator": "Exists"}],
        "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}],
    }


def test_the_exclusion_list_is_bounded_to_the_newest_nodes():
    blamed = tuple(f"node-{i:03d}" for i in range(100))
    kept = placement.excluded(blamed, make_spec())
    assert len(kept) == placement.MAX_EXCLUDED_NODES
    assert set(kept) == {f"node-{i:03d}" for i in range(100 - placement.MAX_EXCLUDED_NODES, 100)}


def test_who_the_pods_run_as_and_what_they_carry():
    job = job_of(
        scheduling={
            "priority_class": "training-high",
            "service_account": "llama-trainer",
            "image_pull_secrets": ["ecr-pull", "mirror-pull"],
            "annotations": {"example.com/owner": "pretraining"},
        }
    )
    pod = pod_spec(job)
    assert pod["priorityClassName"] == "training-high" and pod["serviceAccountName"] == "llama-trainer"
    assert pod["imagePullSecrets"] == [{"name": "ecr-pull"}, {"name": "mirror-pull"}]
    assert pod["automountServiceAccountToken"] is False  # Pod Identity and IRSA bring their own token
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations["example.com/owner"] == "pretraining" and annotations["karpenter.sh/do-not-disrupt"] == "true"


def rules(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list(job["spec"]["podFailurePolicy"]["rules"])


def test_failure_policy_without_spares():
    job = job_of()
    js = job["spec"]
    assert js["backoffLimit"] == 0 and "backoffLimitPerIndex" not in js and js["completions"] == 2
    assert rules(job)[0] == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [policy.VERDICT]},
    }
    assert {"action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} in rules(job)
    assert {"action": "Count", "onExitCodes": {"operator": "In", "values": [policy.NODE_UNHEALTHY]}} in rules(job)


def test_hot_spares_run_more_pods_and_spend_an_index_per_lost_node():
    job = job_of(resiliency={"spare_nodes": 2})
    js = job["spec"]
    assert (js["completions"], js["parallelism"]) == (4, 4)  # nodes + spares
    assert (js["backoffLimitPerIndex"], js["maxFailedIndexes"]) == (0, 2) and "backoffLimit" not in js
    actions = [(r["action"], r.get("onExitCodes", {}).get("operator"), "onPodConditions" in r) for r in rules(job)]
    assert actions == [
        ("FailJob", "In", False),  # 93: NVRx's verdict
        ("FailJob", "In", False),  # 78 from the EFA check: the image is broken
        ("FailIndex", None, True),  # a disruption: a spare takes over
        ("FailIndex", "In", False),  # 94: the node is unhealthy, a spare takes over
        ("FailJob", "NotIn", False),  # anything else is the program's: no spare is spent on it
    ]
    assert env_of(job)["FTPLANE_SPARE_NODES"]["value"] == "2"
    assert "--nnodes=2:4" in job["spec"]["template"]["spec"]["containers"][0]["command"]  # 2 active, 2 standing by
    assert len(f"{job['metadata']['name']}-{js['completions'] - 1}") <= 63


def test_a_queue_creates_the_job_suspended_with_kueues_label():
    job = job_of(queue="team-a")
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert "kueue.x-k8s.io/queue-name" not in job["spec"]["template"]["metadata"]["labels"]
    assert "suspend" not in job_of()["spec"]


@pytest.mark.parametrize(
    ("instance_type", "rdma"), [("p5.48xlarge", "1"), ("p5en.48xlarge", "1"), ("p4de.24xlarge", None), (None, None)]
)
def test_efa_environment_follows_the_instance_type(instance_type, rdma):
    selector = {"node.kubernetes.io/instance-type": instance_type} if instance_type else {}
    env = env_of(job_of(scheduling={"node_selector": selector}))
    values = {k: v.get("value") for k, v in env.items()}
    assert values["NCCL_NVLS_ENABLE"] == "0"
    assert values["FI_EFA_FORK_SAFE"] == values["RDMAV_FORK_SAFE"] == "1"
    assert values["FI_PROVIDER"] == "efa" and values["FTPLANE_EFA_EXPECTED"] == "1"
    assert values.get("FI_EFA_USE_DEVICE_RDMA") == rdma  # not baked in for every instance type


def test_efa_pods_lock_memory_and_check_efa_first():
    job = job_of()
    trainer = pod_spec(job)["containers"][0]
    assert trainer["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    (check,) = pod_spec(job)["initContainers"]
    assert check["name"] == policy.EFA_CHECK_CONTAINER and check["image"] == trainer["image"]
    assert check["resources"]["limits"]["vpc.amazonaws.com/efa"] == "32"  # the same devices as the trainer
    assert "/opt/ftplane/bin/efa-check" in check["command"][-1]
    assert {
        "action": "FailJob",
        "onExitCodes": {"containerName": "efa-check", "operator": "In", "values": [78]},
    } in rules(job)
    no_efa = job_of(resources={"gpus_per_node": 8})
    assert "initContainers" not in pod_spec(no_efa) and "securityContext" not in pod_spec(no_efa)["containers"][0]
    assert "NCCL_NVLS_ENABLE" not in env_of(no_efa)


def test_the_specs_env_wins_over_the_efa_defaults():
    """An EFA default the spec sets itself is left out of the container's environment; the spec's value reaches
    the ranks (FTPLANE_RANK_ENV, which the node agent lays over the container's) and the EFA check."""
    job = job_of(resources={"gpus_per_node": 8, "efa_per_node": 32}, env={"NCCL_NVLS_ENABLE": "1"})
    env = env_of(job)
    assert "NCCL_NVLS_ENABLE" not in env and env["FI_PROVIDER"]["value"] == "efa"
    assert json.loads(env[Env.RANK_ENV]["value"]) == {"NCCL_NVLS_ENABLE": "1"}
    (check,) = pod_spec(job)["initContainers"]
    assert {"name": "NCCL_NVLS_ENABLE", "value": "1"} in check["env"]


def test_hugepages_are_requested_and_limited_alike():
    job = job_of(resources={"gpus_per_node": 8, "memory": "1000Gi", "hugepages": {"2Mi": "5120Mi"}})
    res = pod_spec(job)["containers"][0]["resources"]
    assert res["requests"]["hugepages-2Mi"] == res["limits"]["hugepages-2Mi"] == "5120Mi"


def test_secret_env_is_rendered_by_reference_only():
    spec = make_spec(secret_env={"HF_TOKEN": {"secret": "huggingface-token", "key": "token"}})
    request = make_request(spec)
    env = env_of(m.job_manifest(request))
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "huggingface-token", "key": "token"}},
    }
    text = KubernetesBackend().render(request)
    assert "# HF_TOKEN comes from your Secret huggingface-token (key token) in training." in text
    assert TOKEN not in text
    for doc in yaml.safe_load_all(text):
        if doc:
            validate_strict(doc)


def test_instance_type_and_node_selector_for_reading_node_health():
    spec = make_spec(
        scheduling={
            "affinity": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarge"]}]
        }
    )
    assert placement.instance_type(spec) == "p5.48xlarge"
    zoned = make_spec(scheduling={"zone": "us-west-2c", "node_selector": {"pool": "gpu"}})
    assert placement.node_selector(zoned) == "pool=gpu,topology.kubernetes.io/zone=us-west-2c"
    assert placement.node_selector(make_spec(resources={"cpu": "4"})) == ""  # no EFA: no zone needed
    assert m.attempt_name(JOB_ID, spec.name, 0) in m.secret_name(JOB_ID, spec.name, 0)
