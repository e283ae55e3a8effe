"""deploy/: Kustomize renders strictly valid objects; EKS (what the GPU nodes need), images, examples. RBAC:
test_k8s_rbac.py."""

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
from tests.support.paths import REPO
from tests.workers.backends.kubernetes.deploy_files import DEPLOY, KUSTOMIZE, by_kind, load_docs
from tests.workers.backends.kubernetes.k8s_support import make_request, validate_strict
from workers.backends.kubernetes import KubernetesBackend

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
    assert parts["ftplane-api"]["serviceAccountName"] == "ftplane-api"  # reads pod logs only (rbac-logs.yaml)
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
def test_eks_overlays(tmp_path):
    eks = kustomize(KUSTOMIZE / "overlays/eks")
    api = by_kind(eks, "Deployment")["ftplane-api"]["spec"]["template"]["spec"]["containers"][0]
    assert api["image"].startswith("123456789012.dkr.ecr.us-west-2.amazonaws.com/ftplane-control-plane:")
    # no load balancer unless asked for: one needs the AWS Load Balancer Controller (port-forward otherwise)
    assert by_kind(eks, "Service")["ftplane-api"]["spec"]["type"] == "ClusterIP"
    pvc = by_kind(eks, "PersistentVolumeClaim")["fsx-checkpoints"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["metadata"]["namespace"] == "training"
    assert by_kind(eks, "StorageClass")["fsx-lustre"]["provisioner"] == "fsx.csi.aws.com"
    assert "aws-efa-k8s-device-plugin" in by_kind(eks, "DaemonSet")

    trial = kustomize(KUSTOMIZE / "overlays/eks-trial")
    (secret,) = [d for d in trial if d["kind"] == "Secret"]
    assert secret["metadata"]["name"].startswith("ftplane-secrets-")
    worker = by_kind(trial, "Deployment")["ftplane-worker"]["spec"]["template"]["spec"]["containers"][0]
    refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in worker["env"]}
    assert refs == {secret["metadata"]["name"]}  # the generated name is wired in
    assert {"ftplane-postgres", "ftplane-redis"} <= set(by_kind(trial, "Service"))
    # the trial database's claim names a StorageClass that exists: EKS has no default one
    (claim,) = by_kind(trial, "StatefulSet")["ftplane-postgres"]["spec"]["volumeClaimTemplates"]
    storage_class = by_kind(trial, "StorageClass")[claim["spec"]["storageClassName"]]
    assert storage_class["provisioner"] == "ebs.csi.aws.com"
    assert storage_class["volumeBindingMode"] == "WaitForFirstConsumer"


def with_components(tmp_path: Path, *components: str) -> list[dict[str, Any]]:
    """overlays/eks with optional components, rendered through a kustomization of the test's own."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(KUSTOMIZE / "overlays/eks", tmp_path)],
                "components": [os.path.relpath(KUSTOMIZE / "components" / c, tmp_path) for c in components],
            }
        )
    )
    return kustomize(tmp_path)


@needs_kubectl
def test_the_internal_load_balancer_is_an_option(tmp_path):
    docs = with_components(tmp_path, "internal-nlb")
    service = by_kind(docs, "Service")["ftplane-api"]
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["metadata"]["annotations"]["service.beta.kubernetes.io/aws-load-balancer-scheme"] == "internal"
    for doc in docs:
        validate_strict(doc)


@needs_kubectl
def test_node_remediation_is_off_by_default_and_brings_its_rbac(tmp_path):
    plain = kustomize(KUSTOMIZE / "overlays/eks")
    assert "FTPLANE_KUBE_UNHEALTHY_NODES" not in by_kind(plain, "ConfigMap")["ftplane-config"]["data"]
    assert not [r for d in plain if d["kind"] == "ClusterRole" for r in d["rules"] if "patch" in r["verbs"]]
    docs = with_components(tmp_path, "node-remediation")
    assert by_kind(docs, "ConfigMap")["ftplane-config"]["data"]["FTPLANE_KUBE_UNHEALTHY_NODES"] == "taint"
    role = by_kind(docs, "ClusterRole")["ftplane-node-remediation"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]
    binding = by_kind(docs, "ClusterRoleBinding")["ftplane-node-remediation"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ftplane-worker", "namespace": "ftplane"}]
    for doc in docs:
        validate_strict(doc)


# ------------------------------------------------------------------------ RBAC


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
                    "configurationValues": {"type": "string"},
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
    addons = {a["name"]: a for a in config["addons"]}
    assert "aws-fsx-csi-driver" in addons
    assert "eks-node-monitoring-agent" in addons  # the Node conditions ftplane reads (GPU Xid, ECC, ...)


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for t in tolerations or []:
        if t.get("effect") not in (None, taint["effect"]):
            continue
        if t.get("operator") == "Exists" and t.get("key") in (None, taint["key"]):
            return True
        if t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False


@needs_kubectl
def test_every_daemonset_the_gpu_nodes_need_tolerates_their_taints():
    """eksctl's EFA device plugin tolerates only aws.amazon.com/efa: on the tainted GPU nodes it never ran, EFA was
    never advertised, and a job asking for it stayed Pending for ever."""
    (config,) = load_docs(DEPLOY / "eks/cluster.yaml")
    gpu_groups = [g for g in config["managedNodeGroups"] if g.get("efaEnabled")]
    docs = kustomize(KUSTOMIZE / "overlays/eks")
    daemonsets = by_kind(docs, "DaemonSet")
    assert "aws-efa-k8s-device-plugin" in daemonsets  # it replaces eksctl's, of the same name
    for group in gpu_groups:
        node_labels = {"node.kubernetes.io/instance-type": group["instanceType"], **group.get("labels", {})}
        for name, ds in daemonsets.items():
            pod = ds["spec"]["template"]["spec"]
            terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"
            ]
            assert any(
                all(node_labels.get(e["key"]) in e["values"] for e in term["matchExpressions"]) for term in terms
            ), f"{name} does not select {group['name']}'s nodes"
            for taint in group["taints"]:
                assert tolerates(pod.get("tolerations"), taint), f"{name} does not tolerate {taint} of {group['name']}"
            assert tolerates(pod.get("tolerations"), {"key": "ftplane.dev/unhealthy", "effect": "NoSchedule"})
            image = pod["containers"][0]["image"]
            assert re.search(r":v\d+\.\d+\.\d+$", image), f"{name}: pin the image ({image})"
    # the add-ons' node DaemonSets on those nodes: the FSx node plugin is told to tolerate every taint
    fsx = next(a for a in config["addons"] if a["name"] == "aws-fsx-csi-driver")
    assert yaml.safe_load(fsx["configurationValues"]) == {"node": {"tolerateAllTaints": True}}


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
    assert any(op == "RUN" and 'pip install ".[server]"' in arg for op, arg in ins)
    users = [arg for op, arg in ins if op == "USER"]
    assert users and not users[-1].startswith(("root", "0"))
    assert ("ENTRYPOINT", '["ftplane"]') in ins and ("CMD", '["serve"]') in ins
    copied = {arg.split()[0] for op, arg in ins if op == "COPY" and not arg.startswith("--from")}
    for path in copied:
        assert (REPO / path).exists(), path
    assert ("EXPOSE", "8000") in ins


def test_trainer_dockerfile():
    text, ins = dockerfile("trainer.Dockerfile")
    args = {arg.split("=", 1)[0]: arg.split("=", 1)[1] for op, arg in ins if op == "ARG" and "=" in arg}
    assert "pytorch" in args["BASE_IMAGE"]
    assert any(op == "RUN" and "nvidia-resiliency-ext" in arg for op, arg in ins)
    # ftplane's base install (the node side: no control-plane extras), from the repository's own files
    assert ("COPY", "trainer /tmp/ftplane/trainer") in ins and ("COPY", "ftplane /tmp/ftplane/ftplane") in ins
    assert ("RUN", "pip install /tmp/ftplane && rm -rf /tmp/ftplane") in ins
    for op, arg in ins:
        if op == "COPY" and arg.endswith("/tmp/ftplane/"):
            assert all((REPO / path).exists() for path in arg.split()[:-1]), arg
    assert "efa_installer.sh" in text and "EFA" in text
    assert (REPO / "trainer" / "__main__.py").exists()
    # the EFA installer is pinned (a rebuild must not change the network stack), and latest is refused
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["EFA_INSTALLER_VERSION"])
    assert any(op == "RUN" and '"$EFA_INSTALLER_VERSION" = "latest"' in arg for op, arg in ins)
    env = " ".join(arg for op, arg in ins if op == "ENV")
    # what depends on the instance type is not baked in; what holds everywhere is
    assert "FI_EFA_USE_DEVICE_RDMA" not in env
    for setting in ("NCCL_NVLS_ENABLE=0", "FI_EFA_FORK_SAFE=1", "RDMAV_FORK_SAFE=1", "NCCL_NET_PLUGIN=ofi"):
        assert setting in env
    # finding 7: as AWS's sample on this NGC base, NGC's network stack goes before the EFA installer runs (its
    # libibverbs, HPC-X's Open MPI, the NCCL plugins it ships), and the installer's OFI plugin must be there
    (install,) = [arg for op, arg in ins if op == "RUN" and "efa_installer.sh" in arg]
    removed = install.index("libibverbs1"), install.index("nccl_rdma_sharp_plugin"), install.index("/opt/hpcx/ompi")
    assert max(removed) < install.index("efa_installer.sh") < install.index("libnccl-net-ofi.so")
    # the EFA check is the entrypoint: a pod asking for EFA without a loadable OFI plugin fails loudly
    assert ("COPY", "deploy/docker/efa-check.sh /opt/ftplane/bin/efa-check") in ins
    assert ("ENTRYPOINT", '["/opt/ftplane/bin/efa-check"]') in ins
    assert os.access(DEPLOY / "docker/efa-check.sh", os.X_OK)


# ------------------------------------------------------------------------ examples

EXAMPLES = sorted([*REPO.glob("examples/*-k8s*.yaml"), *REPO.glob("examples/eks-*.yaml")])


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
    spec = JobSpec.model_validate(yaml.safe_load((REPO / "examples/eks-llama.yaml").read_text()))
    assert (spec.nodes, spec.procs_per_node, spec.resources.gpus_per_node) == (2, 8, 8)
    assert spec.resources.efa_per_node == 32
    assert spec.checkpoint.dir and spec.checkpoint.pvc == "fsx-checkpoints"
    assert spec.resiliency.exclude_failed_nodes
