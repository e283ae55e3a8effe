"""Node health: what the Node objects say about the nodes an attempt runs on, read cheaply, and what ftplane
may do to a node it blamed.

`NodeHealth` keeps, per label selector (the spec's node labels), the states of the selected nodes from one
list served by the API server's cache (`resourceVersion=0`), read again at most every `refresh_s`, or
every `urgent_s` while an attempt's pod looks lost (not Ready, phase Unknown, being deleted): a 2,048-node
job does not cost 2,048 Node objects every pass. Only what health needs is kept (`NodeState`).

A node is unhealthy (`unhealthy`) when its Ready condition has been False (NotReady) or Unknown
(unreachable: the kubelet stopped reporting) for `grace_s`, or when a condition of the EKS node
monitoring agent (AcceleratedHardwareReady for GPU Xid and ECC errors, NetworkingReady, StorageReady,
KernelReady, ContainerRuntimeReady) is False. Its pods' failures are then the node's.

`remediate` optionally keeps other jobs off a blamed node: `cordon` (spec.unschedulable) or `taint`
(`ftplane.dev/unhealthy=true:NoSchedule`), as FTPLANE_KUBE_UNHEALTHY_NODES says; off by default, and the
worker's RBAC for it comes with deploy/kustomize/components/node-remediation only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from api.schemas.causes import Cause, CauseClass
from workers.backends.kubernetes.client import KubernetesApi, api_message
from workers.backends.kubernetes.failures import cause
from workers.backends.kubernetes.objects import parse_ts

log = logging.getLogger(__name__)

HEALTH_CONDITIONS = (
    "AcceleratedHardwareReady",
    "NetworkingReady",
    "StorageReady",
    "KernelReady",
    "ContainerRuntimeReady",
)
UNHEALTHY_TAINT = "ftplane.dev/unhealthy"
NOT_READY_GRACE_S = 30.0


@dataclass(frozen=True)
class NodeState:
    name: str
    ready: str  # the Ready condition's status: True, False (NotReady) or Unknown (unreachable)
    ready_since: datetime | None
    ready_said: str
    broken: tuple[tuple[str, str, str], ...] = ()  # (condition, reason, message) of failing health conditions


def node_state(node: dict[str, Any]) -> NodeState:
    ready, since, said = "Unknown", None, ""
    broken = []
    for cond in (node.get("status") or {}).get("conditions") or []:
        kind = cond.get("type")
        if kind == "Ready":
            ready, since = str(cond.get("status")), parse_ts(cond.get("lastTransitionTime"))
            said = ": ".join(p for p in (cond.get("reason"), cond.get("message")) if p)
        elif kind in HEALTH_CONDITIONS and cond.get("status") == "False":
            broken.append((str(kind), str(cond.get("reason") or ""), str(cond.get("message") or "")))
    return NodeState(node["metadata"]["name"], ready, since, said, tuple(broken))


def unhealthy(state: NodeState, now: datetime, grace_s: float = NOT_READY_GRACE_S) -> Cause | None:
    """Why the node is not to be trusted with the pod any more; None while it is healthy."""
    name = state.name
    if state.broken:
        kind, reason, message = state.broken[0]
        text = f"node {name} is unhealthy: {kind} is False ({reason}){': ' + message if message else ''}"
        return cause(CauseClass.node, text, node=name, reason="NodeUnhealthy", condition=kind)
    if state.ready == "True" or state.ready_since is None:
        return None
    down = (now - state.ready_since).total_seconds()
    if down < grace_s:
        return None
    what = "unreachable (its kubelet stopped reporting)" if state.ready == "Unknown" else "NotReady"
    text = f"node {name} has been {what} for {down:.0f} s ({state.ready_said})"
    reason = "NodeUnreachable" if state.ready == "Unknown" else "NodeNotReady"
    return cause(CauseClass.node, text, node=name, reason=reason, condition="Ready")


class NodeHealth:
    """The states of the nodes by label selector, read through the API server's cache, at a bounded rate."""

    def __init__(
        self,
        api: KubernetesApi,
        *,
        refresh_s: float = 20.0,
        urgent_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.refresh_s = refresh_s
        self.urgent_s = urgent_s
        self._clock = clock
        self._cache: dict[str, tuple[float, dict[str, NodeState]]] = {}
        self._lock = threading.Lock()

    def states(self, selector: str, *, urgent: bool = False) -> dict[str, NodeState]:
        """The selected nodes' states, from the cache while it is fresh enough; {} when they cannot be read."""
        with self._lock:
            now = self._clock()
            read_at, states = self._cache.get(selector, (float("-inf"), {}))
            if now - read_at < (self.urgent_s if urgent else self.refresh_s):
                return states
            try:
                items = self.api.read(
                    "list nodes",
                    self.api.core.list_node,
                    label_selector=selector or None,
                    resource_version="0",  # the API server's watch cache: no read from etcd
                ).get("items", [])
            except Exception as exc:
                log.warning("kubernetes nodes unreadable (%s); node health is not checked this pass", api_message(exc))
                return states
            states = {n["metadata"]["name"]: node_state(n) for n in items}
            self._cache[selector] = (now, states)
            return states


def remediate(api: KubernetesApi, nodes: Iterable[str], mode: str, reason: str) -> None:
    """Cordon or taint blamed nodes (`mode`: off, cordon, taint), so that other jobs stop landing there.
    Best effort: a node gone or a permission missing is logged, never raised."""
    if mode == "off":
        return
    for name in nodes:
        try:
            node = api.read("read node", api.core.read_node, name)
            if mode == "cordon":
                if node.get("spec", {}).get("unschedulable"):
                    continue
                patch: dict[str, Any] = {"spec": {"unschedulable": True}}
            else:
                taints = list(node.get("spec", {}).get("taints") or [])
                if any(t.get("key") == UNHEALTHY_TAINT for t in taints):
                    continue
                taints.append({"key": UNHEALTHY_TAINT, "value": "true", "effect": "NoSchedule"})
                rv = node["metadata"].get("resourceVersion")
                patch = {"metadata": {"resourceVersion": rv}, "spec": {"taints": taints}}
            api.call(f"{mode} node", api.core.patch_node, name, patch)
            log.warning("node %s: %s by ftplane (%s)", name, "cordoned" if mode == "cordon" else "tainted", reason)
        except Exception as exc:
            log.warning("could not %s node %s (%s): do it by hand if it is broken", mode, name, api_message(exc))
