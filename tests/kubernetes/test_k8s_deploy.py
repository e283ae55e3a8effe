"""deploy/: Kustomize renders strictly valid objects; RBAC matches the backend; EKS, images, examples."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from api.schemas.spec import JobSpec
from tests.fake_kubernetes import FakeKube
from tests.kubernetes.k8s_support import JOB_ID, make_request, validate_strict
from workers.backends.base import FaultRequest
from workers.backends.kubernetes import KubernetesBackend
from workers.backends.kubernetes import manifests as m

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUSTOMIZE = DEPLOY / "kustomize"
KUBECTL = shutil.which("kubectl")

# CI must render the Kustomize trees; elsewhere a machine without kubectl skips (make test installs it).
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None and os.environ.get("CI", "").lower() not in ("true", "1"),
    reason="kubectl not installed (bash .ci/system-deps installs it); CI always runs this",
)


def kustomize(path: Path) -> list[dict[str, Any]]:
    assert KUBECTL, "kubectl is required to render deploy/kustomize (bash .ci/system-deps installs it)"
    out = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


OVERLAYS = ["base", "overlays/eks", "overlays/eks-trial"]


@needs_kubectl
@pytest.mark.parametrize("tree", OVERLAYS)
def test_kustomize_renders_strictly_valid_objects(tree):
    docs = kustomize(KUSTOMIZE / tree)
    assert docs
    for doc in docs:
        validate_strict(doc)
        name = doc["metadata"]["name"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name) and len(name) <= 63
    kinds = {d["kind"] for d in docs}
    assert {
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Deployment",
        "Service",
    } <= kinds
    deployments = by_kind(docs, "Deployment")
    assert {"ftplane-api", "ftplane-worker", "ftplane-beat"} <= set(deployments)


@needs_kubectl
def test_control_plane_shape():
    docs = kustomize(KUSTOMIZE / "base")
    deployments = by_kind(docs, "Deployment")
    parts = {name: d["spec"]["template"]["spec"] for name, d in deployments.items()}
    for part, pod in parts.items():
        (c,) = pod["containers"]
        assert c["args"][:3] == ["serve", "--only", part.removeprefix("ftplane-")]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        env = {e["name"]: e for e in c.get("env", [])}
        assert env["FTPLANE_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
            "name": "ftplane-secrets",
            "key": "database-url",
        }
        assert env["FTPLANE_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
            "name": "ftplane-secrets",
            "key": "redis-url",
        }
        assert c["envFrom"] == [{"configMapRef": {"name": "ftplane-config"}}]
    (api,) = parts["ftplane-api"]["containers"]
    assert api["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert api["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert api["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert parts["ftplane-worker"]["serviceAccountName"] == "ftplane-worker"
    assert parts["ftplane-api"]["automountServiceAccountToken"] is False
    assert parts["ftplane-beat"]["automountServiceAccountToken"] is False
    assert deployments["ftplane-beat"]["spec"]["replicas"] == 1
    assert deployments["ftplane-beat"]["spec"]["strategy"] == {"type": "Recreate"}
    service = by_kind(docs, "Service")["ftplane-api"]
    assert service["spec"]["ports"][0]["port"] == 8000
    config = by_kind(docs, "ConfigMap")["ftplane-config"]["data"]
    assert all(key.startswith("FTPLANE_") for key in config)
    assert config["FTPLANE_KUBE_IN_CLUSTER"] == "true"
    assert config["FTPLANE_PUBLIC_URL"] == "http://ftplane-api.ftplane.svc.cluster.local:8000"
    assert "FTPLANE_DATABASE_URL" not in config and "Secret" not in {d["kind"] for d in docs}


@needs_kubectl
def test_eks_overlays():
    eks = kustomize(KUSTOMIZE / "overlays/eks")
    api = by_kind(eks, "Deployment")["ftplane-api"]["spec"]["template"]["spec"]["containers"][0]
    assert api["image"].startswith("123456789012.dkr.ecr.us-west-2.amazonaws.com/ftplane-control-plane:")
    assert by_kind(eks, "Service")["ftplane-api"]["spec"]["type"] == "LoadBalancer"
    pvc = by_kind(eks, "PersistentVolumeClaim")["fsx-checkpoints"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["metadata"]["namespace"] == "training"
    assert by_kind(eks, "StorageClass")["fsx-lustre"]["provisioner"] == "fsx.csi.aws.com"

    trial = kustomize(KUSTOMIZE / "overlays/eks-trial")
    (secret,) = [d for d in trial if d["kind"] == "Secret"]
    assert secret["metadata"]["name"].startswith("ftplane-secrets-")
    worker = by_kind(trial, "Deployment")["ftplane-worker"]["spec"]["template"]["spec"]["containers"][0]
    refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in worker["env"]}
    assert refs == {secret["metadata"]["name"]}  # the generated name is wired in
    assert {"ftplane-postgres", "ftplane-redis"} <= set(by_kind(trial, "Service"))


# ------------------------------------------------------------------------ RBAC


def role_rules() -> set[tuple[str, str, str]]:
    (role,) = [d for d in load_docs(KUSTOMIZE / "base/rbac.yaml") if d["kind"] == "Role"]
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def verb_of(method: str, path: str) -> tuple[str, str, str]:
    parts = path.strip("/").split("/")
    group = "batch" if parts[0] == "apis" else ""
    rest = parts[parts.index("namespaces") + 2 :]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    verb = {
        "GET": "get" if named else "list",
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if named else "deletecollection",
    }[method]
    if resource == "pods/exec":
        verb = "create"
    return group, resource, verb


def test_role_grants_exactly_what_the_backend_uses():
    fake = FakeKube().start()
    try:
        backend = KubernetesBackend(fake.api_client())
        request = make_request()
        spec = request.spec
        name = m.attempt_name(JOB_ID, spec.name, 0)
        backend.launch(request)
        backend.launch(request)  # the Secret is replaced
        backend.status(JOB_ID, 0, spec)  # pending: reads Events too
        fake.schedule(name, "training")
        fake.run(name, "training")
        backend.status(JOB_ID, 0, spec)
        backend.inject_fault(JOB_ID, 0, spec, FaultRequest(id="a", kind="crash", rank=1))
        backend.inject_fault(JOB_ID, 0, spec, FaultRequest(id="b", kind="node_loss", rank=9))
        backend.status(JOB_ID, 0, spec)
        backend.cancel(JOB_ID, 0, spec)
        backend.delete_job_resources(JOB_ID, spec)
        used = {verb_of(r.method, r.path) for r in fake.requests}
    finally:
        fake.stop()
    granted = role_rules()
    assert used <= granted, f"the Role misses {sorted(used - granted)}"
    # nothing beyond what the backend does (pods/exec `get`: exec on clusters before 1.31)
    assert granted - used == {("", "pods/exec", "get")}
    assert ("", "secrets", "get") not in granted and ("", "secrets", "list") not in granted


def test_role_is_bound_to_the_workers_service_account_in_the_job_namespace():
    docs = load_docs(KUSTOMIZE / "base/rbac.yaml")
    role = by_kind(docs, "Role")["ftplane-jobs"]
    binding = by_kind(docs, "RoleBinding")["ftplane-jobs"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "training"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "ftplane-jobs",
    }
    worker = {"kind": "ServiceAccount", "name": "ftplane-worker", "namespace": "ftplane"}
    assert binding["subjects"] == [worker]
    for doc in docs:
        validate_strict(doc)


# ------------------------------------------------------------------------ EKS

# eksctl's ClusterConfig is not a Kubernetes kind: checked against the subset of its schema we use.
NODE_GROUP = {
    "type": "object",
    "required": ["name", "instanceType", "minSize", "maxSize", "desiredCapacity"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": "^[a-zA-Z][-a-zA-Z0-9]*$"},
        "instanceType": {"type": "string"},
        "amiFamily": {"enum": ["AmazonLinux2023", "AmazonLinux2", "Bottlerocket", "Ubuntu2404"]},
        "availabilityZones": {"type": "array", "items": {"type": "string"}},
        "minSize": {"type": "integer", "minimum": 0},
        "maxSize": {"type": "integer", "minimum": 1},
        "desiredCapacity": {"type": "integer", "minimum": 0},
        "volumeSize": {"type": "integer", "minimum": 20},
        "volumeType": {"enum": ["gp2", "gp3", "io1"]},
        "privateNetworking": {"type": "boolean"},
        "efaEnabled": {"type": "boolean"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "taints": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "effect"],
                "additionalProperties": False,
                "properties": {
                    "key": {"type": "string"},
                    "value": {"type": "string"},
                    "effect": {"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
                },
            },
        },
    },
}
CLUSTER_CONFIG = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "managedNodeGroups"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "eksctl.io/v1alpha5"},
        "kind": {"const": "ClusterConfig"},
        "metadata": {
            "type": "object",
            "required": ["name", "region"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string"},
                "region": {"type": "string", "pattern": "^[a-z]{2}-[a-z]+-[0-9]$"},
                "version": {"type": "string", "pattern": r"^1\.[0-9]+$"},
                "tags": {"type": "object"},
            },
        },
        "iam": {"type": "object", "properties": {"withOIDC": {"type": "boolean"}}},
        "availabilityZones": {"type": "array", "items": {"type": "string"}},
        "addons": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string"},
                    "version": {"type": "string"},
                    "wellKnownPolicies": {"type": "object"},
                    "attachPolicyARNs": {
                        "type": "array",
                        "items": {"type": "string", "pattern": "^arn:aws:iam::"},
                    },
                },
            },
        },
        "managedNodeGroups": {"type": "array", "minItems": 1, "items": NODE_GROUP},
    },
}


def test_eksctl_cluster_config():
    (config,) = load_docs(DEPLOY / "eks/cluster.yaml")
    jsonschema.validate(config, CLUSTER_CONFIG)
    groups = {g["name"]: g for g in config["managedNodeGroups"]}
    gpu = groups["gpu-p5"]
    assert gpu["instanceType"] == "p5.48xlarge" and gpu["efaEnabled"] is True
    assert len(gpu["availabilityZones"]) == 1  # EFA: one Availability Zone
    assert set(gpu["availabilityZones"]) <= set(config["availabilityZones"])
    assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in gpu["taints"]
    assert "aws-fsx-csi-driver" in {a["name"] for a in config["addons"]}


def test_eks_storage_is_valid_without_kubectl():
    storage = DEPLOY / "eks/storage"
    kustomization = yaml.safe_load((storage / "kustomization.yaml").read_text())
    for name in kustomization["resources"]:
        for doc in load_docs(storage / name):
            validate_strict(doc)


# ------------------------------------------------------------------------ images


def dockerfile(name: str) -> tuple[str, list[tuple[str, str]]]:
    text = (DEPLOY / "docker" / name).read_text()
    logical = re.sub(r"\\\n", " ", text)
    instructions = [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
        for line in (raw.strip() for raw in logical.splitlines())
        if line and not line.startswith("#")
    ]
    return text, instructions


def test_control_plane_dockerfile():
    _, ins = dockerfile("control-plane.Dockerfile")
    froms = [arg for op, arg in ins if op == "FROM"]
    args = {arg.split("=", 1)[0]: arg.split("=", 1)[1] for op, arg in ins if op == "ARG" and "=" in arg}
    assert args["PYTHON_IMAGE"].startswith("python:3.11-slim")
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]
    assert any(op == "RUN" and "pip install ." in arg for op, arg in ins)
    users = [arg for op, arg in ins if op == "USER"]
    assert users and not users[-1].startswith(("root", "0"))
    assert ("ENTRYPOINT", '["ftplane"]') in ins and ("CMD", '["serve"]') in ins
    copied = {arg.split()[0] for op, arg in ins if op == "COPY" and not arg.startswith("--from")}
    for path in copied - {"pyproject.toml"}:
        assert (ROOT / path).exists(), path
    assert ("EXPOSE", "8000") in ins


def test_trainer_dockerfile():
    text, ins = dockerfile("trainer.Dockerfile")
    args = {arg.split("=", 1)[0]: arg.split("=", 1)[1] for op, arg in ins if op == "ARG" and "=" in arg}
    assert "pytorch" in args["BASE_IMAGE"]
    assert any(op == "RUN" and "nvidia-resiliency-ext" in arg for op, arg in ins)
    assert ("COPY", "trainer /opt/ftplane/trainer") in ins
    assert "efa_installer.sh" in text and "EFA" in text
    assert (ROOT / "trainer" / "__main__.py").exists()


# ------------------------------------------------------------------------ examples

EXAMPLES = sorted([*ROOT.glob("examples/*-k8s*.yaml"), *ROOT.glob("examples/eks-*.yaml")])


def test_there_are_kubernetes_examples():
    assert {p.name for p in EXAMPLES} >= {"eks-llama.yaml", "tiny-k8s.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_specs_are_valid_and_render_valid_manifests(path):
    spec = JobSpec.model_validate(yaml.safe_load(path.read_text()))
    assert spec.backend == "kubernetes" and spec.image
    role = by_kind(load_docs(KUSTOMIZE / "base/rbac.yaml"), "Role")["ftplane-jobs"]
    assert spec.namespace == role["metadata"]["namespace"]  # the worker may run it there
    if spec.checkpoint.pvc:
        (pvc,) = load_docs(DEPLOY / "eks/storage/checkpoints-pvc.yaml")
        assert spec.checkpoint.pvc == pvc["metadata"]["name"]
    text = KubernetesBackend().render(make_request(spec))
    for doc in yaml.safe_load_all(text):
        if doc:
            validate_strict(doc)


def test_eks_example_is_the_two_node_gpu_job():
    spec = JobSpec.model_validate(yaml.safe_load((ROOT / "examples/eks-llama.yaml").read_text()))
    assert (spec.nodes, spec.procs_per_node, spec.resources.gpus_per_node) == (2, 8, 8)
    assert spec.resources.efa_per_node == 32
    assert spec.checkpoint.dir and spec.checkpoint.pvc == "fsx-checkpoints"
    assert spec.resiliency.exclude_failed_nodes
