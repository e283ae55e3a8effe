"""Rendering of an attempt's manifests: names, shape, and strict schema validity (Kubernetes 1.33) for several
specs. Scheduling, failure policy, EFA, spares and queues: test_k8s_manifests_scheduling.py."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from ftplane.contract import Env
from tests.workers.backends.kubernetes.k8s_support import JOB_ID, TOKEN, make_request, make_spec, validate_strict
from workers.backends.base import launcher_arguments
from workers.backends.kubernetes import KubernetesBackend
from workers.backends.kubernetes import manifests as m

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def render(**kw: Any) -> list[dict[str, Any]]:
    text = KubernetesBackend().render(make_request(**kw))
    return [doc for doc in yaml.safe_load_all(text) if doc]


def container(job: dict[str, Any]) -> dict[str, Any]:
    (c,) = job["spec"]["template"]["spec"]["containers"]
    return c


def env_of(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container(job)["env"]}


@pytest.mark.parametrize(
    "job_id",
    [JOB_ID, "abc", "j-42", "Job_ID/with spaces+ÄÖ", "x" * 200, "0123456789"],
)
@pytest.mark.parametrize("name", ["llama-8b-fsdp", "1b-model", "a", "m" * 63, "x-" * 31 + "y"])
def test_names_are_short_valid_dns_labels(job_id, name):
    for attempt in (0, 7, 10_000):
        job_name = m.attempt_name(job_id, name, attempt)
        assert DNS_1035.match(job_name), job_name  # also a valid Service name
        assert len(f"{job_name}-4095") <= 63  # the pod hostname of the highest completion index
    for attempt in (0, 10_000):
        secret = m.secret_name(job_id, name, attempt)
        assert DNS_1035.match(secret) and len(secret) <= 63
    label = m.job_id_label(job_id)
    assert LABEL_VALUE.match(label) and len(label) <= 63


def test_names_of_different_jobs_differ():
    ids = [JOB_ID, JOB_ID[:-1] + "0", "Ab", "ab", "a" * 100, "a" * 101]
    assert len({m.attempt_name(i, "same-name", 0) for i in ids}) == len(ids)
    assert len({m.job_id_label(i) for i in ids}) == len(ids)
    assert m.attempt_name("abc", "train", 0) == "train-abc-a0"  # short ids stay readable


def test_job_manifest_shape():
    job, service = render()
    spec = make_spec()
    name = m.attempt_name(JOB_ID, spec.name, 0)
    host = f"{name}-0.{name}.training.svc.cluster.local"
    assert (job["kind"], service["kind"]) == ("Job", "Service")
    assert job["metadata"]["name"] == service["metadata"]["name"] == name
    assert job["metadata"]["namespace"] == service["metadata"]["namespace"] == "training"
    js = job["spec"]
    assert (js["completionMode"], js["completions"], js["parallelism"], js["backoffLimit"]) == ("Indexed", 2, 2, 0)
    assert "suspend" not in js  # launch creates it suspended until its Secret exists, then resumes it
    pod = js["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["subdomain"] == name
    flags = [  # finding 10: the join timeout (and the store's) from the spec, not NVRx's 300 s; finding 13: the grace
        "--rdzv-conf=join_timeout=1200,store_connect_wait_seconds=1200",  # initial_heartbeat_timeout_s
        "--term-timeout=120",  # resiliency.stop_grace_s: SIGTERM to the ranks, SIGKILL only after it
    ]
    launcher = launcher_arguments(
        spec, nnodes=2, rdzv_endpoint=f"{host}:29500", rdzv_id=name, log_dir=f"{m.AGENT_DIR}/ranks", extra=flags
    )
    assert container(job)["command"] == [*m.AGENT_COMMAND, *launcher]
    assert pod["terminationGracePeriodSeconds"] == 140  # the ranks' 120 s and the node agent's 20 s
    # A job whose size makes its nodes report every 30 s: the agent's last report may wait out a Retry-After of
    # two intervals (65 s in all), then it leaves (10 s).
    slow = m.job_manifest(make_request(make_spec(progress={"report_interval_s": 30})))
    assert slow["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 120 + 65 + 10
    assert env_of(job)["FTPLANE_STOP_GRACE_S"]["value"] == "120"
    waiting = m.job_manifest(make_request(make_spec(resiliency={"pending_timeout_s": 1800, "stop_grace_s": 600})))
    command = container(waiting)["command"]
    assert (
        "--rdzv-conf=join_timeout=1800,store_connect_wait_seconds=1800" in command and "--term-timeout=600" in command
    )
    assert waiting["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 620
    env = env_of(job)
    assert env["FTPLANE_MASTER_ADDR"]["value"] == host
    assert env["FTPLANE_TOKEN"] == {
        "name": "FTPLANE_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": m.secret_name(JOB_ID, spec.name, 0), "key": "token"}},
    }
    assert env["FTPLANE_JOB_ID"]["value"] == JOB_ID and env["FTPLANE_ATTEMPT"]["value"] == "0"
    assert env["FTPLANE_CHECKPOINT_DIR"]["value"] == "/checkpoints/llama-8b"
    assert env["FTPLANE_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    res = container(job)["resources"]
    assert res["requests"] == {
        "ephemeral-storage": "20Gi",  # finding 14: the node's disk the agent's and ranks' output use, requested
        "cpu": "96",
        "memory": "1Ti",
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "32",
    }
    assert res["limits"] == {"memory": "1Ti", "nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}
    mounts = {v["name"]: v["mountPath"] for v in container(job)["volumeMounts"]}
    assert mounts == {"dshm": "/dev/shm", "checkpoints": "/checkpoints/llama-8b"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "256Gi"}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "fsx-checkpoints"}
    labels = job["metadata"]["labels"]
    assert labels["ftplane.io/job-id"] == JOB_ID and labels["ftplane.io/attempt"] == "0"
    assert labels["app.kubernetes.io/managed-by"] == "ftplane" and labels["team"] == "pretraining"
    assert js["template"]["metadata"]["labels"] == labels
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"ftplane.io/job-id": JOB_ID, "ftplane.io/attempt": "0"}
    assert pod["automountServiceAccountToken"] is False
    assert "affinity" not in pod
    # training is not disrupted by Karpenter's consolidation, drift or expiry
    assert js["template"]["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert container(job)["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_render_names_the_secret_but_never_shows_the_token():
    text = KubernetesBackend().render(make_request())
    assert TOKEN not in text
    assert "kind: Secret" not in text
    assert f"# Secret {m.secret_name(JOB_ID, 'llama-8b-fsdp', 0)}" in text
    secret = m.secret_manifest(make_request(), owner_uid="0b6a3c2e-8a55-4b8e-9a7e-2f1f6c1d9e77")
    assert secret["stringData"] == {"token": TOKEN}  # what launch creates
    # owned by the attempt's Job: deleting the attempt deletes it (the worker never deletes a Secret)
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "Job"
    validate_strict(secret)


def test_spec_labels_cannot_override_ftplane_labels():
    (job, _) = render(spec=make_spec(labels={"app.kubernetes.io/managed-by": "someone", "team": "x"}))
    assert job["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "ftplane"


def test_excluded_nodes_become_a_match_fields_not_in_affinity():
    (job, _) = render(attempt=1, excluded=("ip-10-0-1-7", "ip-10-0-1-2", "ip-10-0-1-7"))
    affinity = job["spec"]["template"]["spec"]["affinity"]
    term = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    # by the Node's name (matchFields), not by a label that may differ from it
    assert term == [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["ip-10-0-1-2", "ip-10-0-1-7"]}]}
    ]
    off = make_spec(resiliency={"exclude_failed_nodes": False})
    (job, _) = render(spec=off, attempt=1, excluded=("ip-10-0-1-7",))
    assert "affinity" not in job["spec"]["template"]["spec"]


def test_cpu_only_spec_without_checkpoint_storage():
    spec = make_spec(resources={}, checkpoint={"engine": "none"}, nodes=1, procs_per_node=2)
    (job, _) = render(spec=spec)
    c = container(job)
    assert c["resources"] == {"requests": {"ephemeral-storage": "20Gi"}}  # what its output takes of the disk
    assert [v["name"] for v in c["volumeMounts"]] == ["dshm"]
    assert job["spec"]["template"]["spec"]["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    tolerations = job["spec"]["template"]["spec"]["tolerations"]
    assert not any(t.get("key") == "nvidia.com/gpu" for t in tolerations)  # no GPUs, no GPU taint tolerated
    assert "FTPLANE_CHECKPOINT_DIR" not in env_of(job)
    assert "initContainers" not in job["spec"]["template"]["spec"]  # no EFA, no EFA check


def test_kubernetes_variable_syntax_in_the_command_stays_literal():
    spec = make_spec(command=["sh", "-c", "echo $(hostname) $HOME"])
    (job, _) = render(spec=spec)
    assert container(job)["command"][-1] == "echo $$(hostname) $HOME"


SPECS = {
    "gpu-efa-pvc": {},
    "cpu-only": {"resources": {}, "checkpoint": {"engine": "none"}, "nodes": 1, "procs_per_node": 4},
    "gpu-no-efa": {"resources": {"gpus_per_node": 4, "memory": "200Gi"}, "checkpoint": {"dir": "/ckpt"}},
    "sixteen-nodes": {"nodes": 16, "labels": {}},
    "pvc-no-shm-size": {"resources": {"gpus_per_node": 8}, "checkpoint": {"dir": "/c", "pvc": "ckpt"}},
    "inprocess-faults": {
        "resiliency": {"inprocess": {"enabled": True}, "max_in_job_restarts": 20},
        "faults": [{"kind": "crash", "rank": 3, "at_step": 10}],
        "env": {"NCCL_DEBUG": "WARN"},
    },
    "working-dir-preset": {"working_dir": "/workspace/run", "progress": {"preset": "torchtitan"}},
    "everything": {
        "nodes": 4,
        "resources": {
            "gpus_per_node": 8,
            "efa_per_node": 32,
            "cpu": "90",
            "memory": "1000Gi",
            "hugepages": {"2Mi": "5120Mi", "1Gi": "2Gi"},
        },
        "scheduling": {
            "tolerations": [{"key": "dedicated", "value": "p5", "effect": "NoSchedule"}],
            "node_selector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
            "zone": "us-west-2c",
            "affinity": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}],
            "priority_class": "training-high",
            "service_account": "llama-trainer",
            "annotations": {"example.com/owner": "pretraining"},
            "image_pull_secrets": ["ecr-pull"],
        },
        "secret_env": {"HF_TOKEN": {"secret": "huggingface-token", "key": "token", "optional": True}},
        "queue": "team-a",
        "resiliency": {"spare_nodes": 2, "max_preemptions": 3},
    },
}


@pytest.mark.parametrize("case", sorted(SPECS))
@pytest.mark.parametrize("excluded", [(), ("ip-10-0-1-2", "ip-10-0-3-4.ec2.internal")])
def test_rendered_manifests_are_strictly_valid(case, excluded):
    spec = make_spec(**SPECS[case])
    backend = KubernetesBackend(ttl_after_finished_s=86400)
    request = make_request(spec, attempt=3, excluded=excluded)
    docs = [d for d in yaml.safe_load_all(backend.render(request)) if d]
    docs += [m.service_manifest(request, owner_uid="0b6a3c2e-8a55-4b8e-9a7e-2f1f6c1d9e77")]
    docs += [m.secret_manifest(request, owner_uid="0b6a3c2e-8a55-4b8e-9a7e-2f1f6c1d9e77")]
    for doc in docs:
        validate_strict(doc)
        assert DNS_1123.match(doc["metadata"]["name"]) and len(doc["metadata"]["name"]) <= 63
        for value in doc["metadata"].get("labels", {}).values():
            assert LABEL_VALUE.match(value) and len(value) <= 63
    assert ("affinity" in docs[0]["spec"]["template"]["spec"]) == bool(excluded or spec.scheduling.affinity)
    assert docs[0]["spec"]["ttlSecondsAfterFinished"] == 86400
    (container,) = docs[0]["spec"]["template"]["spec"]["containers"]
    assert container.get("workingDir") == spec.working_dir  # the container's, else the image's own
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env.get("FTPLANE_PROGRESS_PRESET") == spec.progress.preset


def test_pod_index_for_rank_follows_the_rendezvous_order():
    two = make_spec(nodes=2, procs_per_node=8)
    assert [m.pod_index_for_rank(two, r) for r in (0, 7, 8, 15)] == [0, 0, 1, 1]
    twelve = make_spec(nodes=12, procs_per_node=8)
    # host names sort as text: ...-0, -1, -10, -11, -2, ...
    assert [m.pod_index_for_rank(twelve, node_rank * 8) for node_rank in range(5)] == [0, 1, 10, 11, 2]


def test_the_specs_env_reaches_the_ranks_not_the_node_agent():
    """The container's environment is the node agent's: the spec's `env` (a user's PYTHONPATH, say) travels as
    FTPLANE_RANK_ENV, which the agent gives its ranks only."""
    (job, _) = render(spec=make_spec(env={"PYTHONPATH": "/workspace/src", "NCCL_DEBUG": "WARN"}))
    env = env_of(job)
    assert "PYTHONPATH" not in env and "NCCL_DEBUG" not in env
    assert json.loads(env[Env.RANK_ENV]["value"]) == {"PYTHONPATH": "/workspace/src", "NCCL_DEBUG": "WARN"}
