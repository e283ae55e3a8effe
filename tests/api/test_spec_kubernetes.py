"""The spec's Kubernetes fields (scheduling, hugepages, secret_env, queue) and the resiliency fields that go with
them (on_pending_timeout, max_preemptions, spare_nodes): a mistake is a 422 that names the field and stores
nothing; a good spec is accepted with its values kept."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from api.schemas.spec import JobSpec
from tests.conftest import row_counts, tiny_spec


def k8s(**overrides: Any) -> dict[str, Any]:
    """A valid kubernetes spec with `overrides`."""
    base: dict[str, Any] = {
        "backend": "kubernetes",
        "image": "registry.example/trainer:1",
        "namespace": "training",
        "checkpoint": {"engine": "none"},
    }
    return tiny_spec(**{**base, **overrides})


def sched(**fields: Any) -> dict[str, Any]:
    return k8s(scheduling=fields)


FULL = k8s(
    nodes=4,
    resources={"gpus_per_node": 8, "cpu": "90", "memory": "1000Gi", "hugepages": {"2Mi": "5120Mi"}},
    scheduling={
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "p5", "effect": "NoSchedule"},
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "toleration_seconds": 10,
            },
        ],
        "node_selector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
        "zone": "us-west-2c",
        "affinity": [
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand", "reserved"]},
            {"key": "example.com/gpu-generation", "operator": "Gt", "values": ["8"]},
        ],
        "priority_class": "training-high",
        "service_account": "llama-trainer",
        "annotations": {"example.com/owner": "pretraining"},
        "image_pull_secrets": ["ecr-pull"],
    },
    secret_env={"HF_TOKEN": {"secret": "huggingface-token", "key": "token"}},
    queue="team-a.gpu",
    resiliency={"on_pending_timeout": "fail", "max_preemptions": 5, "spare_nodes": 2, "pending_timeout_s": 600},
)


def test_a_spec_with_every_kubernetes_field_is_accepted_as_given(admin: TestClient) -> None:
    response = admin.post("/v1/jobs", json=FULL)
    assert response.status_code == 201, response.text
    spec = response.json()["spec"]
    assert spec["scheduling"]["tolerations"][1]["toleration_seconds"] == 10
    assert spec["scheduling"]["zone"] == "us-west-2c" and spec["queue"] == "team-a.gpu"
    assert spec["resources"]["hugepages"] == {"2Mi": "5120Mi"}
    assert spec["resiliency"]["spare_nodes"] == 2 and spec["resiliency"]["on_pending_timeout"] == "fail"
    # a secret value is never part of a spec: only where to find it
    assert spec["secret_env"] == {"HF_TOKEN": {"secret": "huggingface-token", "key": "token", "optional": False}}


def test_defaults() -> None:
    spec = JobSpec.model_validate(k8s())
    assert spec.resiliency.on_pending_timeout == "retry" and spec.resiliency.max_preemptions == 10
    assert spec.resiliency.spare_nodes == 0 and spec.queue is None and spec.secret_env == {}
    assert spec.scheduling.node_labels() == {}


TOLERATION = "scheduling.tolerations[0]"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (sched(tolerations=[{"key": "a", "operator": "Sometimes"}]), f"{TOLERATION}.operator"),
        (sched(tolerations=[{"key": "a", "effect": "NoRun"}]), f"{TOLERATION}.effect"),
        (sched(tolerations=[{"key": "bad key!"}]), f"{TOLERATION}.key"),
        (sched(tolerations=[{"key": "a", "value": "x" * 64}]), f"{TOLERATION}.value"),
        (
            sched(tolerations=[{"key": "a", "toleration_seconds": -1, "effect": "NoExecute"}]),
            f"{TOLERATION}.toleration_seconds",
        ),
        (sched(tolerations=[{"key": "a", "tolerationSeconds": 5}]), f"{TOLERATION}.tolerationSeconds"),
        (sched(tolerations=[{"key": "a"}] * 33), "scheduling.tolerations"),
        (sched(node_selector={"ok": "not ok!"}), "scheduling.node_selector.ok"),
        (sched(node_selector={"-bad": "v"}), "scheduling.node_selector.-bad.[key]"),
        (sched(zone="us west"), "scheduling.zone"),
        (sched(zone=""), "scheduling.zone"),
        (sched(affinity=[{"key": "k", "operator": "Near"}]), "scheduling.affinity[0].operator"),
        (sched(affinity=[{"key": "k", "operator": "In", "values": ["a b"]}]), "scheduling.affinity[0].values[0]"),
        (sched(priority_class="High_Priority"), "scheduling.priority_class"),
        (sched(service_account="x" * 254), "scheduling.service_account"),
        (sched(annotations={"example.com/x": "y" * 16385}), "scheduling.annotations.example.com/x"),
        (sched(image_pull_secrets=["Not-Valid"]), "scheduling.image_pull_secrets[0]"),
        (sched(surprise=1), "scheduling.surprise"),
        (k8s(resources={"hugepages": {"4Ki": "1Gi"}, "memory": "1Gi"}), "resources.hugepages.4Ki.[key]"),
        (k8s(resources={"hugepages": {"2Mi": "lots"}, "memory": "1Gi"}), "resources.hugepages.2Mi"),
        (k8s(secret_env={"HF TOKEN": {"secret": "s", "key": "k"}}), "secret_env.HF TOKEN.[key]"),
        (k8s(secret_env={"HF_TOKEN": {"secret": "S_3", "key": "k"}}), "secret_env.HF_TOKEN.secret"),
        (k8s(secret_env={"HF_TOKEN": {"secret": "s", "key": "a/b"}}), "secret_env.HF_TOKEN.key"),
        (k8s(secret_env={"HF_TOKEN": {"secret": "s"}}), "secret_env.HF_TOKEN.key"),
        (k8s(secret_env={"HF_TOKEN": {"secret": "s", "key": "k", "value": "hf_abc"}}), "secret_env.HF_TOKEN.value"),
        (k8s(queue="Team A"), "queue"),
        (k8s(queue="q" * 64), "queue"),
        (k8s(resiliency={"on_pending_timeout": "wait"}), "resiliency.on_pending_timeout"),
        (k8s(resiliency={"pending_timeout_s": 0}), "resiliency.pending_timeout_s"),
        (k8s(resiliency={"pending_timeout_s": 8 * 86400}), "resiliency.pending_timeout_s"),
        (k8s(resiliency={"pending_timeout_s": "soon"}), "resiliency.pending_timeout_s"),
        (k8s(resiliency={"max_preemptions": -1}), "resiliency.max_preemptions"),
        (k8s(resiliency={"max_preemptions": 1001}), "resiliency.max_preemptions"),
        (k8s(resiliency={"spare_nodes": 65}), "resiliency.spare_nodes"),
        (k8s(resiliency={"spare_nodes": -1}), "resiliency.spare_nodes"),
    ],
)
def test_invalid_kubernetes_fields_are_422_naming_the_field(
    admin: TestClient, spec: dict[str, Any], field: str
) -> None:
    before = row_counts()
    response = admin.post("/v1/jobs", json=spec)
    assert response.status_code == 422, response.text
    fields = [f["field"] for f in response.json()["error"]["fields"]]
    assert field in fields, fields
    assert row_counts() == before


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        (sched(tolerations=[{"operator": "Equal", "value": "x"}]), TOLERATION, "key is required"),
        (sched(tolerations=[{"key": "a", "operator": "Exists", "value": "x"}]), TOLERATION, "value must be empty"),
        (
            sched(tolerations=[{"key": "a", "effect": "NoSchedule", "toleration_seconds": 30}]),
            TOLERATION,
            "only allowed with effect NoExecute",
        ),
        (sched(affinity=[{"key": "k", "operator": "In"}]), "scheduling.affinity[0]", "at least one value"),
        (
            sched(affinity=[{"key": "k", "operator": "Exists", "values": ["a"]}]),
            "scheduling.affinity[0]",
            "takes no values",
        ),
        (sched(affinity=[{"key": "k", "operator": "Gt", "values": ["x"]}]), "scheduling.affinity[0]", "an integer"),
        (sched(annotations={"ftplane.io/job-id": "x"}), "scheduling", "set by ftplane"),
        (sched(annotations={"karpenter.sh/do-not-disrupt": "false"}), "scheduling", "set by ftplane"),
        (
            sched(zone="us-west-2a", node_selector={"topology.kubernetes.io/zone": "us-west-2b"}),
            "scheduling",
            "give the zone once",
        ),
        (sched(image_pull_secrets=["a", "a"]), "scheduling", "each Secret once"),
        (sched(node_selector={"x" * 64: "v"}), "scheduling", "at most 63 characters"),
        (k8s(resources={"hugepages": {"2Mi": "1Gi"}}), "resources", "needs resources.cpu or resources.memory"),
    ],
)
def test_inconsistent_kubernetes_fields_say_what_is_wrong(
    admin: TestClient, spec: dict[str, Any], field: str, words: str
) -> None:
    response = admin.post("/v1/jobs", json=spec)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert field in [f["field"] for f in error["fields"]]
    assert words in error["message"]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (
            k8s(env={"HF_TOKEN": "x"}, secret_env={"HF_TOKEN": {"secret": "s", "key": "k"}}),
            "secret_env.HF_TOKEN: also in env",
        ),
        (k8s(secret_env={"FTPLANE_TOKEN": {"secret": "s", "key": "k"}}), "secret_env.FTPLANE_TOKEN"),
        (k8s(nodes=16380, resiliency={"spare_nodes": 8}), "nodes + resiliency.spare_nodes must be at most 16384"),
        (tiny_spec(queue="team-a"), "queue: only the kubernetes backend"),
        (tiny_spec(scheduling={"zone": "us-west-2a"}), "scheduling: only the kubernetes backend"),
        (tiny_spec(resiliency={"spare_nodes": 1}), "resiliency.spare_nodes: only the kubernetes backend"),
        (tiny_spec(resources={"hugepages": {"2Mi": "1Gi"}, "cpu": "1"}), "resources.hugepages: only the kubernetes"),
    ],
)
def test_kubernetes_only_and_conflicting_fields(admin: TestClient, spec: dict[str, Any], words: str) -> None:
    before = row_counts()
    response = admin.post("/v1/jobs", json=spec)
    assert response.status_code == 422, response.text
    assert words in response.json()["error"]["message"]
    assert row_counts() == before


def test_an_empty_scheduling_section_is_fine_on_the_local_backend() -> None:
    assert JobSpec.model_validate(tiny_spec(scheduling={})).scheduling.tolerations == []


def test_node_labels_join_the_selector_and_the_zone() -> None:
    spec = JobSpec.model_validate(FULL)
    assert spec.scheduling.node_labels() == {
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "topology.kubernetes.io/zone": "us-west-2c",
    }


def test_the_openapi_schema_documents_the_new_fields(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert {"SchedulingSpec", "Toleration", "NodeRequirement", "SecretKeyRef"} <= set(schemas)
    assert "queue" in schemas["JobSpec"]["properties"] and "secret_env" in schemas["JobSpec"]["properties"]


def test_validation_errors_are_model_errors_too() -> None:
    with pytest.raises(ValidationError):
        JobSpec.model_validate(sched(tolerations=[{"key": "a", "effect": "NoSchedule", "toleration_seconds": 1}]))
