"""The fake's node provisioning: what shapes of node a cluster can offer, and Karpenter's NodePools.

A managed node group is nodes that exist (`add_node`; the default GPU node has huge pages allocatable, as
an EKS p5 group configured for them does). A Karpenter NodePool (`add_node_pool`) offers instance types, each
with the capacity Karpenter's AWS provider computes for it (cpu, memory, pods, ephemeral-storage,
nvidia.com/gpu, vpc.amazonaws.com/efa: no huge pages), its labels and the pool's taints. `provision()` is
Karpenter's provisioner: for each pod the scheduler left Unschedulable it launches a node of the first
instance type that fits the pod's requests, node selector, affinity and tolerations; when none of a pool's
does, it records what Karpenter records on the pod (kubernetes-sigs/karpenter, pkg/controllers/provisioning/
scheduling/events.go, PodFailedToScheduleEvent): a Warning `FailedScheduling` Event from `karpenter`,
"Failed to schedule pod, incompatible with nodepool "<name>", daemonset overhead={...}, no instance type
satisfied resources {...} and requirements ...".

Disruption (https://karpenter.sh/docs/concepts/disruption/): a pool's `expire_after_s` is forceful: once a node
has lived that long Karpenter drains and deletes it, and `karpenter.sh/do-not-disrupt` on its pods does not
stop it ("It does not block expiration, repair, or forceful termination",
https://karpenter.sh/docs/reference/annotations/); consolidation (`consolidate`) is voluntary and skips a node
whose pods say do-not-disrupt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tests.fake_kubernetes.cluster import Cluster
from tests.fake_kubernetes.scheduler import affinity_allows, pod_requests, quantity, tolerates

DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
DISRUPTED_TAINT = {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
P5_CAPACITY = {  # Karpenter's AWS provider for p5.48xlarge: no hugepages-* among them
    "cpu": "192",
    "memory": "2000Gi",
    "pods": "100",
    "ephemeral-storage": "450Gi",
    "nvidia.com/gpu": "8",
    "vpc.amazonaws.com/efa": "32",
}


@dataclass(frozen=True)
class InstanceType:
    name: str
    capacity: dict[str, str]
    zones: tuple[str, ...] = ("us-west-2a", "us-west-2b", "us-west-2c")


@dataclass
class NodePool:
    name: str
    instance_types: list[InstanceType]
    taints: list[dict[str, Any]] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    expire_after_s: float | None = None
    launched: int = 0


class Provisioning(Cluster):
    """The cluster, with Karpenter's NodePools launching and disrupting nodes."""

    def __init__(self, nodes: list[str] | None = None) -> None:
        super().__init__(nodes)
        self.node_pools: dict[str, NodePool] = {}
        self._launched_at: dict[str, datetime] = {}

    def add_node_pool(self, name: str, instance_types: list[InstanceType], **options: Any) -> NodePool:
        pool = self.node_pools[name] = NodePool(name, instance_types, **options)
        return pool

    def _candidates(self, pool: NodePool) -> list[tuple[InstanceType, str, dict[str, str]]]:
        out = []
        for it in pool.instance_types:
            for zone in it.zones:
                labels = {
                    "node.kubernetes.io/instance-type": it.name,
                    "topology.kubernetes.io/zone": zone,
                    "karpenter.sh/nodepool": pool.name,
                    "karpenter.sh/capacity-type": "on-demand",
                    **pool.labels,
                }
                out.append((it, zone, labels))
        return out

    def _fits(self, pod: dict[str, Any], pool: NodePool, it: InstanceType, labels: dict[str, str]) -> bool:
        if any(not tolerates(pod["spec"].get("tolerations") or [], t) for t in pool.taints):
            return False
        probe = {"metadata": {"name": "probe", "labels": labels}}  # matchFields (metadata.name) do not apply yet
        spec = dict(pod["spec"])
        affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        if affinity:
            terms = [{k: v for k, v in t.items() if k != "matchFields"} for t in affinity["nodeSelectorTerms"]]
            spec["affinity"] = {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
            }
        if not affinity_allows({"spec": spec}, probe):
            return False
        capacity = {k: quantity(v) for k, v in it.capacity.items()}
        return all(capacity.get(k, 0.0) >= v for k, v in pod_requests(pod).items() if v > 0)

    def provision(self) -> list[str]:
        """Karpenter's provisioner, once over the pending pods: the nodes it launched."""
        launched = []
        with self.lock:
            for (p, _, _), pod in list(self.objects.items()):
                if p != "pods" or pod["status"].get("phase") != "Pending" or pod["spec"].get("nodeName"):
                    continue
                cond: dict[str, Any] = next(
                    (c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"), {}
                )
                if cond.get("reason") != "Unschedulable":
                    continue
                node = self._launch_for(pod)
                if node is not None:
                    launched.append(node)
                    self.schedule_pod(pod)
        return launched

    def _launch_for(self, pod: dict[str, Any]) -> str | None:
        refusals = []
        for pool in self.node_pools.values():
            for it, _zone, labels in self._candidates(pool):
                if self._fits(pod, pool, it, labels):
                    pool.launched += 1
                    name = f"{pool.name}-{it.name.replace('.', '-')}-{pool.launched}"
                    self.add_node(name, labels=labels, taints=list(pool.taints), allocatable=dict(it.capacity))
                    self._launched_at[name] = self.now()
                    return name
            refusals.append(pool)
        if refusals:
            requests = {k: _quantity_text(v) for k, v in sorted(pod_requests(pod).items())}
            selector = pod["spec"].get("nodeSelector") or {}
            said = "; ".join(
                f'incompatible with nodepool "{pool.name}", daemonset overhead={{"cpu":"200m","memory":"256Mi",'
                f'"pods":"5"}}, no instance type satisfied resources {json.dumps(requests, separators=(",", ":"))} '
                f"and requirements karpenter.sh/nodepool In [{pool.name}], "
                + ", ".join(f"{k} In [{v}]" for k, v in sorted(selector.items()))
                + " (no instance type has enough resources)"
                for pool in refusals
            )
            self.event(pod, "FailedScheduling", f"Failed to schedule pod, {said}", "Warning", component="karpenter")
        return None

    # --- disruption

    def _tick(self) -> None:
        super()._tick()
        now = self.now()
        for pool in self.node_pools.values():
            if pool.expire_after_s is None:
                continue
            for name, at in list(self._launched_at.items()):
                node = self.objects.get(("nodes", "", name))
                if node is None or node["metadata"]["labels"].get("karpenter.sh/nodepool") != pool.name:
                    continue
                if now >= at + timedelta(seconds=pool.expire_after_s):
                    del self._launched_at[name]
                    self.event(node, "Expired", f"Disrupting Node: Expired/{pool.name}", component="karpenter")
                    self.drain(name, taint=dict(DISRUPTED_TAINT))  # forceful: do-not-disrupt is no shield

    def consolidate(self, node: str) -> bool:
        """Voluntary disruption of one node (consolidation or drift): skipped while a pod on it says
        do-not-disrupt. True when the node was drained."""
        with self.lock:
            for (p, _, _), pod in self.objects.items():
                if p != "pods" or pod["spec"].get("nodeName") != node:
                    continue
                protected = (pod["metadata"].get("annotations") or {}).get(DO_NOT_DISRUPT) == "true"
                if protected and pod["status"].get("phase") in ("Pending", "Running"):
                    return False
            self.drain(node, taint=dict(DISRUPTED_TAINT))
            return True


def _quantity_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
