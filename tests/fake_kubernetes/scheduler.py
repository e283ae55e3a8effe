"""The fake's nodes (Node objects) and scheduler: pods are bound to nodes that fit them, as kube-scheduler's
filters decide it, in its order (unschedulable, taints, node selector and affinity, resources); a pod no
node fits stays Pending with the scheduler's own words:

    0/4 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: true}, 3 Insufficient
    nvidia.com/gpu. preemption: 0/4 nodes are available: 1 Preemption is not helpful for scheduling, 3 No
    preemption victims found for incoming pod.

Its preemption part says, per node, whether evicting lower-priority pods could ever help: a node refused by a
filter that is UnschedulableAndUnresolvable (unschedulable, an untolerated taint, the node selector or
affinity) is "not helpful"; one short of a resource is "no victims" (preemption was tried) as kube-scheduler
up to 1.33 says, even where the request exceeds the node's whole allocatable. From 1.34
(kubernetes/kubernetes#131345) such a node is "not helpful" too: `capacity_unresolvable` plays that scheduler.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from tests.fake_kubernetes.jobs import JobController

GPU_NODE_ALLOCATABLE = {
    "cpu": "190",
    "memory": "1900Gi",
    "pods": "110",
    "ephemeral-storage": "450Gi",
    "hugepages-2Mi": "20Gi",
    "hugepages-1Gi": "0",
    "nvidia.com/gpu": "8",
    "vpc.amazonaws.com/efa": "32",
}
NO_VICTIMS = "No preemption victims found for incoming pod"
# conditions the EKS node monitoring agent keeps on a node, healthy
EKS_CONDITIONS = ("AcceleratedHardwareReady", "ContainerRuntimeReady", "KernelReady", "NetworkingReady", "StorageReady")
_UNITS = {
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}


def quantity(text: str | int | float) -> float:
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    if not m:
        raise ValueError(f"not a quantity: {text!r}")
    return float(m.group(1)) * _UNITS.get(m.group(2), 1.0)


def pod_requests(pod: dict[str, Any]) -> dict[str, float]:
    """What a pod asks of a node: its containers' requests summed (the largest init container's, if more)."""
    total: dict[str, float] = {}
    spec = pod.get("spec", {})
    for c in spec.get("containers") or []:
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[k] = total.get(k, 0.0) + quantity(v)
    for c in spec.get("initContainers") or []:
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[k] = max(total.get(k, 0.0), quantity(v))
    total["pods"] = total.get("pods", 0.0) + 1
    return total


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for t in tolerations or []:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t["key"] == taint["key"]:
                return True
        elif t.get("key") == taint["key"] and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _requirement_holds(req: dict[str, Any], value: str | None, present: bool) -> bool:
    op, values = req["operator"], req.get("values") or []
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and value is not None:
        return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
    return False


def affinity_allows(pod: dict[str, Any], node: dict[str, Any]) -> bool:
    labels = node["metadata"].get("labels") or {}
    spec = pod["spec"]
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}
    for term in required.get("nodeSelectorTerms") or []:  # terms are ORed, requirements within one ANDed
        exprs = all(
            _requirement_holds(r, labels.get(r["key"]), r["key"] in labels) for r in term.get("matchExpressions") or []
        )
        flds = all(
            _requirement_holds(r, fields.get(r["key"]), r["key"] in fields) for r in term.get("matchFields") or []
        )
        if exprs and flds:
            return True
    return False


def _taint_text(taint: dict[str, Any]) -> str:
    return "{" + f"{taint['key']}: {taint.get('value', '')}" + "}"


class Scheduler(JobController):
    """Nodes, and binding pods to them."""

    capacity_unresolvable = False  # kube-scheduler 1.34+: a request beyond a node's allocatable is unresolvable

    def add_node(
        self,
        name: str,
        *,
        labels: dict[str, str] | None = None,
        taints: list[dict[str, Any]] | None = None,
        allocatable: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        ts = self.ts()
        conditions = [
            {
                "type": t,
                "status": "False",
                "reason": f"KubeletHas{r}",
                "lastHeartbeatTime": ts,
                "lastTransitionTime": ts,
            }
            for t, r in (
                ("MemoryPressure", "SufficientMemory"),
                ("DiskPressure", "NoDiskPressure"),
                ("PIDPressure", "SufficientPID"),
            )
        ]
        conditions.append(
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": ts,
                "lastTransitionTime": ts,
            }
        )
        conditions += [
            {
                "type": t,
                "status": "True",
                "reason": f"{t[:-5]}IsReady",
                "message": f"Monitoring for the {t[:-5]} system is active",
                "lastHeartbeatTime": ts,
                "lastTransitionTime": ts,
            }
            for t in EKS_CONDITIONS
        ]
        alloc = dict(GPU_NODE_ALLOCATABLE if allocatable is None else allocatable)
        node = {
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "node.kubernetes.io/instance-type": "p5.48xlarge",
                    "topology.kubernetes.io/zone": "us-west-2c",
                    **(labels or {}),
                },
            },
            "spec": {"taints": list(taints or [])},
            "status": {"capacity": dict(alloc), "allocatable": alloc, "conditions": conditions},
        }
        return self.create("nodes", "", node)

    def node(self, name: str) -> dict[str, Any]:
        return self.objects[("nodes", "", name)]

    @property
    def nodes(self) -> list[str]:
        return sorted(name for (p, _, name) in self.objects if p == "nodes")

    def _used(self) -> dict[str, Counter[str]]:
        used: dict[str, Counter[str]] = {}
        for (p, _, _), pod in self.objects.items():
            node = pod.get("spec", {}).get("nodeName") if p == "pods" else None
            if node and pod["status"].get("phase") in ("Pending", "Running"):
                used.setdefault(node, Counter()).update(pod_requests(pod))
        return used

    def _why_not(self, pod: dict[str, Any], node: dict[str, Any], used: Counter[str]) -> tuple[list[str], bool]:
        """Why the pod does not fit the node, as the first filter that refuses it says (none: it fits), and whether
        that is unresolvable (preemption could never make room)."""
        if node["spec"].get("unschedulable"):
            return ["node(s) were unschedulable"], True
        for taint in node["spec"].get("taints") or []:
            if taint["effect"] in ("NoSchedule", "NoExecute") and not tolerates(pod["spec"].get("tolerations"), taint):
                return [f"node(s) had untolerated taint {_taint_text(taint)}"], True
        if not affinity_allows(pod, node):
            return ["node(s) didn't match Pod's node affinity/selector"], True
        alloc = {k: quantity(v) for k, v in node["status"]["allocatable"].items()}
        wants = pod_requests(pod)
        short = [res for res, want in sorted(wants.items()) if want > 0 and used.get(res, 0) + want > alloc.get(res, 0)]
        never = self.capacity_unresolvable and any(wants[res] > alloc.get(res, 0) for res in short)
        return [f"Insufficient {res}".replace("Insufficient pods", "Too many pods") for res in short], never

    def schedule_pod(self, pod: dict[str, Any]) -> str | None:
        """Bind one pending pod to the first node that fits it, or leave it Pending with the scheduler's words."""
        used = self._used()
        reasons: Counter[str] = Counter()
        preemption: Counter[str] = Counter()
        nodes = [self.node(n) for n in self.nodes]
        for node in nodes:
            why, never = self._why_not(pod, node, used.get(node["metadata"]["name"], Counter()))
            if not why:
                name = node["metadata"]["name"]
                pod["spec"]["nodeName"] = name
                ts = self.ts()
                pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": ts}]
                pod["metadata"]["resourceVersion"] = str(next(self.rv))
                ns_name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
                self.event(
                    pod, "Scheduled", f"Successfully assigned {ns_name} to {name}", component="default-scheduler"
                )
                return str(name)
            reasons.update(why)
            preemption["Preemption is not helpful for scheduling" if never else NO_VICTIMS] += 1
        total = len(nodes)
        counts = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
        helps = ", ".join(f"{n} {why}" for why, n in sorted(preemption.items()))
        message = f"0/{total} nodes are available: {counts}. preemption: 0/{total} nodes are available: {helps}."
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastProbeTime": None,
                "lastTransitionTime": self.ts(),
            }
        ]
        pod["metadata"]["resourceVersion"] = str(next(self.rv))
        self.event(pod, "FailedScheduling", message, "Warning", component="default-scheduler")
        return None

    def schedule(self, job: str, ns: str) -> list[str]:
        """Try to bind each of the Job's unbound pending pods; the nodes they were bound to."""
        with self.lock:
            placed = []
            for pod in self.pods(job, ns):
                if pod["spec"].get("nodeName") or pod["status"].get("phase") != "Pending":
                    continue
                if pod["metadata"].get("deletionTimestamp"):
                    continue
                node = self.schedule_pod(pod)
                if node:
                    placed.append(node)
            return placed
