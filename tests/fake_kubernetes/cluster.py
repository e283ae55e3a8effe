"""The fake cluster's nodes and kubelets: what tests call to move pods through their lives.

`schedule` binds pending pods to free nodes their affinity allows; `run` starts
their containers, each pod with worker processes carrying RANK; `exit`, `oom`,
`evict`, `lose_node` and `image_pull_error` end or stall them the way Kubernetes
reports it (statuses, conditions, Events). `exec` answers the backend's fault
script from those processes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from tests.fake_kubernetes.jobs import INDEX_LABEL, JobController
from tests.fake_kubernetes.store import now_iso


class Cluster(JobController):
    """The store and Job controller, with nodes that pods are scheduled on, run, fail and vanish from."""

    def __init__(self, nodes: list[str] | None = None) -> None:
        super().__init__()
        self.nodes = nodes if nodes is not None else [f"ip-10-0-1-{i}" for i in range(1, 9)]
        self.signals: list[tuple[str, int, str]] = []  # (pod, rank, signal) sent through exec
        # pod name -> {pid: global rank}: the worker processes exec can find
        self.processes: dict[str, dict[int, int]] = {}
        self.not_ready: set[str] = set()

    def _deleted(self, plural: str, obj: dict[str, Any], by_user: bool) -> None:
        super()._deleted(plural, obj, by_user)
        self.processes.pop(obj["metadata"]["name"], None)

    def _set_status(self, pod: dict[str, Any], **status: Any) -> None:
        pod["status"].update(status)
        pod["metadata"]["resourceVersion"] = str(next(self.rv))

    def schedule(self, job: str, ns: str) -> list[str]:
        """Bind each pending pod to a free node that its affinity allows; unschedulable ones say why."""
        with self.lock:
            used = {
                p["spec"].get("nodeName")
                for p in self.list("pods")
                if p.get("status", {}).get("phase") in ("Pending", "Running")
            }
            placed = []
            for pod in self.pods(job, ns):
                if pod["spec"].get("nodeName"):
                    continue
                excluded = _excluded_nodes(pod)
                busy = used | excluded | self.not_ready
                free = [n for n in self.nodes if n not in busy]
                ts = now_iso()
                if not free:
                    message = f"0/{len(self.nodes)} nodes are available: "
                    message += f"{len(excluded)} node(s) didn't match Pod's node affinity/selector, "
                    message += "the others are busy."
                    pod["status"]["conditions"] = [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": message,
                            "lastTransitionTime": ts,
                        }
                    ]
                    self.event(pod, "FailedScheduling", message, "Warning")
                    continue
                node = free[0]
                used.add(node)
                placed.append(node)
                pod["spec"]["nodeName"] = node
                bound = {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts}
                pod["status"]["conditions"] = [bound]
                ns_name = f"{ns}/{pod['metadata']['name']}"
                self.event(pod, "Scheduled", f"Successfully assigned {ns_name} to {node}")
            return placed

    def run(self, job: str, ns: str, *, rank_layout: Callable[[int, int], list[int]] | None = None) -> None:
        """Containers start; each pod gets worker processes carrying RANK (ranks of its node by default)."""
        with self.lock:
            job_obj = self.job(job, ns)
            command = job_obj["spec"]["template"]["spec"]["containers"][0]["command"]
            ppn = int(next(a.split("=", 1)[1] for a in command if a.startswith("--nproc-per-node=")))
            for pod in self.pods(job, ns):
                if pod["status"]["phase"] != "Pending" or not pod["spec"].get("nodeName"):
                    continue
                index = int(pod["metadata"]["labels"][INDEX_LABEL])
                ts = now_iso()
                node = pod["spec"]["nodeName"]
                self.event(pod, "Pulled", "Container image already present on machine", host=node)
                self.event(pod, "Started", "Started container trainer", host=node)
                self._set_status(
                    pod,
                    phase="Running",
                    podIP=f"10.1.0.{index + 10}",
                    startTime=ts,
                    containerStatuses=[_container("trainer", pod, {"running": {"startedAt": ts}})],
                )
                ready = {"type": "Ready", "status": "True", "lastTransitionTime": ts}
                pod["status"]["conditions"].append(ready)
                ranks = rank_layout(index, ppn) if rank_layout else [index * ppn + i for i in range(ppn)]
                self.processes[pod["metadata"]["name"]] = {100 + i: r for i, r in enumerate(ranks)}
            self._sync(job_obj)

    def exit(
        self,
        job: str,
        ns: str,
        index: int,
        code: int,
        reason: str = "Error",
        message: str = "",
    ) -> None:
        with self.lock:
            pod = self.pod(job, ns, index)
            started = pod["status"].get("startTime") or now_iso()
            term = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": now_iso()}
            if message:
                term["message"] = message
            self._set_status(
                pod,
                phase="Succeeded" if code == 0 else "Failed",
                containerStatuses=[_container("trainer", pod, {"terminated": term})],
            )
            self.processes.pop(pod["metadata"]["name"], None)
            self._sync(self.job(job, ns))

    def succeed(self, job: str, ns: str) -> None:
        for pod in self.pods(job, ns):
            self.exit(job, ns, int(pod["metadata"]["labels"][INDEX_LABEL]), 0, "Completed")

    def oom(self, job: str, ns: str, index: int) -> None:
        self.exit(job, ns, index, 137, "OOMKilled")

    def evict(self, job: str, ns: str, index: int) -> None:
        with self.lock:
            pod = self.pod(job, ns, index)
            node = pod["spec"]["nodeName"]
            message = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi."
            self.event(pod, "Evicted", message, "Warning", host=node)
            ts = now_iso()
            pod["status"]["conditions"].append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "TerminationByKubelet",
                    "message": message,
                }
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

    def lose_node(self, node: str) -> None:
        """The node goes NotReady; the taint manager deletes its pods (the Job counts them as failed)."""
        with self.lock:
            self.not_ready.add(node)
            for pod in self.list("pods"):
                if pod["spec"].get("nodeName") != node:
                    continue
                ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
                self.event(pod, "NodeNotReady", "Node is not ready", "Warning")
                self.event(pod, "TaintManagerEviction", f"Marking for deletion Pod {ns}/{name}")
                self.delete("pods", ns, name)

    def image_pull_error(self, job: str, ns: str, reason: str = "ImagePullBackOff") -> None:
        with self.lock:
            for pod in self.pods(job, ns):
                image = pod["spec"]["containers"][0]["image"]
                message = f'Back-off pulling image "{image}": not found'
                node = pod["spec"].get("nodeName")
                self.event(pod, "Failed", f'Failed to pull image "{image}": not found', "Warning", host=node)
                self.event(pod, "BackOff", message, "Normal", host=node)
                waiting = {"waiting": {"reason": reason, "message": message}}
                self._set_status(pod, containerStatuses=[_container("trainer", pod, waiting)])

    def exec(self, ns: str, pod_name: str, command: list[str]) -> tuple[str, int]:
        """What running `command` in the pod prints, and its exit code (the fault script is understood)."""
        with self.lock:
            if ("pods", ns, pod_name) not in self.objects:
                return "pod not found", 1
            if len(command) >= 6 and command[:2] == ["sh", "-c"] and "ftplane-fault" in command[2]:
                signal, rank = command[4], int(command[5])
                for pid, r in sorted(self.processes.get(pod_name, {}).items()):
                    if r == rank:
                        self.signals.append((pod_name, rank, signal))
                        return f"ftplane-fault: signalled {pid}\n", 0
                return f"ftplane-fault: no process with RANK={rank}\n", 3
            return "", 0


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


def _excluded_nodes(pod: dict[str, Any]) -> set[str]:
    affinity = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    out: set[str] = set()
    for term in required.get("nodeSelectorTerms") or []:
        for expr in term.get("matchExpressions") or []:
            if expr["key"] == "kubernetes.io/hostname" and expr["operator"] == "NotIn":
                out.update(expr["values"])
    return out
