"""The fake cluster's kubelets and node lifecycle: what tests call to move pods through their lives.

Kubelets: `run` starts bound pods' containers; `exit`, `oom`, `evict` (node-pressure), `image_pull_error`,
`mount_failure` and `config_error` end or stall them the way Kubernetes reports it (statuses,
conditions, Events). Nodes: `not_ready` makes a node NotReady (or unreachable) at the fake clock's time:
its pods turn not Ready at once, and the taint manager marks them for deletion (DisruptionTarget,
Terminating) once their not-ready/unreachable toleration runs out (`advance` the clock); `lose_node` is
the quick form (the node gone, its pods deleted); `set_condition` sets a node condition (the EKS node
monitoring agent's); `api_evict` is the Eviction API (a drain, Karpenter) and `drain` cordons a node and
evicts its pods.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from tests.fake_kubernetes.jobs import INDEX_LABEL
from tests.fake_kubernetes.scheduler import Scheduler
from tests.fake_kubernetes.store import iso

NOT_READY_TAINTS = {"unreachable": "node.kubernetes.io/unreachable", "not-ready": "node.kubernetes.io/not-ready"}
DEFAULT_TOLERATION_S = 300  # what the DefaultTolerationSeconds admission plugin gives pods without their own


class Cluster(Scheduler):
    """The store, Job controller and scheduler, with kubelets that run, fail and lose pods."""

    def __init__(self, nodes: list[str] | None = None) -> None:
        super().__init__()
        for name in nodes if nodes is not None else [f"ip-10-0-1-{i}" for i in range(1, 9)]:
            self.add_node(name)

    def node_reachable(self, node: str | None) -> bool:
        """A kubelet that posts its node's status can stop containers; one that stopped cannot."""
        obj = self.objects.get(("nodes", "", node or ""))
        if obj is None:
            return False
        ready: dict[str, Any] = next((c for c in obj["status"]["conditions"] if c["type"] == "Ready"), {})
        return ready.get("status") != "Unknown"

    def _set_status(self, pod: dict[str, Any], **status: Any) -> None:
        pod["status"].update(status)
        pod["metadata"]["resourceVersion"] = str(next(self.rv))

    def _job_of(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        for ref in pod["metadata"].get("ownerReferences") or []:
            job = self.objects.get(("jobs", pod["metadata"]["namespace"], ref["name"]))
            if job is not None:
                return job
        return None

    # --- kubelets

    def run(self, job: str, ns: str, indexes: list[int] | None = None) -> None:
        """Bound pending pods (all of them, or those of `indexes`) start their containers."""
        with self.lock:
            for pod in self.pods(job, ns):
                if pod["status"]["phase"] != "Pending" or not pod["spec"].get("nodeName"):
                    continue
                index = int(pod["metadata"]["labels"][INDEX_LABEL])
                if indexes is not None and index not in indexes:
                    continue
                ts = self.ts()
                node = pod["spec"]["nodeName"]
                self.event(pod, "Pulled", "Container image already present on machine", host=node)
                self.event(pod, "Started", "Started container trainer", host=node)
                init = [
                    _container(
                        c["name"],
                        pod,
                        {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": ts, "finishedAt": ts}},
                    )
                    for c in pod["spec"].get("initContainers") or []
                ]
                self._set_status(
                    pod,
                    phase="Running",
                    podIP=f"10.1.0.{index + 10}",
                    startTime=ts,
                    containerStatuses=[_container("trainer", pod, {"running": {"startedAt": ts}})],
                    **({"initContainerStatuses": init} if init else {}),
                )
                pod["status"]["conditions"].append({"type": "Ready", "status": "True", "lastTransitionTime": ts})
            self._sync(self.job(job, ns))

    def exit(self, job: str, ns: str, index: int, code: int, reason: str = "Error", message: str = "") -> None:
        with self.lock:
            pod = self.pod(job, ns, index)
            started = pod["status"].get("startTime") or self.ts()
            term: dict[str, Any] = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": self.ts()}
            if message:
                term["message"] = message
            self._set_status(
                pod,
                phase="Succeeded" if code == 0 else "Failed",
                containerStatuses=[_container("trainer", pod, {"terminated": term})],
            )
            self._sync(self.job(job, ns))

    def init_exit(self, job: str, ns: str, index: int, container: str, code: int, message: str = "") -> None:
        """An init container fails: the pod fails before its trainer starts."""
        with self.lock:
            pod = self.pod(job, ns, index)
            ts = self.ts()
            term: dict[str, Any] = {"exitCode": code, "reason": "Error", "startedAt": ts, "finishedAt": ts}
            if message:
                term["message"] = message
            waiting = {"waiting": {"reason": "PodInitializing"}}
            self._set_status(
                pod,
                phase="Failed",
                initContainerStatuses=[_container(container, pod, {"terminated": term})],
                containerStatuses=[_container("trainer", pod, waiting)],
            )
            self._sync(self.job(job, ns))

    def succeed(self, job: str, ns: str) -> None:
        for pod in self.pods(job, ns):
            if pod["status"]["phase"] in ("Pending", "Running"):
                self.exit(job, ns, int(pod["metadata"]["labels"][INDEX_LABEL]), 0, "Completed")

    def oom(self, job: str, ns: str, index: int) -> None:
        self.exit(job, ns, index, 137, "OOMKilled")

    def evict(self, job: str, ns: str, index: int, resource: str = "memory", using: str | None = None) -> None:
        """The kubelet evicts the pod for node pressure on `resource`; `using`: what the trainer container used,
        beyond its request, which the kubelet then names (kubernetes pkg/kubelet/eviction/helpers.go,
        evictionMessage: "Container %s was using %s, request is %s, has larger consumption of %v.")."""
        with self.lock:
            pod = self.pod(job, ns, index)
            node = pod["spec"]["nodeName"]
            message = f"The node was low on resource: {resource}. Threshold quantity: 100Mi, available: 50Mi. "
            if using is not None:
                requested = ((pod["spec"]["containers"][0].get("resources") or {}).get("requests") or {}).get(resource)
                message += (
                    f"Container trainer was using {using}, request is {requested or '0'}, has larger consumption of "
                    f"{resource}. "
                )
            self.event(pod, "Evicted", message, "Warning", host=node)
            ts = self.ts()
            pod["status"]["conditions"].append(
                {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet", "message": message}
            )
            term = {"exitCode": 137, "reason": "ContainerStatusUnknown", "startedAt": ts, "finishedAt": ts}
            self._set_status(
                pod,
                phase="Failed",
                reason="Evicted",
                message=message,
                containerStatuses=[_container("trainer", pod, {"terminated": term})],
            )
            self._sync(self.job(job, ns))

    def api_evict(self, ns: str, name: str) -> None:
        """The Eviction API (kubectl drain, Karpenter, a spot interruption handler): the pod is marked a
        disruption target and deleted gracefully; its kubelet stops it (SIGTERM: exit 143) and it fails. With
        `hold_termination` its container runs on through the pod's grace period (terminationGracePeriodSeconds),
        until the test ends it or the grace runs out (SIGKILL: 137)."""
        with self.lock:
            pod = self.objects[("pods", ns, name)]
            ts = self.ts()
            pod["status"]["conditions"] = [c for c in pod["status"].get("conditions") or [] if c["type"] != "Ready"] + [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "EvictionByEvictionAPI",
                    "message": "Eviction API: evicting",
                    "lastTransitionTime": ts,
                },
                {"type": "Ready", "status": "False", "lastTransitionTime": ts},
            ]
            pod["metadata"]["deletionTimestamp"] = ts
            pod["metadata"]["deletionGracePeriodSeconds"] = pod["spec"].get("terminationGracePeriodSeconds", 30)
            self.event(pod, "Killing", "Stopping container trainer", host=pod["spec"].get("nodeName"))
            pod["metadata"]["resourceVersion"] = str(next(self.rv))
            if pod["status"]["phase"] == "Running" and self.hold_termination:
                return  # the container runs on within its grace period (exit, or advance past it: SIGKILL)
            if pod["status"]["phase"] == "Running":
                started = pod["status"].get("startTime") or ts
                term = {"exitCode": 143, "reason": "Error", "startedAt": started, "finishedAt": ts}
                self._set_status(
                    pod, phase="Failed", containerStatuses=[_container("trainer", pod, {"terminated": term})]
                )
            job = self._job_of(pod)
            if job is not None:
                self._sync(job)

    def drain(self, node: str, *, taint: dict[str, Any] | None = None) -> None:
        """Cordon the node (and taint it, as Karpenter does: karpenter.sh/disrupted), then evict its pods."""
        with self.lock:
            obj = self.node(node)
            obj["spec"]["unschedulable"] = True
            if taint:
                obj["spec"].setdefault("taints", []).append(taint)
            for (p, ns, name), pod in list(self.objects.items()):
                if p == "pods" and pod["spec"].get("nodeName") == node and pod["status"]["phase"] == "Running":
                    self.api_evict(ns, name)

    def image_pull_error(
        self, job: str, ns: str, reason: str = "ImagePullBackOff", indexes: list[int] | None = None
    ) -> None:
        """The bound pods' image cannot be pulled (all of them, or those of `indexes`)."""
        with self.lock:
            for pod in self.pods(job, ns):
                if indexes is not None and int(pod["metadata"]["labels"][INDEX_LABEL]) not in indexes:
                    continue
                image = pod["spec"]["containers"][0]["image"]
                message = f'Back-off pulling image "{image}": not found'
                node = pod["spec"].get("nodeName")
                self.event(pod, "Failed", f'Failed to pull image "{image}": not found', "Warning", host=node)
                self.event(pod, "BackOff", message, "Normal", host=node)
                waiting = {"waiting": {"reason": reason, "message": message}}
                self._set_status(pod, containerStatuses=[_container("trainer", pod, waiting)])

    def config_error(self, job: str, ns: str, message: str) -> None:
        """The kubelet cannot build a container's configuration (a Secret or key that is not there)."""
        with self.lock:
            for pod in self.pods(job, ns):
                node = pod["spec"].get("nodeName")
                self.event(pod, "Failed", f"Error: {message}", "Warning", host=node)
                waiting = {"waiting": {"reason": "CreateContainerConfigError", "message": message}}
                self._set_status(pod, containerStatuses=[_container("trainer", pod, waiting)])

    def mount_failure(self, job: str, ns: str, volume: str = "checkpoints") -> None:
        """The bound pods' volume cannot be mounted (an FSx file system the nodes cannot reach): they stay in
        ContainerCreating while the kubelet retries and reports FailedMount."""
        with self.lock:
            for pod in self.pods(job, ns):
                node = pod["spec"].get("nodeName")
                if not node:
                    continue
                uid = pod["metadata"]["uid"]
                self.event(
                    pod,
                    "FailedMount",
                    f'MountVolume.SetUp failed for volume "pvc-{uid[:8]}" : rpc error: code = Internal desc = Could '
                    'not mount "fs-0123456789abcdef0.fsx.us-west-2.amazonaws.com@tcp:/abcdefgh" at "/var/lib/kubelet/'
                    f'pods/{uid}/volumes/kubernetes.io~csi/pvc-{uid[:8]}/mount": mount failed: exit status 5',
                    "Warning",
                    host=node,
                )
                self.event(
                    pod,
                    "FailedMount",
                    f"Unable to attach or mount volumes: unmounted volumes=[{volume}], unattached volumes=[{volume} "
                    "dshm]: timed out waiting for the condition",
                    "Warning",
                    host=node,
                )
                waiting = {"waiting": {"reason": "ContainerCreating"}}
                self._set_status(pod, containerStatuses=[_container("trainer", pod, waiting)])

    # --- nodes

    def not_ready(self, node: str, *, unreachable: bool = True) -> None:
        """The node goes NotReady (the kubelet says so) or unreachable (it stopped reporting): tainted at once."""
        with self.lock:
            obj = self.node(node)
            ts = self.ts()
            for cond in obj["status"]["conditions"]:
                if cond["type"] == "Ready":
                    cond.update(
                        status="Unknown" if unreachable else "False",
                        reason="NodeStatusUnknown" if unreachable else "KubeletNotReady",
                        message="Kubelet stopped posting node status." if unreachable else "container runtime is down",
                        lastTransitionTime=ts,
                    )
            key = NOT_READY_TAINTS["unreachable" if unreachable else "not-ready"]
            obj["spec"]["taints"] = [
                t for t in obj["spec"].get("taints") or [] if t["key"] not in NOT_READY_TAINTS.values()
            ]
            obj["spec"]["taints"] += [
                {"key": key, "effect": "NoSchedule"},
                {"key": key, "effect": "NoExecute", "timeAdded": ts},
            ]
            obj["metadata"]["resourceVersion"] = str(next(self.rv))
            for (p, _, _), pod in list(self.objects.items()):
                if (
                    p == "pods"
                    and pod["spec"].get("nodeName") == node
                    and pod["status"]["phase"] in ("Pending", "Running")
                ):
                    pod["status"]["conditions"] = [
                        c for c in pod["status"].get("conditions") or [] if c["type"] != "Ready"
                    ]
                    pod["status"]["conditions"].append({"type": "Ready", "status": "False", "lastTransitionTime": ts})
                    pod["metadata"]["resourceVersion"] = str(next(self.rv))
                    self.event(pod, "NodeNotReady", "Node is not ready", "Warning", component="node-controller")
            self._tick()

    def ready(self, node: str) -> None:
        """The node is back."""
        with self.lock:
            obj = self.node(node)
            for cond in obj["status"]["conditions"]:
                if cond["type"] == "Ready":
                    cond.update(
                        status="True",
                        reason="KubeletReady",
                        message="kubelet is posting ready status",
                        lastTransitionTime=self.ts(),
                    )
            obj["spec"]["taints"] = [
                t for t in obj["spec"].get("taints") or [] if t["key"] not in NOT_READY_TAINTS.values()
            ]

    def set_condition(self, node: str, kind: str, status: str, reason: str, message: str) -> None:
        with self.lock:
            obj = self.node(node)
            for cond in obj["status"]["conditions"]:
                if cond["type"] == kind:
                    cond.update(status=status, reason=reason, message=message, lastTransitionTime=self.ts())
                    break
            else:
                obj["status"]["conditions"].append(
                    {
                        "type": kind,
                        "status": status,
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": self.ts(),
                    }
                )
            obj["metadata"]["resourceVersion"] = str(next(self.rv))

    def _tick(self) -> None:
        """The taint manager: pods whose toleration of a node's NoExecute taint ran out are marked for deletion.
        Their node's kubelet cannot confirm it, so they stay Terminating."""
        super()._tick()
        now = self.now()
        for node in [self.node(n) for n in self.nodes]:
            for taint in node["spec"].get("taints") or []:
                if taint["effect"] != "NoExecute":
                    continue
                added = datetime.fromisoformat(taint.get("timeAdded", self.ts()).replace("Z", "+00:00"))
                for (p, _, _), pod in list(self.objects.items()):
                    if p != "pods" or pod["spec"].get("nodeName") != node["metadata"]["name"]:
                        continue
                    if pod["metadata"].get("deletionTimestamp") or pod["status"]["phase"] not in ("Pending", "Running"):
                        continue
                    seconds = _toleration_seconds(pod, taint)
                    if seconds is not None and now >= added + timedelta(seconds=seconds):
                        self._taint_evict(pod, added + timedelta(seconds=seconds))

    def _taint_evict(self, pod: dict[str, Any], at: datetime) -> None:
        ts = iso(at)
        pod["status"]["conditions"].append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "DeletionByTaintManager",
                "message": "Taint manager: deleting due to NoExecute taint",
                "lastTransitionTime": ts,
            }
        )
        pod["metadata"]["deletionTimestamp"] = ts
        pod["metadata"]["resourceVersion"] = str(next(self.rv))
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        self.event(
            pod, "TaintManagerEviction", f"Marking for deletion Pod {ns}/{name}", component="taint-eviction-controller"
        )

    def lose_node(self, node: str) -> None:
        """The quick form: the node goes NotReady and its pods are deleted at once (the Job counts them as failed)."""
        with self.lock:
            self.not_ready(node)
            for pod in self.list("pods"):
                if pod["spec"].get("nodeName") != node:
                    continue
                ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
                self.event(pod, "TaintManagerEviction", f"Marking for deletion Pod {ns}/{name}")
                if ("pods", ns, name) in self.objects:
                    self.delete("pods", ns, name)


def _toleration_seconds(pod: dict[str, Any], taint: dict[str, Any]) -> float | None:
    """How long the pod tolerates the NoExecute taint, as the taint manager reads its tolerations: of those that
    match, the least tolerationSeconds, None (for ever) when none gives any; 0 (not at all) when none matches.
    A pod without its own toleration of not-ready or unreachable has the admission plugin's 300 s."""
    matching = [
        t
        for t in pod["spec"].get("tolerations") or []
        if t.get("effect") in (None, "", "NoExecute")
        and (
            (t.get("operator") == "Exists" and t.get("key") in (None, "", taint["key"]))
            or (t.get("key") == taint["key"] and (t.get("value") or "") == (taint.get("value") or ""))
        )
    ]
    if not matching:
        return DEFAULT_TOLERATION_S if taint["key"] in NOT_READY_TAINTS.values() else 0
    seconds = [float(t["tolerationSeconds"]) for t in matching if t.get("tolerationSeconds") is not None]
    return max(0.0, min(seconds)) if seconds else None


def _container(name: str, pod: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    image = pod["spec"]["containers"][0]["image"]
    running = "running" in state
    return {
        "name": name,
        "image": image,
        "imageID": f"{image}@sha256:{hashlib.sha256(image.encode()).hexdigest()}",
        "ready": running,
        "started": running,
        "restartCount": 0,
        "state": state,
    }
