"""What one attempt of a job is on Kubernetes, as plain manifests (dicts), with no API calls.

Per attempt: an Indexed `batch/v1` Job (one pod per node and per hot spare, the node
agent and `ft_launcher` in each; what a pod's failure means is its `podFailurePolicy`,
`policy`) and a headless Service that gives the pods stable DNS names for the
rendezvous. Where the pods may run is `placement`; what EFA needs is `efa`.
Per attempt too: a Secret holding the trainer token, referenced by the pods, never
rendered with its value, owned by the attempt's Job (deleting the Job deletes it: the
worker may create Secrets, never read, change or delete one). The spec's `secret_env`
are references to the user's own Secrets, never values.

Every pod carries `karpenter.sh/do-not-disrupt: "true"`: Karpenter does not drain a
node for consolidation, drift or expiry while training runs on it (a spot interruption
still does: that is a preemption, `failures`).

`render` writes them as YAML for people (`ftplane render`), the token Secret named, not shown.

Names are DNS-1123 labels of at most 63 characters; long or unusual job ids
are shortened with a hash so every name stays unique and valid.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import yaml

from api.schemas import kubernetes_names as names
from api.schemas.kubernetes_names import COMPLETION_INDEX_LABEL as COMPLETION_INDEX_LABEL
from api.schemas.kubernetes_names import CONTAINER_NAME as CONTAINER_NAME
from api.schemas.kubernetes_names import LABEL_ATTEMPT as LABEL_ATTEMPT
from api.schemas.kubernetes_names import LABEL_JOB_ID as LABEL_JOB_ID
from api.schemas.kubernetes_names import LABEL_JOB_NAME as LABEL_JOB_NAME
from api.schemas.kubernetes_names import attempt_selector as attempt_selector
from api.schemas.kubernetes_names import job_id_label as job_id_label
from api.schemas.kubernetes_names import job_selector as job_selector
from api.schemas.kubernetes_spec import DO_NOT_DISRUPT
from api.schemas.spec import JobSpec
from ftplane.contract import Env
from workers.backends.base import LaunchRequest, agent_environment, launcher_arguments
from workers.backends.checkpoint_storage import claim_mounts, on_claim, on_shared_directory
from workers.backends.kubernetes import efa, placement, policy, rendezvous

MANAGED_BY = "ftplane"
ANNOTATION_JOB_ID = "ftplane.io/job-id"
ANNOTATION_RENDEZVOUS = "ftplane.io/rendezvous"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"

AGENT_COMMAND = ("ftplane-agent", "--")
AGENT_DIR = "/tmp/ftplane-agent"
RDZV_PORT = 29500
TOKEN_KEY = "token"
GPU_RESOURCE = placement.GPU_RESOURCE
EFA_RESOURCE = efa.EFA_RESOURCE
SHM_VOLUME = "dshm"
CHECKPOINT_VOLUME = "checkpoints"
DEFAULT_CLUSTER_DOMAIN = "cluster.local"

# A pod's hostname is "<job name>-<completion index>" and must stay a DNS label
# (<= 63): the attempt's Job name is kept to 52 characters, leaving room for
# "-16383" (JobSpec allows 16,384 nodes) with margin.
_BASE_MAX = 44  # "<base>-a<attempt up to 10000>" <= 51
_ID_MAX = 20
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def _slug(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


def base_name(job_id: str, job_name: str) -> str:
    """The stem of every object name of a job: "<spec name>-<job id>" (the id hashed when long or unusual).

    Starts with a letter, so it is also a valid DNS-1035 label (Service names need that).
    """
    ident = job_id if len(job_id) <= _ID_MAX and _DNS_LABEL.match(job_id) else _digest(job_id, 10)
    room = _BASE_MAX - len(ident) - 1
    prefix = _slug(job_name)[:room].strip("-") or "job"
    if not prefix[0].isalpha():
        prefix = ("j" + prefix)[:room].rstrip("-")
    return f"{prefix}-{ident}"


def attempt_name(job_id: str, job_name: str, attempt: int) -> str:
    """Name of the attempt's Job and of its headless Service."""
    return f"{base_name(job_id, job_name)}-a{attempt}"


def secret_name(job_id: str, job_name: str, attempt: int) -> str:
    """Name of the attempt's token Secret."""
    return f"{attempt_name(job_id, job_name, attempt)}-token"


def rendezvous_host(
    job_id: str,
    spec: JobSpec,
    attempt: int,
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
) -> str:
    """DNS name of the pod of completion index 0, which hosts the c10d rendezvous store.

    The fully qualified form is what the pod's own /etc/hosts lists as its canonical
    name, so torch's c10d backend recognises itself as the host on rank 0 without
    waiting for cluster DNS to publish the record.
    """
    name = attempt_name(job_id, spec.name, attempt)
    return f"{name}-0.{name}.{spec.namespace}.svc.{cluster_domain}"


def pod_index_for_rank(spec: JobSpec, rank: int) -> int:
    """Completion index of the pod that hosts global `rank` (api/schemas/kubernetes_names.py says how)."""
    return names.pod_index_for_rank(spec.nodes, spec.procs_per_node, rank)


def labels_for(job_id: str, spec: JobSpec, attempt: int | None) -> dict[str, str]:
    labels = dict(spec.labels)
    labels.update(
        {
            "app.kubernetes.io/name": "ftplane-job",
            "app.kubernetes.io/managed-by": MANAGED_BY,
            LABEL_JOB_ID: job_id_label(job_id),
            LABEL_JOB_NAME: spec.name,
        }
    )
    if attempt is not None:
        labels[LABEL_ATTEMPT] = str(attempt)
    return labels


def _escape(arg: str) -> str:
    # Kubernetes expands $(VAR) in command/args; the local backend does not. Keep them literal.
    return arg.replace("$(", "$$(")


def _resources(spec: JobSpec) -> dict[str, Any]:
    res = spec.resources
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    requests["ephemeral-storage"] = res.ephemeral_storage  # the agent's and the ranks' output on the node's disk
    if res.cpu:
        requests["cpu"] = res.cpu
    if res.memory:
        requests["memory"] = limits["memory"] = res.memory
    if res.gpus_per_node:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(res.gpus_per_node)
    if res.efa_per_node:
        requests[EFA_RESOURCE] = limits[EFA_RESOURCE] = str(res.efa_per_node)
    for size, amount in sorted(res.hugepages.items()):
        requests[f"hugepages-{size}"] = limits[f"hugepages-{size}"] = amount  # huge pages: requests = limits
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _environment(request: LaunchRequest, master_addr: str) -> list[dict[str, Any]]:
    spec = request.spec
    claimed = spec.checkpoint.pvc and spec.checkpoint.dir
    checkpoints = on_claim(spec) if claimed else on_shared_directory(spec, request.job_id)
    values = {**efa.environment(spec), **agent_environment(request, checkpoints)}
    if spec.resiliency.spare_nodes:
        values["FTPLANE_SPARE_NODES"] = str(spec.resiliency.spare_nodes)
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values.items()]
    for name, ref in spec.secret_env.items():  # by reference: the value never passes through ftplane
        key_ref: dict[str, Any] = {"name": ref.secret, "key": ref.key}
        if ref.optional:
            key_ref["optional"] = True
        env.append({"name": name, "valueFrom": {"secretKeyRef": key_ref}})
    env += [
        # ft_launcher gives workers MASTER_ADDR=localhost; the trainer needs the real rank-0 host.
        {"name": Env.MASTER_ADDR, "value": master_addr},
        {"name": Env.NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "FTPLANE_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": Env.AGENT_DIR, "value": AGENT_DIR},
        {"name": Env.AGENT_ECHO, "value": "1"},  # the launcher's output in the container's log
        {"name": Env.STOP_GRACE_S, "value": str(spec.resiliency.stop_grace_s)},
        {
            "name": Env.TOKEN,
            "valueFrom": {
                "secretKeyRef": {"name": secret_name(request.job_id, spec.name, request.attempt), "key": TOKEN_KEY}
            },
        },
    ]
    return env


def job_manifest(
    request: LaunchRequest,
    *,
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
    ttl_after_finished_s: int | None = None,
) -> dict[str, Any]:
    """The attempt's Indexed Job: `nodes` (+ spares) pods, each running ft_launcher for `procs_per_node` ranks."""
    spec = request.spec
    name = attempt_name(request.job_id, spec.name, request.attempt)
    host = rendezvous_host(request.job_id, spec, request.attempt, cluster_domain)
    labels = labels_for(request.job_id, spec, request.attempt)
    annotations = {ANNOTATION_JOB_ID: request.job_id, ANNOTATION_RENDEZVOUS: f"{host}:{RDZV_PORT}"}
    pod_annotations = {**spec.scheduling.annotations, **annotations, DO_NOT_DISRUPT: "true"}
    spares = spec.resiliency.spare_nodes
    # With hot spares the rendezvous takes `nodes` active nodes and keeps the rest standing by (NVRx 0.6+).
    nnodes = f"{spec.nodes}:{spec.nodes + spares}" if spares else spec.nodes
    launcher = launcher_arguments(
        spec,
        nnodes=nnodes,
        rdzv_endpoint=f"{host}:{RDZV_PORT}",
        rdzv_id=name,
        log_dir=f"{AGENT_DIR}/ranks",
        extra=rendezvous.launcher_flags(spec),
    )
    # The node agent is the entrypoint; it starts ft_launcher. `command`, not `args`: a user's image may have any
    # entrypoint (the EFA check runs as an init container in every EFA pod).
    command = [*AGENT_COMMAND, *launcher]

    mounts: list[dict[str, Any]] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    shm: dict[str, Any] = {"medium": "Memory"}
    if spec.resources.shm:
        shm["sizeLimit"] = spec.resources.shm
    volumes: list[dict[str, Any]] = [{"name": SHM_VOLUME, "emptyDir": shm}]
    if spec.checkpoint.pvc and spec.checkpoint.dir:
        mounts += claim_mounts(spec, request.job_id, CHECKPOINT_VOLUME)  # the job's own directory of the claim
        claim = {"claimName": spec.checkpoint.pvc}
        volumes.append({"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": claim})

    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [_escape(arg) for arg in command],
        "env": _environment(request, host),
        **({"workingDir": spec.working_dir} if spec.working_dir else {}),
        "ports": [{"name": "rdzv", "containerPort": RDZV_PORT, "protocol": "TCP"}],
        "volumeMounts": mounts,
        # the last lines of the output, when the agent leaves no message: a failure's cause says why
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    resources = _resources(spec)
    if resources:
        container["resources"] = resources
    security = efa.capabilities(spec)
    if security:
        container["securityContext"] = security

    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": name,  # with the Job controller's hostname "<job>-<index>": stable per-pod DNS
        "automountServiceAccountToken": False,  # the trainer talks to ftplane over HTTP, not to Kubernetes
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": rendezvous.termination_grace_s(spec),
        "containers": [container],
        "volumes": volumes,
        **placement.pod_fields(spec, request.excluded_nodes, request.quarantined_nodes),
    }
    check = efa.check_container(spec)
    if check:
        pod_spec["initContainers"] = [check]

    queue_labels, queue_spec = policy.queue_fields(spec)
    job_spec: dict[str, Any] = {
        **policy.failure_policy(spec, container=CONTAINER_NAME, efa_check=check is not None),
        **queue_spec,
        "template": {"metadata": {"labels": labels, "annotations": pod_annotations}, "spec": pod_spec},
    }
    if ttl_after_finished_s is not None:
        job_spec["ttlSecondsAfterFinished"] = ttl_after_finished_s
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": spec.namespace,
            "labels": {**labels, **queue_labels},
            "annotations": annotations,
        },
        "spec": job_spec,
    }


def service_manifest(request: LaunchRequest, owner_uid: str | None = None) -> dict[str, Any]:
    """Headless Service naming the attempt's pods; owned by the attempt's Job once that exists."""
    spec = request.spec
    name = attempt_name(request.job_id, spec.name, request.attempt)
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": spec.namespace,
        "labels": labels_for(request.job_id, spec, request.attempt),
    }
    if owner_uid:
        metadata["ownerReferences"] = [owner_reference(name, owner_uid)]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # rendezvous happens before anything is "ready"
            "selector": {
                LABEL_JOB_ID: job_id_label(request.job_id),
                LABEL_ATTEMPT: str(request.attempt),
            },
            "ports": [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"}],
        },
    }


def owner_reference(job_name: str, job_uid: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": job_uid}


def secret_manifest(request: LaunchRequest, owner_uid: str | None = None) -> dict[str, Any]:
    """The attempt's Secret with the trainer token, owned by the attempt's Job once that exists."""
    spec = request.spec
    metadata: dict[str, Any] = {
        "name": secret_name(request.job_id, spec.name, request.attempt),
        "namespace": spec.namespace,
        "labels": labels_for(request.job_id, spec, request.attempt),
        "annotations": {ANNOTATION_JOB_ID: request.job_id},
    }
    if owner_uid:
        metadata["ownerReferences"] = [
            owner_reference(attempt_name(request.job_id, spec.name, request.attempt), owner_uid)
        ]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": metadata,
        "stringData": {TOKEN_KEY: request.token},
    }


class _NoAliasDumper(yaml.SafeDumper):
    """YAML for people: repeated label maps are written out, not as &anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(
    request: LaunchRequest,
    *,
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
    ttl_after_finished_s: int | None = None,
) -> str:
    """The attempt's manifests as multi-document YAML; the token Secret is named, never shown."""
    spec = request.spec
    header = (
        f"# ftplane job {request.job_id}, attempt {request.attempt}, namespace {spec.namespace}.\n"
        f"# Secret {secret_name(request.job_id, spec.name, request.attempt)} (key {TOKEN_KEY}) holds FTPLANE_TOKEN;\n"
        "# ftplane creates it at launch, and it and the Service get an ownerReference to the Job then.\n"
    )
    for env_name, ref in spec.secret_env.items():
        header += f"# {env_name} comes from your Secret {ref.secret} (key {ref.key}) in {spec.namespace}.\n"
    docs = [
        job_manifest(request, cluster_domain=cluster_domain, ttl_after_finished_s=ttl_after_finished_s),
        service_manifest(request),
    ]
    return header + yaml.dump_all(docs, Dumper=_NoAliasDumper, sort_keys=False, explicit_start=True)
