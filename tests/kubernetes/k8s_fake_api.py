"""A small, stateful fake of the Kubernetes API, served over HTTP in-process for the real client.

Objects (Jobs, Pods, Services, Secrets, Events) are kept per kind, namespace and
name with a uid, resourceVersion and creationTimestamp; lists honour label and
field selectors; deletes cascade through ownerReferences. A tiny Job controller
creates one pod per completion index (`<job>-<index>-<random>`) and fails or
completes the Job like `backoffLimit: 0` does. Tests drive pod lifecycles with
the simulation methods (schedule, run, exit, evict, lose_node, ...), inject API
errors or delays on chosen calls, and exec into pods over a real WebSocket.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import itertools
import json
import random
import re
import string
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes import client as k8s_client

KINDS = {
    "pods": ("Pod", "v1"),
    "services": ("Service", "v1"),
    "secrets": ("Secret", "v1"),
    "events": ("Event", "v1"),
    "jobs": ("Job", "batch/v1"),
}
CORE = re.compile(r"^/api/v1/namespaces/([^/]+)/(pods|services|secrets|events)(?:/([^/]+))?(?:/(exec|log))?$")
BATCH = re.compile(r"^/apis/batch/v1/namespaces/([^/]+)/(jobs)(?:/([^/]+))?$")
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def now_iso() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (good enough for strategic merge of maps, too)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def match_labels(selector: str | None, labels: dict[str, str]) -> bool:
    """Kubernetes label selector syntax: k=v, k==v, k!=v, k, !k, k in (a,b), k notin (a,b)."""
    if not selector:
        return True
    for term in _split_selector(selector):
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if (op == "in") != (labels.get(key) in values):
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = re.split(r"==?", term, maxsplit=1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def match_fields(selector: str | None, obj: dict[str, Any]) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        negate = "!=" in term
        path, value = re.split(r"!=|==?", term, maxsplit=1)
        cur: Any = obj
        for part in path.strip().split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        actual = "" if cur is None else str(cur)
        if (actual == value.strip()) == negate:
            return False
    return True


@dataclass
class Rule:
    """An injected API failure: `status` (or a `delay` in seconds) for matching requests, `times` times."""

    method: str
    path: re.Pattern[str]
    status: int | None = None
    times: int = 1
    delay: float = 0.0
    retry_after: int | None = None
    after: bool = False  # delay the answer after the request took effect (a reply lost on the way back)
    hits: int = 0


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    status: int = 0


@dataclass
class FakeKube:
    nodes: list[str] = field(default_factory=lambda: [f"ip-10-0-1-{i}" for i in range(1, 9)])
    validate: Callable[[dict[str, Any]], None] | None = None  # called on every created object

    def __post_init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.lock = threading.RLock()
        self.rv = itertools.count(1000)
        self.rules: list[Rule] = []
        self.requests: list[Request] = []
        self.signals: list[tuple[str, int, str]] = []  # (pod, rank, signal) sent through exec
        # pod name -> {pid: global rank}: the worker processes exec can find
        self.processes: dict[str, dict[int, int]] = {}
        self.not_ready: set[str] = set()
        self.server: ThreadingHTTPServer | None = None

    # ----------------------------------------------------------- server life

    def start(self) -> FakeKube:
        fake = self

        class Handler(_Handler):
            kube = fake

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        serve = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02})
        serve.daemon = True
        serve.start()
        return self

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    @property
    def url(self) -> str:
        assert self.server
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def api_client(self) -> k8s_client.ApiClient:
        cfg = k8s_client.Configuration(host=self.url)
        cfg.retries = False
        return k8s_client.ApiClient(cfg)

    # -------------------------------------------------------- error injection

    def fail(
        self,
        method: str,
        path: str,
        status: int | None = 500,
        *,
        times: int = 1,
        delay: float = 0.0,
        retry_after: int | None = None,
        after: bool = False,
    ) -> Rule:
        rule = Rule(method.upper(), re.compile(path), status, times, delay, retry_after, after)
        with self.lock:
            self.rules.append(rule)
        return rule

    def delay(self, method: str, path: str, seconds: float, *, times: int = 1, after: bool = False) -> Rule:
        return self.fail(method, path, status=None, times=times, delay=seconds, after=after)

    def _rule_for(self, method: str, path: str) -> Rule | None:
        with self.lock:
            for rule in self.rules:
                if rule.method in (method, "*") and rule.path.search(path) and rule.hits < rule.times:
                    rule.hits += 1
                    return rule
        return None

    # ------------------------------------------------------------- the store

    def get(self, plural: str, ns: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            obj = self.objects.get((plural, ns, name))
            return copy.deepcopy(obj) if obj else None

    def list(self, plural: str, ns: str | None = None, selector: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            out = [
                copy.deepcopy(o)
                for (p, n, _), o in sorted(self.objects.items())
                if p == plural and ns in (None, n) and match_labels(selector, _labels(o))
            ]
        return out

    def create(self, plural: str, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        kind, api_version = KINDS[plural]
        obj = copy.deepcopy(body)
        obj.setdefault("kind", kind)
        obj.setdefault("apiVersion", api_version)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + _suffix()
        meta["namespace"] = ns
        meta.update(uid=str(uuid.uuid4()), resourceVersion=str(next(self.rv)), creationTimestamp=now_iso())
        if plural == "secrets" and "stringData" in obj:
            data = obj.setdefault("data", {})
            for key, value in obj.pop("stringData").items():
                data[key] = base64.b64encode(value.encode()).decode()
        if plural == "jobs":
            meta["generation"] = 1
            obj["status"] = {"active": 0, "startTime": now_iso(), "uncountedTerminatedPods": {}, "ready": 0}
        with self.lock:
            key = (plural, ns, meta["name"])
            if key in self.objects:
                raise ApiError(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists')
            self.objects[key] = obj
            if plural == "jobs":
                self._job_created(obj)
            return copy.deepcopy(obj)

    def replace(self, plural: str, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            old = self.objects.get((plural, ns, name))
            if old is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            for key in ("uid", "creationTimestamp", "namespace"):
                meta[key] = old["metadata"][key]
            meta["resourceVersion"] = str(next(self.rv))
            if plural == "secrets" and "stringData" in obj:
                plain = obj.pop("stringData")
                obj["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in plain.items()}
            self.objects[(plural, ns, name)] = obj
            return copy.deepcopy(obj)

    def patch(self, plural: str, ns: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            old = self.objects.get((plural, ns, name))
            if old is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            obj = merge_patch(old, patch)
            obj["metadata"]["resourceVersion"] = str(next(self.rv))
            self.objects[(plural, ns, name)] = obj
            return copy.deepcopy(obj)

    def delete(
        self,
        plural: str,
        ns: str,
        name: str,
        policy: str | None = None,
        *,
        by_user: bool = True,
    ) -> dict[str, Any]:
        with self.lock:
            obj = self.objects.pop((plural, ns, name), None)
            if obj is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            uid = obj["metadata"]["uid"]
            if policy != "Orphan":
                for (p, n, nm), dep in list(self.objects.items()):
                    owners = dep["metadata"].get("ownerReferences") or []
                    if n == ns and any(o.get("uid") == uid for o in owners):
                        self.delete(p, n, nm, policy, by_user=False)
            if plural == "pods" and by_user:
                self._pod_deleted(obj)
            self.processes.pop(name, None)
            return obj

    # ------------------------------------------------------- Job controller

    def _job_created(self, job: dict[str, Any]) -> None:
        template = job["spec"]["template"]
        name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
        for index in range(job["spec"].get("completions") or 1):
            labels = dict(template["metadata"].get("labels") or {})
            labels.update(
                {
                    "batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
                    "batch.kubernetes.io/job-name": name,
                    "controller-uid": job["metadata"]["uid"],
                    "job-name": name,
                    INDEX_LABEL: str(index),
                }
            )
            annotations = dict(template["metadata"].get("annotations") or {})
            annotations[INDEX_LABEL] = str(index)
            spec = copy.deepcopy(template["spec"])
            spec["hostname"] = f"{name}-{index}"
            for c in spec["containers"]:
                c.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "value": str(index)})
            pod = {
                "metadata": {
                    "name": f"{name}-{index}-{_suffix()}",
                    "labels": labels,
                    "annotations": annotations,
                    "finalizers": ["batch.kubernetes.io/job-tracking"],
                    "ownerReferences": [
                        {
                            "apiVersion": "batch/v1",
                            "kind": "Job",
                            "name": name,
                            "uid": job["metadata"]["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": spec,
            }
            created = self.create("pods", ns, pod)
            self.objects[("pods", ns, created["metadata"]["name"])]["status"] = {
                "phase": "Pending",
                "conditions": [],
                "qosClass": "Burstable",
            }
            self.event(job, "SuccessfulCreate", f"Created pod: {created['metadata']['name']}")
        self._sync(job)

    def _pods_of(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        uid = job["metadata"]["uid"]
        return sorted(
            (
                o
                for (p, _, _), o in self.objects.items()
                if p == "pods" and uid in {r.get("uid") for r in o["metadata"].get("ownerReferences") or []}
            ),
            key=lambda o: int(o["metadata"]["labels"][INDEX_LABEL]),
        )

    def _sync(self, job: dict[str, Any]) -> None:
        """Job controller, backoffLimit semantics: any failure beyond the limit fails the Job."""
        status = job["status"]
        if any(c["type"] in ("Complete", "Failed") for c in status.get("conditions") or []):
            return
        pods = self._pods_of(job)
        phases = [p["status"]["phase"] for p in pods]
        failed = phases.count("Failed") + status.get("deletedActive", 0)
        status.update(
            active=sum(ph in ("Pending", "Running") for ph in phases),
            succeeded=phases.count("Succeeded"),
            failed=failed,
            ready=phases.count("Running"),
        )
        if failed > job["spec"].get("backoffLimit", 6):
            ts = now_iso()
            message = "Job has reached the specified backoff limit"
            status["conditions"] = [
                {
                    "type": "FailureTarget",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": message,
                },
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": message},
            ]
            for c in status["conditions"]:
                c["lastTransitionTime"] = c["lastProbeTime"] = ts
            self.event(job, "BackoffLimitExceeded", message, "Warning")
            for pod in pods:  # the controller removes what is still active
                if pod["status"]["phase"] in ("Pending", "Running"):
                    self.event(pod, "Killing", "Stopping container trainer", host=pod["spec"].get("nodeName"))
                    self.delete("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], by_user=False)
            status["active"] = 0
        elif len(pods) == job["spec"]["completions"] and all(ph == "Succeeded" for ph in phases):
            ts = now_iso()
            status["conditions"] = [
                {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": ts},
                {"type": "Complete", "status": "True", "lastTransitionTime": ts},
            ]
            status["completionTime"] = ts
            status["completedIndexes"] = f"0-{len(pods) - 1}" if len(pods) > 1 else "0"
            self.event(job, "Completed", "Job completed")

    def _pod_deleted(self, pod: dict[str, Any]) -> None:
        if pod.get("status", {}).get("phase") not in ("Pending", "Running"):
            return
        for ref in pod["metadata"].get("ownerReferences") or []:
            job = self.objects.get(("jobs", pod["metadata"]["namespace"], ref["name"]))
            if job and job["metadata"]["uid"] == ref["uid"]:
                job["status"]["deletedActive"] = job["status"].get("deletedActive", 0) + 1
                self._sync(job)

    # ------------------------------------------------------------ simulation

    def event(
        self,
        obj: dict[str, Any],
        reason: str,
        message: str,
        type_: str = "Normal",
        *,
        host: str | None = None,
    ) -> None:
        meta = obj["metadata"]
        ts = now_iso()
        source = {"component": "kubelet", "host": host} if host else {"component": "fake-controller"}
        ev = {
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}"},
            "involvedObject": {
                "kind": obj.get("kind") or ("Pod" if "hostname" in obj.get("spec", {}) else "Job"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "apiVersion": obj.get("apiVersion", "v1"),
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": source,
            "firstTimestamp": ts,
            "lastTimestamp": ts,
            "count": 1,
            "reportingComponent": source["component"],
        }
        self.create("events", meta["namespace"], ev)

    def job(self, name: str, ns: str) -> dict[str, Any]:
        obj = self.objects[("jobs", ns, name)]
        return obj

    def pods(self, job: str, ns: str) -> list[dict[str, Any]]:
        with self.lock:
            return self._pods_of(self.job(job, ns))

    def pod(self, job: str, ns: str, index: int) -> dict[str, Any]:
        return next(p for p in self.pods(job, ns) if p["metadata"]["labels"][INDEX_LABEL] == str(index))

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

    # -------------------------------------------------------------- exec

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


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


def _suffix() -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=5))


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


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


REASONS = {
    404: "NotFound",
    409: "AlreadyExists",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


class _Handler(BaseHTTPRequestHandler):
    kube: FakeKube
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    wbufsize = 1 << 16  # one write per response (flushed by the server after each request)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        record = Request(method, url.path, query, body)
        self.kube.requests.append(record)
        rule = self.kube._rule_for(method, url.path)
        if rule is not None:
            if rule.delay and not rule.after:
                time.sleep(rule.delay)
            if rule.status:
                record.status = rule.status
                headers = {"Retry-After": str(rule.retry_after)} if rule.retry_after is not None else {}
                reason = REASONS.get(rule.status, "InternalError")
                with contextlib.suppress(OSError):
                    self._send(rule.status, _status(rule.status, reason, f"injected {rule.status}"), headers)
                return
        try:
            code, out = self._route(method, url.path, query, body)
        except ApiError as exc:
            code, out = exc.code, _status(exc.code, exc.reason, exc.message)
        record.status = code
        if rule is not None and rule.after:
            time.sleep(rule.delay)
        try:
            if code == 101:
                return
            self._send(code, out)
        except OSError:  # the client gave up (an injected delay): nothing to answer
            self.close_connection = True

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        kube = self.kube
        m = CORE.match(path) or BATCH.match(path)
        if not m:
            return 404, _status(404, "NotFound", f"the fake has no route for {path}")
        ns, plural, name = m.group(1), m.group(2), m.group(3)
        sub = m.group(4) if m.re is CORE else None
        kind, api_version = KINDS[plural]
        if sub == "exec":
            self._exec(ns, name, query.get("command", []))
            return 101, None
        if method == "GET" and name:
            obj = kube.get(plural, ns, name)
            if obj is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            return 200, obj
        if method == "GET":
            items = [
                o
                for o in kube.list(plural, ns, (query.get("labelSelector") or [None])[0])
                if match_fields((query.get("fieldSelector") or [None])[0], o)
            ]
            meta = {"resourceVersion": str(next(kube.rv))}
            return 200, {"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta, "items": items}
        if method == "POST":
            if kube.validate:
                kube.validate(body)
            return 201, kube.create(plural, ns, body)
        if method == "PUT":
            return 200, kube.replace(plural, ns, name, body)
        if method == "PATCH":
            return 200, kube.patch(plural, ns, name, body)
        if method == "DELETE":
            opts = body or {}
            policy = opts.get("propagationPolicy") or (query.get("propagationPolicy") or [None])[0]
            obj = kube.delete(plural, ns, name, policy)
            if plural == "pods":
                return 200, obj
            details = {"name": name, "kind": plural, "uid": obj["metadata"]["uid"]}
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": details}
        return 405, _status(405, "MethodNotAllowed", method)

    def _exec(self, ns: str, pod: str, command: list[str]) -> None:
        """Answer a WebSocket exec (v4.channel.k8s.io): stdout on channel 1, the exit status on channel 3."""
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.send_header("Sec-WebSocket-Protocol", "v4.channel.k8s.io")
        self.end_headers()
        output, code = self.kube.exec(ns, pod, command)
        if code == 0:
            status: dict[str, Any] = {"metadata": {}, "status": "Success"}
        else:
            status = {
                "metadata": {},
                "status": "Failure",
                "message": f"command terminated with non-zero exit code: {code}",
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
            }
        for channel, payload in ((1, output.encode()), (3, json.dumps(status).encode())):
            if payload:
                self.wfile.write(_ws_frame(0x2, bytes([channel]) + payload))
        self.wfile.write(_ws_frame(0x8, (1000).to_bytes(2, "big")))
        self.wfile.flush()
        self.close_connection = True

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


def _ws_frame(opcode: int, payload: bytes) -> bytes:
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([n])
    elif n < 1 << 16:
        head += bytes([126]) + n.to_bytes(2, "big")
    else:
        head += bytes([127]) + n.to_bytes(8, "big")
    return head + payload
