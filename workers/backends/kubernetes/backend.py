"""The Kubernetes execution backend (EKS in production): the `Backend` protocol, through the official client.

One attempt of a job is an Indexed batch Job (one pod per node running the node
agent and `ft_launcher`, and its hot spares) plus a headless Service for the
rendezvous and a Secret with the trainer token, all labelled with the job id and
attempt and owned by the Job, so deleting the Job removes the whole attempt. The
Job is created suspended and resumed once its Secret exists (its pods never start
without their token); with a `queue`, Kueue resumes it instead.

`status()` turns what Kubernetes says into an `AttemptReading` with a structured
cause and idempotent `ObservedEvent`s (`status.AttemptView`), reading no more than
it needs: the Job and its pods (label-selected, from the API server's cache) every
pass; its nodes' health through `nodes.NodeHealth` (a selected list at a bounded
rate); Events only when something is off, and only the Job's own and a few of its
pods' (field-selected); a queued attempt's Kueue Workload. It never raises: when
the API cannot be read it says "pending, status unknown". `launch`, `cancel` and
`delete_job_resources` retry transient API errors (429, 5xx, timeouts) with bounded
backoff and treat 409 on create and 404 on delete as done; if the API still fails
they raise `KubernetesBackendError` (the job itself is untouched, the call can be
retried). Objects are created with strict field validation: a field the API server
does not know is an error, not silently dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Literal

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from api.core.config import Settings, get_settings
from api.schemas.causes import Cause, CauseClass
from api.schemas.spec import JobSpec
from workers.backends.base import AttemptPhase, AttemptReading, LaunchRequest
from workers.backends.kubernetes import kueue, placement, policy
from workers.backends.kubernetes import manifests as m
from workers.backends.kubernetes.client import KubernetesApi, RetryPolicy, api_message, failure_of
from workers.backends.kubernetes.events import EventReader
from workers.backends.kubernetes.kueue_api import Workloads
from workers.backends.kubernetes.nodes import NodeHealth, NodeState, remediate
from workers.backends.kubernetes.pods import PAGE, PodWatches
from workers.backends.kubernetes.status import AttemptView

log = logging.getLogger(__name__)


class KubernetesBackend:
    """Launches, watches and tears down job attempts on a Kubernetes cluster (faults are the node agents' job)."""

    name = "kubernetes"
    can_exclude_nodes = True

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
        clock: Callable[[], float] = time.time,
        node_refresh_s: float = 2.0,
        unhealthy_nodes: str | None = None,
        pod_reads: Literal["watch", "list"] = "watch",
    ) -> None:
        self.api = KubernetesApi(api_client, settings=settings, request_timeout=request_timeout, retry=retry)
        self.pod_watches = PodWatches(self.api)  # idleness in real time, whatever clock causes are judged by
        self.workloads = Workloads(self.api)
        self.events = EventReader(self.api, clock=clock)
        self.pod_reads = pod_reads  # list: every pass reads all the attempt's pods (the benchmark's baseline)
        self.node_health = NodeHealth(self.api, refresh_s=node_refresh_s)
        self.cluster_domain = cluster_domain
        self.image_pull_grace_s = image_pull_grace_s
        self.ttl_after_finished_s = ttl_after_finished_s
        self._settings = settings
        self._unhealthy_nodes = unhealthy_nodes  # off | cordon | taint; default: the settings'
        self._clock = clock

    @property
    def api_client(self) -> k8s_client.ApiClient:
        """The API client, built on first use (rendering needs no cluster)."""
        return self.api.api_client

    def _job_manifest(self, request: LaunchRequest) -> dict[str, Any]:
        ttl = self.ttl_after_finished_s
        return m.job_manifest(request, cluster_domain=self.cluster_domain, ttl_after_finished_s=ttl)

    def render(self, request: LaunchRequest) -> str:
        """The attempt's manifests as multi-document YAML; the token Secret is named, never shown."""
        return m.render(request, cluster_domain=self.cluster_domain, ttl_after_finished_s=self.ttl_after_finished_s)

    def launch(self, request: LaunchRequest) -> None:
        """Create (or complete) the attempt: the Job, suspended; the token Secret and the Service it owns; then
        resume the Job (unless Kueue is to). Nodes blamed before are cordoned or tainted when so configured."""
        spec = request.spec
        ns = spec.namespace
        api = self.api
        job = self._job_manifest(request)
        job["spec"]["suspend"] = True  # no pod starts before its token Secret exists
        name = job["metadata"]["name"]
        api.create("job", api.batch.create_namespaced_job, ns, job)
        with failure_of("read job"):
            current = api.read("read job", api.batch.read_namespaced_job, name, ns)
        uid = current["metadata"]["uid"]
        api.create("secret", api.core.create_namespaced_secret, ns, m.secret_manifest(request, uid))
        api.create("service", api.core.create_namespaced_service, ns, m.service_manifest(request, uid))
        if not spec.queue and current["spec"].get("suspend"):
            with failure_of("resume job"):
                api.call("resume job", api.batch.patch_namespaced_job, name, ns, {"spec": {"suspend": False}})
        mode = self._unhealthy_nodes or (self._settings or get_settings()).kube_unhealthy_nodes
        remediate(api, placement.excluded(request.excluded_nodes, spec), mode, f"blamed by job {request.job_id}")
        queued = f", queued in {spec.queue}" if spec.queue else ""
        pods = policy.pod_count(spec)
        log.info(
            "launched %s/%s (job %s attempt %d, %d pods%s)", ns, name, request.job_id, request.attempt, pods, queued
        )

    def status(self, job_id: str, attempt: int, spec: JobSpec) -> AttemptReading:
        name = m.attempt_name(job_id, spec.name, attempt)
        ns = spec.namespace
        api = self.api
        try:
            job = api.read("read job", api.batch.read_namespaced_job, name, ns)
        except ApiException as exc:
            if exc.status == 404:
                missing = Cause(CauseClass.other, f"no Job {ns}/{name} in the cluster")
                return AttemptReading(phase=AttemptPhase.missing, cause=missing)
            return self._unknown(exc)
        except Exception as exc:
            return self._unknown(exc)
        try:
            pods = self._pods(ns, m.attempt_selector(job_id, attempt))
            workload, kueue_missing = self._workload(job, spec)
            seen: dict[str, Any] = {
                "spec": spec,
                "now": self._clock(),
                "image_pull_grace_s": self.image_pull_grace_s,
                "workload": workload,
                "kueue_missing": kueue_missing,
            }
            view = AttemptView(job, pods, [], **seen)
            seen["nodes"] = self._nodes(view, spec)
            view = AttemptView(job, pods, [], **seen)
            if view.needs_events():
                view = AttemptView(job, pods, self.events.read(view, job, ns), **seen)
        except Exception as exc:
            return self._unknown(exc)
        reading = view.status()
        if reading.phase in (AttemptPhase.succeeded, AttemptPhase.failed):
            self.pod_watches.forget(ns, m.attempt_selector(job_id, attempt))
        return reading

    def _pods(self, ns: str, selector: str) -> list[dict[str, Any]]:
        """The attempt's pods: from its watch (`pods`), or listed whole, a page at a time (pod_reads "list")."""
        if self.pod_reads == "watch":
            return self.pod_watches.pods(ns, selector)
        out: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = self.api.read(
                "list pods", self.api.core.list_namespaced_pod, ns, label_selector=selector, limit=PAGE, _continue=token
            )
            out += page.get("items", [])
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                return out

    def close(self) -> None:
        """Stop the pod watches (a process that keeps the backend needs not call it)."""
        self.pod_watches.close()

    def _nodes(self, view: AttemptView, spec: JobSpec) -> dict[str, NodeState]:
        """The states of the nodes of the spec's labels: their health once a pod is bound, their allocatable once a
        pod has been Unschedulable for a while (none before either)."""
        if not view.needs_nodes():
            return {}
        return self.node_health.states(placement.node_selector(spec), suspects=view.suspect_nodes())

    def _workload(self, job: dict[str, Any], spec: JobSpec) -> tuple[dict[str, Any] | None, bool]:
        """A suspended queued Job's Kueue Workload, and whether Kueue is missing from the cluster."""
        if not spec.queue or not kueue.suspended(job):
            return None, False
        return self.workloads.of_job(job, spec.namespace)

    @staticmethod
    def _unknown(exc: BaseException) -> AttemptReading:
        log.warning("kubernetes status unavailable: %s", exc)
        text = f"status unknown: the Kubernetes API could not be read ({api_message(exc)}); retrying"
        return AttemptReading(phase=AttemptPhase.pending, cause=Cause(CauseClass.unknown, text))

    def stop(self, job_id: str, attempt: int, spec: JobSpec) -> bool:
        """`cancel`, which waits for nothing: the kubelet gives the pods their grace and then kills them, and the
        scheduler counts a terminating pod's resources until it is gone, so a next attempt never shares them."""
        self.cancel(job_id, attempt, spec)
        return True

    def cancel(self, job_id: str, attempt: int, spec: JobSpec) -> None:
        """Delete the attempt: the Job (its pods, and the Service and Secret it owns, follow) and the Service."""
        name = m.attempt_name(job_id, spec.name, attempt)
        ns = spec.namespace
        api = self.api
        api.delete("job", api.batch.delete_namespaced_job, name, ns, propagation_policy="Background")
        api.delete("service", api.core.delete_namespaced_service, name, ns)
        self.pod_watches.forget(ns, m.attempt_selector(job_id, attempt))
        log.info("cancelled %s/%s (job %s attempt %d)", ns, name, job_id, attempt)

    def delete_job_resources(self, job_id: str, spec: JobSpec) -> None:
        """Final cleanup of a finished job: every attempt's Job and Service (the token Secrets go with the Jobs)."""
        ns = spec.namespace
        selector = m.job_selector(job_id)
        api = self.api
        with failure_of("list job resources"):
            jobs = api.read("list jobs", api.batch.list_namespaced_job, ns, label_selector=selector)
            core = api.core
            services = api.read("list services", core.list_namespaced_service, ns, label_selector=selector)
        for item in jobs.get("items", []):
            api.delete(
                "job",
                api.batch.delete_namespaced_job,
                item["metadata"]["name"],
                ns,
                propagation_policy="Background",
            )
        for item in services.get("items", []):
            api.delete("service", api.core.delete_namespaced_service, item["metadata"]["name"], ns)
