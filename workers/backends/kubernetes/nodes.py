"""Node health: what the Node objects say about the nodes an attempt runs on, read cheaply, and what ftplane
may do to a node it blamed.

`NodeHealth` keeps, per label selector (the spec's node labels), the states of the selected nodes, read a
page of NODE_PAGE nodes at a time (a label-selected list with `limit` and `continue`), at most one page every
`refresh_s`, round-robin: the nodes of a 2,048-node job are all read every 8 pages, and no pass decodes more
than a page of Node objects (an EKS GPU Node, with its image list, is ~10 KB). The nodes of pods that look
lost (not Ready, phase Unknown, being deleted) are read at once, by name, at most MAX_SUSPECTS of them, each
at most every `urgent_s`. Only what health needs is kept (`NodeState`), and the allocatable (whether a pod
could ever fit: pending.py).

A node is unhealthy (`unhealthy`) when its Ready condition has been False (NotReady) or Unknown
(unreachable: the kubelet stopped reporting) for as long as its pods tolerate that (`tolerated_s`: their
NoExecute tolerations of node.kubernetes.io/not-ready or /unreachable, read as the taint manager reads them,
so a spec's own toleration seconds count; 300 s, Kubernetes' default, where none gives seconds), or when
a condition of the EKS node monitoring agent (AcceleratedHardwareReady for GPU Xid and ECC errors,
NetworkingReady, StorageReady, KernelReady, ContainerRuntimeReady) is False. Its pods' failures are then the node's.

`remediate` optionally keeps other jobs off a blamed node: `cordon` (spec.unschedulable) or `taint`
(`ftplane.dev/unhealthy=true:NoSchedule`), as FTPLANE_KUBE_UNHEALTHY_NODES says; off by default, and the
worker's RBAC for it comes with deploy/kustomize/components/node-remediation only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from api.schemas.causes import Cause, CauseClass
from workers.backends.kubernetes.client import KubernetesApi, api_message
from workers.backends.kubernetes.failures import cause
from workers.backends.kubernetes.objects import parse_ts

log = logging.getLogger(__name__)

MAX_SUSPECTS = 8
NODE_PAGE = 256
HEALTH_CONDITIONS = (
    "AcceleratedHardwareReady",
    "NetworkingReady",
    "StorageReady",
    "KernelReady",
    "ContainerRuntimeReady",
)
UNHEALTHY_TAINT = "ftplane.dev/unhealthy"
NOT_READY_GRACE_S = 300.0
NOT_READY_TAINT = "node.kubernetes.io/not-ready"  # the node controller's, while Ready is False
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"  # while Ready is Unknown


@dataclass(frozen=True)
class NodeState:
    name: str
    ready: str  # the Ready condition's status: True, False (NotReady) or Unknown (unreachable)
    ready_since: datetime | None
    ready_said: str
    broken: tuple[tuple[str, str, str], ...] = ()  # (condition, reason, message) of failing health conditions
    allocatable: tuple[tuple[str, str], ...] = ()  # (resource, quantity): what the node can ever give its pods


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
    allocatable = tuple(
        sorted((str(k), str(v)) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items())
    )
    return NodeState(node["metadata"]["name"], ready, since, said, tuple(broken), allocatable)


def tolerated_s(tolerations: Iterable[Mapping[str, Any]] | None, ready: str) -> float:
    """How long pods with these tolerations stay bound to a node whose Ready condition is `ready` (False: the
    not-ready taint, Unknown: the unreachable one), as the taint manager reads them: the least tolerationSeconds of
    the NoExecute tolerations that match the taint. NOT_READY_GRACE_S (Kubernetes' default) where none of them
    gives seconds: none matches, or the pods tolerate the taint for ever (ftplane still blames the node then)."""
    taint = UNREACHABLE_TAINT if ready == "Unknown" else NOT_READY_TAINT
    seconds = [
        float(t["tolerationSeconds"])
        for t in tolerations or ()
        if t.get("effect") in (None, "", "NoExecute")
        and (t.get("key") == taint or (t.get("operator") == "Exists" and not t.get("key")))
        and t.get("tolerationSeconds") is not None
    ]
    return max(0.0, min(seconds)) if seconds else NOT_READY_GRACE_S


def unhealthy(state: NodeState, now: datetime, grace_s: float = NOT_READY_GRACE_S) -> Cause | None:
    """Why the node is not to be trusted with the pod any more; None while it is healthy. `grace_s`: how long its
    pods tolerate it NotReady or unreachable (`tolerated_s`)."""
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


@dataclass
class _Selected:
    """What is known of the nodes one label selector selects, read a page at a time."""

    states: dict[str, NodeState] = field(default_factory=dict)
    read_at: float = float("-inf")  # when the last page was read
    token: str | None = None  # where the next page starts (None: from the first)
    seen: set[str] = field(default_factory=set)  # the nodes of the pages read since the first


class NodeHealth:
    """The states of the nodes by label selector, a page of NODE_PAGE at a time (a page at most every `refresh_s`,
    round-robin over the selected nodes), and the suspects' by name at once."""

    def __init__(
        self,
        api: KubernetesApi,
        *,
        refresh_s: float = 2.0,
        urgent_s: float = 2.0,
        page: int = NODE_PAGE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.refresh_s = refresh_s
        self.urgent_s = urgent_s
        self.page = page
        self._clock = clock
        self._selected: dict[str, _Selected] = {}
        self._suspects: dict[str, tuple[float, NodeState | None]] = {}
        self._lock = threading.Lock()

    def states(self, selector: str, *, suspects: Iterable[str] = ()) -> dict[str, NodeState]:
        """The selected nodes' states as last read, the next page read when it is due, with the `suspects` (nodes
        whose pods look lost) read afresh; what cannot be read is left as it was."""
        with self._lock:
            now = self._clock()
            known = self._selected.setdefault(selector, _Selected())
            if now - known.read_at >= self.refresh_s:
                self._next_page(selector, known)
                known.read_at = now
            out = dict(known.states)
            for name in list(dict.fromkeys(suspects))[:MAX_SUSPECTS]:
                seen_at, state = self._suspects.get(name, (float("-inf"), None))
                if now - seen_at >= min(self.urgent_s, self.refresh_s):
                    state = self._read_one(name, state)
                    self._suspects[name] = (now, state)
                if state is not None:
                    out[name] = state
            return out

    def _next_page(self, selector: str, known: _Selected) -> None:
        try:
            page = self.api.read(
                "list nodes",
                self.api.core.list_node,
                label_selector=selector or None,
                limit=self.page,
                _continue=known.token,
            )
        except ApiException as exc:
            if exc.status == 410:  # the page token expired: start over
                known.token, known.seen = None, set()
            log.warning("kubernetes nodes unreadable (%s); node health not refreshed this pass", api_message(exc))
            return
        except Exception as exc:
            log.warning("kubernetes nodes unreadable (%s); node health not refreshed this pass", api_message(exc))
            return
        for item in page.get("items", []):
            state = node_state(item)
            known.states[state.name] = state
            known.seen.add(state.name)
        known.token = (page.get("metadata") or {}).get("continue") or None
        if known.token is None:  # a full round: nodes no longer listed are gone
            known.states = {n: s for n, s in known.states.items() if n in known.seen}
            known.seen = set()

    def _read_one(self, name: str, known: NodeState | None) -> NodeState | None:
        try:
            return node_state(self.api.read("read node", self.api.core.read_node, name))
        except Exception as exc:
            log.warning("kubernetes node %s unreadable (%s)", name, api_message(exc))
            return known


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
