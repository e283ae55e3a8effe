"""The Kubernetes execution backend (EKS in production): the `Backend` protocol, through the official client.

One attempt of a job is an Indexed batch Job (one pod per node running
`ft_launcher`) plus a headless Service for the rendezvous, both labelled with
the job id and attempt; the Service is owned by the Job, so deleting the Job
removes the whole attempt. The trainer token lives in a per-job Secret that
outlives attempts and is removed by `delete_job_resources` at final cleanup.

`status()` turns what Kubernetes says (the Job, its pods, their Events) into an
`AttemptStatus` with a structured cause and idempotent `ObservedEvent`s
(`status.AttemptView`). It never raises: when the API cannot be read it says
"pending, status unknown". `launch`, `cancel` and `delete_job_resources` retry
transient API errors (429, 5xx, timeouts) with bounded backoff and treat 409 on
create and 404 on delete as done; if the API still fails they raise
`KubernetesBackendError` (the job itself is untouched, the call can be retried).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from api.core.config import Settings
from api.schemas.causes import Cause, CauseClass
from api.schemas.spec import JobSpec
from workers.backends.base import AttemptPhase, AttemptStatus, LaunchRequest
from workers.backends.kubernetes import manifests as m
from workers.backends.kubernetes.client import KubernetesApi, RetryPolicy, api_message, failure_of
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
    ) -> None:
        self.api = KubernetesApi(api_client, settings=settings, request_timeout=request_timeout, retry=retry)
        self.cluster_domain = cluster_domain
        self.image_pull_grace_s = image_pull_grace_s
        self.ttl_after_finished_s = ttl_after_finished_s
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
        """Create (or complete) the attempt: token Secret, Job, then the Service owned by the Job."""
        spec = request.spec
        ns = spec.namespace
        api = self.api
        secret = m.secret_manifest(request)
        if not api.create("secret", api.core.create_namespaced_secret, ns, secret):
            name = secret["metadata"]["name"]
            with failure_of("replace secret"):
                api.call("replace secret", api.core.replace_namespaced_secret, name, ns, secret)

        job = self._job_manifest(request)
        name = job["metadata"]["name"]
        api.create("job", api.batch.create_namespaced_job, ns, job)
        with failure_of("read job"):
            current = api.read("read job", api.batch.read_namespaced_job, name, ns)
        uid = current["metadata"]["uid"]
        api.create("service", api.core.create_namespaced_service, ns, m.service_manifest(request, uid))
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
        api = self.api
        try:
            job = api.read("read job", api.batch.read_namespaced_job, name, ns)
        except ApiException as exc:
            if exc.status == 404:
                missing = Cause(CauseClass.other, f"no Job {ns}/{name} in the cluster")
                return AttemptStatus(phase=AttemptPhase.missing, cause=missing)
            return self._unknown(exc)
        except Exception as exc:
            return self._unknown(exc)
        try:
            pods = api.read(
                "list pods",
                api.core.list_namespaced_pod,
                ns,
                label_selector=m.attempt_selector(job_id, attempt),
            ).get("items", [])
            grace = self.image_pull_grace_s
            view = AttemptView(job, pods, [], spec=spec, now=self._clock(), image_pull_grace_s=grace)
            if view.needs_events():
                events = api.read("list events", api.core.list_namespaced_event, ns).get("items", [])
                view = AttemptView(job, pods, events, spec=spec, now=self._clock(), image_pull_grace_s=grace)
        except Exception as exc:
            return self._unknown(exc)
        return view.status()

    @staticmethod
    def _unknown(exc: BaseException) -> AttemptStatus:
        log.warning("kubernetes status unavailable: %s", exc)
        text = f"status unknown: the Kubernetes API could not be read ({api_message(exc)}); retrying"
        return AttemptStatus(phase=AttemptPhase.pending, cause=Cause(CauseClass.unknown, text))

    def cancel(self, job_id: str, attempt: int, spec: JobSpec) -> None:
        """Delete the attempt: the Job (its pods and the owned Service follow) and the Service itself."""
        name = m.attempt_name(job_id, spec.name, attempt)
        ns = spec.namespace
        api = self.api
        api.delete("job", api.batch.delete_namespaced_job, name, ns, propagation_policy="Background")
        api.delete("service", api.core.delete_namespaced_service, name, ns)
        log.info("cancelled %s/%s (job %s attempt %d)", ns, name, job_id, attempt)

    def delete_job_resources(self, job_id: str, spec: JobSpec) -> None:
        """Final cleanup of a finished job: every attempt's Job and Service, and the token Secret."""
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
        api.delete("secret", api.core.delete_namespaced_secret, m.secret_name(job_id, spec.name), ns)
