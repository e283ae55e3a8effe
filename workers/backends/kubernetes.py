"""The Kubernetes execution backend (EKS in production), through the official `kubernetes` client.

One attempt of a job is an Indexed batch Job (one pod per node running
`ft_launcher`) plus a headless Service for the rendezvous, both labelled with
the job id and attempt; the Service is owned by the Job, so deleting the Job
removes the whole attempt. The trainer token lives in a per-job Secret that
outlives attempts and is removed by `delete_job_resources` at final cleanup.

`status()` turns what Kubernetes says (the Job, its pods, their Events) into an
`AttemptStatus` with a human cause and idempotent `ObservedEvent`s. It never
raises: when the API cannot be read it says "pending, status unknown".
`launch`, `cancel`, `inject_fault` and `delete_job_resources` retry transient
API errors (429, 5xx, timeouts) with bounded backoff and treat 409 on create
and 404 on delete as done; if the API still fails they raise
`KubernetesBackendError` (the job itself is untouched, the call can be retried).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import urllib3
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, stop_after_delay

from api.core.config import Settings, get_settings
from api.schemas.spec import JobSpec
from workers.backends import kubernetes_manifests as m
from workers.backends.base import (
    AttemptPhase,
    AttemptStatus,
    FaultNotSupported,
    FaultRequest,
    LaunchRequest,
    ObservedEvent,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

TRANSIENT_STATUSES = frozenset({0, 408, 429, 500, 502, 503, 504})

# Why a pod or its node went away, as Kubernetes words it.
NODE_LEVEL_POD_REASONS = frozenset(
    {"Evicted", "NodeLost", "Shutdown", "Terminated", "NodeShutdown", "UnexpectedAdmissionError"}
)
NODE_LEVEL_DISRUPTIONS = frozenset({"DeletionByTaintManager", "DeletionByPodGC", "TerminationByKubelet"})
NODE_LOSS_EVENT_REASONS = ("NodeNotReady", "NodeLost", "NodeShutdown", "TaintManagerEviction")
IMAGE_ERRORS_PERMANENT = frozenset({"InvalidImageName", "ErrImageNeverPull"})
# Waiting reasons that may clear up by themselves (a registry hiccup, a Secret or PVC not there yet).
STUCK_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)

# Signals one rank inside a pod: the oldest process whose environment has RANK=<rank>
# (torchrun/ft_launcher give each worker its global rank; children inherit it, so the
# lowest pid is the worker itself). Prints a marker the backend parses.
SIGNAL_RANK_SCRIPT = r"""
sig="$1"; want="RANK=$2"
for pid in $(ls /proc | grep -E '^[0-9]+$' | sort -n); do
  [ "$pid" = "$$" ] && continue
  if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "$want"; then
    kill -s "$sig" "$pid" && echo "ftplane-fault: signalled $pid" && exit 0
    echo "ftplane-fault: kill failed for $pid"; exit 4
  fi
done
echo "ftplane-fault: no process with $want"; exit 3
""".strip()
FAULT_SIGNALS = {"crash": "KILL", "hang": "STOP"}


class _NoAliasDumper(yaml.SafeDumper):
    """YAML for people: repeated label maps are written out, not as &anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


class KubernetesBackendError(RuntimeError):
    """The Kubernetes API refused or kept failing a call; `retryable` when trying later may help."""

    def __init__(self, message: str, *, retryable: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return (exc.status or 0) in TRANSIENT_STATUSES
    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)


def _status_of(exc: BaseException) -> int | None:
    return exc.status if isinstance(exc, ApiException) else None


def _api_message(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        try:
            body = json.loads(exc.body or "{}")
            text = body.get("message") or exc.reason
        except (ValueError, AttributeError):
            text = exc.reason
        return f"HTTP {exc.status}: {text}"
    return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries of transient API errors: attempts, exponential backoff (with jitter), a deadline."""

    attempts: int = 5
    base_wait_s: float = 0.5
    max_wait_s: float = 8.0
    deadline_s: float = 45.0

    def wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, ApiException) and exc.status == 429 and exc.headers:
            try:  # the API server's Retry-After, capped
                return min(float(exc.headers.get("Retry-After", "")), self.max_wait_s)
            except ValueError:
                pass
        backoff = min(self.max_wait_s, self.base_wait_s * 2 ** (state.attempt_number - 1))
        return backoff * (0.5 + random.random() / 2)


class KubernetesBackend:
    """Launches, watches, disturbs and tears down job attempts on a Kubernetes cluster."""

    name = "kubernetes"

    def __init__(
        self,
        api_client: k8s_client.ApiClient | None = None,
        *,
        settings: Settings | None = None,
        cluster_domain: str = m.DEFAULT_CLUSTER_DOMAIN,
        request_timeout: tuple[float, float] = (5.0, 30.0),
        retry: RetryPolicy | None = None,
        image_pull_grace_s: float = 300.0,
        ttl_after_finished_s: int | None = None,
        exec_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api_client
        self._settings = settings
        self._lock = threading.Lock()
        self.cluster_domain = cluster_domain
        self.request_timeout = request_timeout
        self.retry = retry or RetryPolicy()
        self.image_pull_grace_s = image_pull_grace_s
        self.ttl_after_finished_s = ttl_after_finished_s
        self.exec_timeout_s = exec_timeout_s
        self._clock = clock

    # ------------------------------------------------------------------ client

    @property
    def api_client(self) -> k8s_client.ApiClient:
        """The API client, built on first use (rendering needs no cluster)."""
        if self._api is None:
            with self._lock:
                if self._api is None:
                    self._api = self._load_client()
        return self._api

    def _load_client(self) -> k8s_client.ApiClient:
        settings = self._settings or get_settings()
        in_cluster = settings.kube_in_cluster
        if in_cluster is None:
            in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not settings.kube_context
        configuration = k8s_client.Configuration()
        try:
            if in_cluster:
                k8s_config.load_incluster_config(client_configuration=configuration)
            else:
                k8s_config.load_kube_config(
                    config_file=os.environ.get("KUBECONFIG"),  # read now, not at import time
                    context=settings.kube_context,
                    client_configuration=configuration,
                )
        except (k8s_config.ConfigException, OSError) as exc:
            context = settings.kube_context
            where = "in-cluster service account" if in_cluster else f"kubeconfig context {context!r}"
            raise KubernetesBackendError(
                f"cannot load the Kubernetes configuration ({where}): {exc}. Run the worker in the cluster "
                "with its ServiceAccount, or set FTPLANE_KUBE_CONTEXT to a context of your kubeconfig.",
                retryable=False,
            ) from exc
        configuration.retries = False  # retries are ours (bounded, logged), not urllib3's
        return k8s_client.ApiClient(configuration)

    @property
    def _core(self) -> Any:
        return k8s_client.CoreV1Api(self.api_client)

    @property
    def _batch(self) -> Any:
        return k8s_client.BatchV1Api(self.api_client)

    def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One API call with bounded retries of transient errors; other errors propagate unchanged."""
        kwargs.setdefault("_request_timeout", self.request_timeout)

        def log_retry(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.warning("kubernetes %s failed (try %d): %s; retrying", what, state.attempt_number, exc)

        retrying = Retrying(
            retry=retry_if_exception(_is_transient),
            stop=stop_after_attempt(self.retry.attempts) | stop_after_delay(self.retry.deadline_s),
            wait=self.retry.wait,
            before_sleep=log_retry,
            reraise=True,
        )
        return retrying(fn, *args, **kwargs)

    def _read(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """A GET whose JSON body is returned as a plain dict (no model round-trip)."""

        def get(**options: Any) -> dict[str, Any]:
            resp = fn(*args, _preload_content=False, **kwargs, **options)
            try:
                data: dict[str, Any] = json.loads(resp.data or b"{}")
                return data
            finally:
                resp.release_conn()

        return self._call(what, get)

    def _create(self, what: str, fn: Callable[..., Any], namespace: str, body: dict[str, Any]) -> bool:
        """Create; False when it already exists (409)."""
        try:
            self._call(f"create {what}", fn, namespace, body)
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise self._error(f"create {what}", exc) from exc
        except Exception as exc:
            raise self._error(f"create {what}", exc) from exc

    def _delete(self, what: str, fn: Callable[..., Any], name: str, namespace: str, **kwargs: Any) -> bool:
        """Delete; False when it was already gone (404)."""
        try:
            self._call(f"delete {what}", fn, name, namespace, **kwargs)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise self._error(f"delete {what}", exc) from exc
        except Exception as exc:
            raise self._error(f"delete {what}", exc) from exc

    @staticmethod
    def _error(what: str, exc: BaseException) -> KubernetesBackendError:
        status = _status_of(exc)
        hint = {
            401: "the worker's Kubernetes credentials were refused; check its ServiceAccount or kubeconfig",
            403: "the worker's ServiceAccount lacks a permission; apply the deploy/ RBAC in this namespace",
            404: "the namespace may not exist; create it or change the spec's namespace",
            422: "Kubernetes rejected the object; check the spec's image, resources and labels",
        }.get(status or -1, "the Kubernetes API is unavailable; the call can be retried later")
        return KubernetesBackendError(
            f"kubernetes {what} failed ({_api_message(exc)}): {hint}",
            retryable=_is_transient(exc),
            status=status,
        )

    # ---------------------------------------------------------------- protocol

    def _job_manifest(self, request: LaunchRequest) -> dict[str, Any]:
        ttl = self.ttl_after_finished_s
        return m.job_manifest(request, cluster_domain=self.cluster_domain, ttl_after_finished_s=ttl)

    def render(self, request: LaunchRequest) -> str:
        """The attempt's manifests as multi-document YAML; the token Secret is named, never shown."""
        spec = request.spec
        header = (
            f"# ftplane job {request.job_id}, attempt {request.attempt}, namespace {spec.namespace}.\n"
            f"# Secret {m.secret_name(request.job_id, spec.name)} (key {m.TOKEN_KEY}) holds FTPLANE_TOKEN;\n"
            "# ftplane creates it at launch. The Service gets an ownerReference to the Job at launch.\n"
        )
        docs = [
            self._job_manifest(request),
            m.service_manifest(request),
        ]
        return header + yaml.dump_all(docs, Dumper=_NoAliasDumper, sort_keys=False, explicit_start=True)

    def launch(self, request: LaunchRequest) -> None:
        """Create (or complete) the attempt: token Secret, Job, then the Service owned by the Job."""
        spec = request.spec
        ns = spec.namespace
        secret = m.secret_manifest(request)
        if not self._create("secret", self._core.create_namespaced_secret, ns, secret):
            name = secret["metadata"]["name"]
            try:
                self._call("replace secret", self._core.replace_namespaced_secret, name, ns, secret)
            except Exception as exc:
                raise self._error("replace secret", exc) from exc

        job = self._job_manifest(request)
        name = job["metadata"]["name"]
        self._create("job", self._batch.create_namespaced_job, ns, job)
        try:
            current = self._read("read job", self._batch.read_namespaced_job, name, ns)
        except Exception as exc:
            raise self._error("read job", exc) from exc
        uid = current["metadata"]["uid"]
        self._create("service", self._core.create_namespaced_service, ns, m.service_manifest(request, uid))
        log.info(
            "launched %s/%s (job %s attempt %d, %d pods)",
            ns,
            name,
            request.job_id,
            request.attempt,
            spec.nodes,
        )

    def status(self, job_id: str, attempt: int, spec: JobSpec) -> AttemptStatus:
        name = m.attempt_name(job_id, spec.name, attempt)
        ns = spec.namespace
        try:
            job = self._read("read job", self._batch.read_namespaced_job, name, ns)
        except ApiException as exc:
            if exc.status == 404:
                return AttemptStatus(phase=AttemptPhase.missing, cause=f"no Job {ns}/{name} in the cluster")
            return self._unknown(exc)
        except Exception as exc:
            return self._unknown(exc)
        try:
            pods = self._read(
                "list pods",
                self._core.list_namespaced_pod,
                ns,
                label_selector=m.attempt_selector(job_id, attempt),
            ).get("items", [])
            grace = self.image_pull_grace_s
            view = AttemptView(job, pods, [], spec=spec, now=self._clock(), image_pull_grace_s=grace)
            if view.needs_events():
                events = self._read("list events", self._core.list_namespaced_event, ns).get("items", [])
                view = AttemptView(job, pods, events, spec=spec, now=self._clock(), image_pull_grace_s=grace)
        except Exception as exc:
            return self._unknown(exc)
        return view.status()

    @staticmethod
    def _unknown(exc: BaseException) -> AttemptStatus:
        log.warning("kubernetes status unavailable: %s", exc)
        return AttemptStatus(
            phase=AttemptPhase.pending,
            cause=f"status unknown: the Kubernetes API could not be read ({_api_message(exc)}); retrying",
        )

    def inject_fault(self, job_id: str, attempt: int, spec: JobSpec, fault: FaultRequest) -> None:
        if fault.kind == "node_loss":
            self._lose_node(job_id, attempt, spec, fault.rank)
        elif fault.kind in FAULT_SIGNALS:
            self._signal_rank(job_id, attempt, spec, fault.rank, FAULT_SIGNALS[fault.kind])
        else:
            raise FaultNotSupported(f"{fault.kind} faults are injected by the trainer, not by Kubernetes")

    def cancel(self, job_id: str, attempt: int, spec: JobSpec) -> None:
        """Delete the attempt: the Job (its pods and the owned Service follow) and the Service itself."""
        name = m.attempt_name(job_id, spec.name, attempt)
        ns = spec.namespace
        self._delete("job", self._batch.delete_namespaced_job, name, ns, propagation_policy="Background")
        self._delete("service", self._core.delete_namespaced_service, name, ns)
        log.info("cancelled %s/%s (job %s attempt %d)", ns, name, job_id, attempt)

    def delete_job_resources(self, job_id: str, spec: JobSpec) -> None:
        """Final cleanup of a finished job: every attempt's Job and Service, and the token Secret."""
        ns = spec.namespace
        selector = m.job_selector(job_id)
        try:
            jobs = self._read("list jobs", self._batch.list_namespaced_job, ns, label_selector=selector)
            core = self._core
            services = self._read("list services", core.list_namespaced_service, ns, label_selector=selector)
        except Exception as exc:
            raise self._error("list job resources", exc) from exc
        for item in jobs.get("items", []):
            self._delete(
                "job",
                self._batch.delete_namespaced_job,
                item["metadata"]["name"],
                ns,
                propagation_policy="Background",
            )
        for item in services.get("items", []):
            self._delete("service", self._core.delete_namespaced_service, item["metadata"]["name"], ns)
        self._delete("secret", self._core.delete_namespaced_secret, m.secret_name(job_id, spec.name), ns)

    # ------------------------------------------------------------------ faults

    def _attempt_pods(self, job_id: str, attempt: int, spec: JobSpec) -> list[dict[str, Any]]:
        try:
            pods = self._read(
                "list pods",
                self._core.list_namespaced_pod,
                spec.namespace,
                label_selector=m.attempt_selector(job_id, attempt),
            ).get("items", [])
        except Exception as exc:
            raise self._error("list pods", exc) from exc
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return sorted(live, key=lambda p: (_completion_index(p) is None, _completion_index(p) or 0))

    def _lose_node(self, job_id: str, attempt: int, spec: JobSpec, rank: int) -> None:
        """Delete, with no grace, the pod of the node hosting `rank` (as if its node vanished)."""
        index = m.pod_index_for_rank(spec, rank)
        pods = [p for p in self._attempt_pods(job_id, attempt, spec) if _completion_index(p) == index]
        if not pods:
            raise KubernetesBackendError(
                f"node_loss: no live pod for rank {rank} (node rank {index}); is the attempt running?",
                retryable=True,
            )
        pod = pods[0]
        pod_name = pod["metadata"]["name"]
        node = pod.get("spec", {}).get("nodeName") or ""
        job_name = m.attempt_name(job_id, spec.name, attempt)
        # Remember which node this fault took down: status() blames it (and the supervisor excludes it).
        try:
            job = self._read("read job", self._batch.read_namespaced_job, job_name, spec.namespace)
            lost = _injected_node_loss(job)
            lost[pod_name] = node
            patch = {"metadata": {"annotations": {m.ANNOTATION_INJECTED_NODE_LOSS: json.dumps(lost)}}}
            self._call("annotate job", self._batch.patch_namespaced_job, job_name, spec.namespace, patch)
        except Exception as exc:
            raise self._error("annotate job", exc) from exc
        ns = spec.namespace
        self._delete("pod", self._core.delete_namespaced_pod, pod_name, ns, grace_period_seconds=0)
        log.info("injected node_loss: deleted pod %s on node %s (rank %d)", pod_name, node or "?", rank)

    def _signal_rank(self, job_id: str, attempt: int, spec: JobSpec, rank: int, signal: str) -> None:
        """Send SIGKILL/SIGSTOP to the worker process of `rank`, found through exec in its pod.

        The pod expected to host the rank is asked first; should the rendezvous have
        placed ranks otherwise, the other pods are asked after it.
        """
        preferred = m.pod_index_for_rank(spec, rank)
        pods = [p for p in self._attempt_pods(job_id, attempt, spec) if _phase(p) == "Running"]
        pods.sort(key=lambda p: _completion_index(p) != preferred)
        if not pods:
            raise KubernetesBackendError(f"no running pod to signal rank {rank} in", retryable=True)
        outputs = []
        for pod in pods:
            name = pod["metadata"]["name"]
            command = ["sh", "-c", SIGNAL_RANK_SCRIPT, "ftplane-fault", signal, str(rank)]
            try:
                output = self._exec(name, spec.namespace, command)
            except Exception as exc:
                raise self._error(f"exec in pod {name}", exc) from exc
            if "ftplane-fault: signalled" in output:
                log.info("injected SIG%s into rank %d in pod %s: %s", signal, rank, name, output.strip())
                return
            outputs.append(f"{name}: {output.strip() or 'no output'}")
        raise KubernetesBackendError(f"could not signal rank {rank}: " + "; ".join(outputs), retryable=True)

    def _exec(self, pod: str, namespace: str, command: list[str]) -> str:
        """Run `command` in the trainer container and return its output (stdout and stderr)."""
        from kubernetes.stream import stream

        log.debug("exec in %s/%s: %s", namespace, pod, shlex.join(command[:2]))
        output = stream(
            self._core.connect_get_namespaced_pod_exec,
            pod,
            namespace,
            command=command,
            container=m.CONTAINER_NAME,
            stderr=True,
            stdin=False,
            stdout=True,
            tty=False,
            _request_timeout=self.exec_timeout_s,
        )
        return output if isinstance(output, str) else str(output)


# ---------------------------------------------------------------------- status


def _parse_ts(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _iso(ts: datetime | None) -> str | None:
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z") if ts else None


def _completion_index(pod: dict[str, Any]) -> int | None:
    meta = pod.get("metadata", {})
    raw = (meta.get("labels") or {}).get(m.COMPLETION_INDEX_LABEL) or (meta.get("annotations") or {}).get(
        m.COMPLETION_INDEX_ANNOTATION
    )
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _injected_node_loss(job: dict[str, Any]) -> dict[str, str]:
    raw = (job.get("metadata", {}).get("annotations") or {}).get(m.ANNOTATION_INJECTED_NODE_LOSS)
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def _trainer_status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    for cs in statuses:
        if cs.get("name") == m.CONTAINER_NAME:
            return dict(cs)
    return dict(statuses[0]) if statuses else {}


_ASSIGNED = re.compile(r"Successfully assigned \S+ to (\S+)")


@dataclass
class Failure:
    pod: str
    uid: str
    index: int | None
    node: str | None
    reason: str
    cause: str
    node_level: bool
    exit_code: int | None = None
    at: datetime | None = None

    def event(self) -> ObservedEvent:
        details: dict[str, Any] = {"cause": self.cause, "reason": self.reason, "pod": self.pod}
        if self.index is not None:
            details["node_rank"] = self.index
        if self.exit_code is not None:
            details["exit_code"] = self.exit_code
        if self.at:
            details["ts"] = _iso(self.at)
        if self.node_level:
            key, kind = f"k8s:{self.uid}:node_failed", "node_failed"
        else:
            key, kind = f"k8s:{self.uid}:{self.reason}", "rank_failed"
        return ObservedEvent(key=key, type=kind, node=self.node, details=details)


class AttemptView:
    """One reading of an attempt (Job, pods, Events as the API returned them) and what it means."""

    def __init__(
        self,
        job: dict[str, Any],
        pods: Iterable[dict[str, Any]],
        events: Iterable[dict[str, Any]],
        *,
        spec: JobSpec,
        now: float,
        image_pull_grace_s: float = 300.0,
    ) -> None:
        self.job = job
        self.name = job["metadata"]["name"]
        self.uid = job["metadata"].get("uid", self.name)
        self.spec = spec
        self.now = datetime.fromtimestamp(now, UTC)
        self.image_pull_grace_s = image_pull_grace_s
        self.pods = [p for p in pods if _completion_index(p) is not None]
        self.injected = _injected_node_loss(job)
        # Events of this attempt's Job and pods (also of pods already gone).
        pod_name = re.compile(rf"^{re.escape(self.name)}-(\d+)-[a-z0-9]+$")
        self.job_events: list[dict[str, Any]] = []
        self.pod_events: dict[str, list[dict[str, Any]]] = {}
        for ev in sorted(events, key=_event_time):
            obj = ev.get("involvedObject") or {}
            if obj.get("kind") == "Job" and obj.get("name") == self.name:
                self.job_events.append(ev)
            elif obj.get("kind") == "Pod" and pod_name.match(obj.get("name", "")):
                self.pod_events.setdefault(obj["name"], []).append(ev)
        self._pod_name = pod_name

    # --- what to read

    def needs_events(self) -> bool:
        """Events are read only when something is off: a steady running attempt costs two reads."""
        if _condition(self.job, "Complete"):
            return False
        live = [p for p in self.pods if not p["metadata"].get("deletionTimestamp")]
        healthy = {"Running", "Succeeded"}
        return len(live) < self.spec.nodes or any(_phase(p) not in healthy for p in live)

    # --- facts about pods

    def _node_of(self, pod_name: str, pod: dict[str, Any] | None = None) -> str | None:
        node = (pod or {}).get("spec", {}).get("nodeName")
        if node:
            return str(node)
        if pod_name in self.injected and self.injected[pod_name]:
            return self.injected[pod_name]
        for ev in self.pod_events.get(pod_name, []):
            found = _ASSIGNED.search(ev.get("message") or "")
            if ev.get("reason") == "Scheduled" and found:
                return found.group(1)
        for ev in self.pod_events.get(pod_name, []):
            host = (ev.get("source") or {}).get("host")
            if host:
                return str(host)
        return None

    def _node_loss_event(self, pod_name: str) -> dict[str, Any] | None:
        """The most telling Event of a node going away (NodeNotReady says more than the eviction after it)."""
        events = self.pod_events.get(pod_name, [])
        found = [ev for ev in events if ev.get("reason") in NODE_LOSS_EVENT_REASONS]
        return min(found, key=lambda ev: NODE_LOSS_EVENT_REASONS.index(ev["reason"]), default=None)

    def _pod_failure(self, pod: dict[str, Any]) -> Failure | None:
        meta, status = pod["metadata"], pod.get("status", {})
        name, uid, index = meta["name"], meta.get("uid", meta["name"]), _completion_index(pod)
        node = self._node_of(name, pod)
        on_node = f" on node {node}" if node else ""
        phase = status.get("phase")
        disruption = _condition(pod, "DisruptionTarget") or {}
        disruption_reason = disruption.get("reason", "")
        trainer = _trainer_status(pod)
        term = (trainer.get("state") or {}).get("terminated")
        at = _parse_ts((term or {}).get("finishedAt")) or _parse_ts(meta.get("deletionTimestamp"))

        if name in self.injected:
            cause = f"node {node or '?'} lost: pod {name} deleted by an injected node_loss fault"
            return Failure(name, uid, index, node, "NodeLost", cause, True, at=at)
        if phase == "Failed":
            reason = status.get("reason") or ""
            message = status.get("message") or disruption.get("message") or ""
            if reason == "Evicted":
                cause = f"pod evicted{on_node}: {message}".rstrip(": ")
                return Failure(name, uid, index, node, "Evicted", cause, True, at=at)
            if reason in NODE_LEVEL_POD_REASONS or disruption_reason in NODE_LEVEL_DISRUPTIONS:
                why = reason or disruption_reason
                cause = f"node {node or '?'} failed ({why}): {message}".rstrip(": ")
                return Failure(name, uid, index, node, why, cause, True, at=at)
            if term:
                code = term.get("exitCode")
                treason = term.get("reason") or ""
                shown = f" ({treason})" if treason and treason not in ("Error", "Completed") else ""
                cause = f"exit code {code}{shown}{on_node}"
                if disruption_reason == "PreemptionByScheduler":
                    cause += " (preempted by a higher-priority pod)"
                why = treason or "Error"
                return Failure(name, uid, index, node, why, cause, False, exit_code=code, at=at)
            said = f": {reason} {message}".rstrip() if reason or message else ""
            cause = f"pod {name} failed{on_node}{said}"
            return Failure(name, uid, index, node, reason or "Failed", cause, False, at=at)
        if phase == "Unknown":
            cause = f"node {node or '?'} stopped responding (pod {name} is in phase Unknown)"
            return Failure(name, uid, index, node, "NodeLost", cause, True, at=at)
        if meta.get("deletionTimestamp"):
            loss = self._node_loss_event(name)
            if disruption_reason in NODE_LEVEL_DISRUPTIONS or loss:
                why = disruption_reason or (loss or {}).get("reason", "NodeLost")
                cause = f"node {node or '?'} lost ({why}): pod {name} is being deleted"
                return Failure(name, uid, index, node, "NodeLost", cause, True, at=at)
        return None

    def _vanished_failures(self, present: set[str]) -> tuple[list[Failure], list[Failure]]:
        """Pods of this attempt that are gone but left Events (or an injected-fault record).

        Returns (node losses, other deletions); the latter explain a failed Job only when
        nothing else does (the Job controller itself deletes the pods of a failed Job).
        """
        out: list[Failure] = []
        deleted: list[Failure] = []
        for name in sorted(set(self.pod_events) | set(self.injected)):
            found = self._pod_name.match(name)
            if name in present or not found:
                continue
            index = int(found.group(1))
            node = self._node_of(name)
            events = self.pod_events.get(name, [])
            uids = [ev["involvedObject"]["uid"] for ev in events if ev["involvedObject"].get("uid")]
            uid = uids[0] if uids else name
            at = _event_time(events[-1]) if events else None
            if name in self.injected:
                cause = f"node {node or '?'} lost: pod {name} deleted by an injected node_loss fault"
                out.append(Failure(name, uid, index, node, "NodeLost", cause, True, at=at))
                continue
            loss = self._node_loss_event(name)
            if loss:
                said = loss.get("message") or "pod deleted"
                cause = f"node {node or '?'} lost ({loss.get('reason')}): {said}"
                out.append(Failure(name, uid, index, node, "NodeLost", cause, True, at=_event_time(loss)))
            else:
                cause = f"pod {name}{' on node ' + node if node else ''} was deleted before it finished"
                deleted.append(Failure(name, uid, index, node, "Deleted", cause, False, at=at))
        return out, deleted

    def _failing(self) -> dict[str, Any] | None:
        return _condition(self.job, "Failed") or _condition(self.job, "FailureTarget")

    # --- the verdict

    def status(self) -> AttemptStatus:
        n = self.spec.nodes
        events: list[ObservedEvent] = []
        by_index: dict[int, dict[str, Any]] = {}
        for pod in sorted(self.pods, key=lambda p: p["metadata"].get("creationTimestamp") or ""):
            by_index[_completion_index(pod) or 0] = pod  # the newest pod of each index

        scheduled = [p for p in by_index.values() if p.get("spec", {}).get("nodeName")]
        if len(scheduled) >= n:
            nodes = sorted({p["spec"]["nodeName"] for p in scheduled})
            conds = [c for p in scheduled for c in _conds(p, "PodScheduled")]
            times = [_parse_ts(c.get("lastTransitionTime")) for c in conds]
            events.append(
                ObservedEvent(
                    key=f"k8s:{self.uid}:scheduled",
                    type="scheduled",
                    node=nodes[0] if len(nodes) == 1 else None,
                    details=_with_ts({"nodes": nodes, "pods": n}, times),
                )
            )
        started = [p for p in by_index.values() if _started_at(p) is not None]
        if len(started) >= n:
            events.append(
                ObservedEvent(
                    key=f"k8s:{self.uid}:running",
                    type="running",
                    details=_with_ts({"pods": n}, [_started_at(p) for p in started]),
                )
            )

        if _condition(self.job, "Complete") or (
            len(by_index) >= n and all(_phase(p) == "Succeeded" for p in by_index.values())
        ):
            return AttemptStatus(phase=AttemptPhase.succeeded, events=events)

        failures = [f for f in (self._pod_failure(p) for p in self.pods) if f]
        lost, deleted = self._vanished_failures({p["metadata"]["name"] for p in self.pods})
        failures += lost
        failing = self._failing()
        if failing and not failures:
            failures = deleted
        if failures or failing:
            return self._failed(failures, failing, events)

        stuck = self._stuck()
        if stuck is not None:
            failed, cause = stuck
            return AttemptStatus(
                phase=AttemptPhase.failed if failed else AttemptPhase.pending, cause=cause, events=events
            )

        running = [p for p in by_index.values() if _phase(p) in ("Running", "Succeeded")]
        if len(running) >= n:
            return AttemptStatus(phase=AttemptPhase.running, events=events)
        cause = self._pending_cause(len(running))
        return AttemptStatus(phase=AttemptPhase.pending, cause=cause, events=events)

    def _failed(
        self, failures: list[Failure], failing: dict[str, Any] | None, events: list[ObservedEvent]
    ) -> AttemptStatus:
        # A lost or evicting node explains the rest (ranks elsewhere fail after it), so it comes
        # first; among the same sort of failure, the earliest is the cause.
        far = datetime.max.replace(tzinfo=UTC)
        failures.sort(key=lambda f: (not f.node_level, f.at or far, f.index or 0))
        if failures:
            cause = failures[0].cause
            # every node blamed, and the first failure of a program (later ones are its echoes)
            first_crash = next((f for f in failures if not f.node_level), None)
            reported = [f for f in failures if f.node_level or f is first_crash]
        else:
            reason = (failing or {}).get("reason") or "Failed"
            message = (failing or {}).get("message") or "the Job failed"
            deadline = reason == "DeadlineExceeded"
            cause = f"deadline exceeded: {message}" if deadline else f"{message} ({reason})"
            reported = []
        events += [f.event() for f in reported]
        failed_nodes = tuple(sorted({f.node for f in failures if f.node_level and f.node}))
        return AttemptStatus(phase=AttemptPhase.failed, cause=cause, failed_nodes=failed_nodes, events=events)

    def _stuck(self) -> tuple[bool, str] | None:
        """A pod that cannot start: (fail the attempt?, cause)."""
        for pod in self.pods:
            if pod.get("status", {}).get("phase") != "Pending":
                continue
            waiting = (_trainer_status(pod).get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason") or ""
            message = waiting.get("message") or ""
            image = self.spec.image
            if reason in IMAGE_ERRORS_PERMANENT:
                return True, f"image {image} cannot be used ({reason}): {message}".rstrip(": ")
            if reason in STUCK_WAITING_REASONS:
                bound = [_parse_ts(c.get("lastTransitionTime")) for c in _conds(pod, "PodScheduled")]
                created = _parse_ts(pod["metadata"].get("creationTimestamp"))
                since = next((t for t in bound if t), None) or created
                waited = (self.now - (since or self.now)).total_seconds()
                pulling = "Image" in reason
                what = f"image {image} cannot be pulled" if pulling else "the container cannot be created"
                detail = f"{what} ({reason}): {message}".rstrip(": ")
                if waited >= self.image_pull_grace_s:
                    return True, f"{detail}; still failing after {waited:.0f} s"
                return False, f"{detail}; Kubernetes keeps retrying"
        return None

    def _pending_cause(self, running: int) -> str:
        n = self.spec.nodes
        for pod in self.pods:
            for cond in pod.get("status", {}).get("conditions") or []:
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                    why = cond.get("message") or cond.get("reason")
                    return f"waiting for nodes ({running}/{n} pods running): {why}"
        for ev in reversed(self.job_events):
            if ev.get("reason") == "FailedCreate":
                return f"pods cannot be created: {ev.get('message')}"
        created = len(self.pods)
        if created < n:
            return f"{created}/{n} pods created"
        bound = sum(1 for p in self.pods if p.get("spec", {}).get("nodeName"))
        if bound < n:
            return f"waiting for the scheduler ({bound}/{n} pods bound to nodes)"
        return f"containers starting ({running}/{n} pods running)"


def _phase(pod: dict[str, Any]) -> str | None:
    phase = pod.get("status", {}).get("phase")
    return str(phase) if phase else None


def _conds(pod: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    conditions = pod.get("status", {}).get("conditions") or []
    return [c for c in conditions if c.get("type") == kind and c.get("status") == "True"]


def _started_at(pod: dict[str, Any]) -> datetime | None:
    state = _trainer_status(pod).get("state") or {}
    for key in ("running", "terminated"):
        if state.get(key) and state[key].get("startedAt"):
            return _parse_ts(state[key]["startedAt"])
    return None


def _with_ts(details: dict[str, Any], times: Iterable[datetime | None]) -> dict[str, Any]:
    known = [t for t in times if t]
    if known:
        details["ts"] = _iso(max(known))  # when the last pod got there
    return details


def _event_time(ev: dict[str, Any]) -> datetime:
    for value in (
        ev.get("lastTimestamp"),
        ev.get("eventTime"),
        ev.get("firstTimestamp"),
        (ev.get("metadata") or {}).get("creationTimestamp"),
    ):
        ts = _parse_ts(value)
        if ts:
            return ts
    return datetime.min.replace(tzinfo=UTC)
