"""Where an attempt's pods may run: the pod spec's scheduling fields, from the spec and the nodes excluded.

- tolerations: the GPU taint (`nvidia.com/gpu`, GPU pods), the spec's own, and the not-ready and
  unreachable tolerations at Kubernetes' own 300 s (NOT_READY_TOLERATION_S, what the DefaultTolerationSeconds
  admission plugin gives every pod): a kubelet that stops posting its status for 30 s (an API server
  hiccup, a control-plane upgrade, a flaky link) leaves its containers training, and pods must not be
  deleted for that. A spec that wants its pods gone sooner gives its own toleration for those taints;
  meanwhile a node whose agent still reports is alive (workers/supervision/reconcile_attempts.py);
- node selector (the spec's labels and zone) and one required node-affinity term: the spec's
  requirements on node labels, and `matchFields metadata.name NotIn` the nodes the job excluded and the
  fleet's quarantined nodes (api/services/node_reputation);
- priority class, service account, image pull secrets.

The exclusion list is bounded: the newest MAX_EXCLUDED_NODES excluded nodes are kept out (older ones
are forgiven: on EKS a broken node is usually replaced by a new one with another name). When the
exclusions, with the spec's own constraints, leave too few nodes, the pods stay Pending and the pending
cause names the excluded nodes; `resiliency.pending_timeout_s` then ends the attempt.
"""

from __future__ import annotations

from typing import Any

from api.schemas.spec import JobSpec

GPU_RESOURCE = "nvidia.com/gpu"
NOT_READY_TOLERATION_S = 300
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
MAX_EXCLUDED_NODES = 64
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


def excluded(excluded_nodes: tuple[str, ...], spec: JobSpec) -> list[str]:
    """The nodes kept out of this attempt: the newest MAX_EXCLUDED_NODES the job excluded, sorted."""
    if not spec.resiliency.exclude_failed_nodes:
        return []
    newest = list(dict.fromkeys(reversed(excluded_nodes)))[:MAX_EXCLUDED_NODES]
    return sorted(newest)


def tolerations(spec: JobSpec) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if spec.resources.gpus_per_node:
        out.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    own = [t.manifest() for t in spec.scheduling.tolerations]
    out += own
    for key in NOT_READY_TAINTS:
        if not any(t.get("key") == key and t.get("effect") in (None, "NoExecute") for t in own):
            out.append(
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": NOT_READY_TOLERATION_S}
            )
    return out


def affinity(spec: JobSpec, excluded_nodes: list[str]) -> dict[str, Any] | None:
    term: dict[str, Any] = {}
    if spec.scheduling.affinity:
        term["matchExpressions"] = [r.manifest() for r in spec.scheduling.affinity]
    if excluded_nodes:
        term["matchFields"] = [{"key": "metadata.name", "operator": "NotIn", "values": excluded_nodes}]
    if not term:
        return None
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def pod_fields(spec: JobSpec, excluded_nodes: tuple[str, ...], quarantined: tuple[str, ...] = ()) -> dict[str, Any]:
    """The pod spec's scheduling fields for this attempt: the fleet's `quarantined` nodes are kept out as well,
    whatever the spec says of exclusions (hot spares included: they are pods of the same template)."""
    sched = spec.scheduling
    out: dict[str, Any] = {"tolerations": tolerations(spec)}
    node_labels = sched.node_labels()
    if node_labels:
        out["nodeSelector"] = node_labels
    found = affinity(spec, sorted(set(excluded(excluded_nodes, spec)) | set(quarantined)))
    if found:
        out["affinity"] = found
    if sched.priority_class:
        out["priorityClassName"] = sched.priority_class
    if sched.service_account:
        out["serviceAccountName"] = sched.service_account
    if sched.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": name} for name in sched.image_pull_secrets]
    return out


def instance_type(spec: JobSpec) -> str | None:
    """The instance type the spec pins its pods to, if it does (node selector, or an In affinity of one value)."""
    selected = spec.scheduling.node_selector.get(INSTANCE_TYPE_LABEL)
    if selected:
        return selected
    for req in spec.scheduling.affinity:
        if req.key == INSTANCE_TYPE_LABEL and req.operator == "In" and len(req.values) == 1:
            return req.values[0]
    return None


def node_selector(spec: JobSpec) -> str:
    """A label selector for the nodes the pods may run on (for reading their health): the spec's node labels."""
    return ",".join(f"{k}={v}" for k, v in sorted(spec.scheduling.node_labels().items()))
