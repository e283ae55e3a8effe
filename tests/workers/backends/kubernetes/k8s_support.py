"""Shared helpers of the Kubernetes tests: specs, launch requests, strict schema validation, and driving an
attempt on the fake API server."""

from __future__ import annotations

import time
from typing import Any

from kubernetes_validate.utils import validate

from api.schemas.spec import JobSpec
from tests.fake_kubernetes import FakeKube, Request
from workers.backends.base import LaunchRequest
from workers.backends.kubernetes import KubernetesBackend, RetryPolicy
from workers.backends.kubernetes import manifests as m

K8S_VERSION = "1.33"  # the EKS version of deploy/eks/cluster.yaml
TOKEN = "ftp_trainer_s3cr3t-token-value"
JOB_ID = "3f2a9c1e5b7d4a2f8c3e5d7b9a1c2e4f"
NS = "training"


def validate_strict(obj: dict[str, Any]) -> None:
    """Schema of Kubernetes 1.33 (what deploy/eks runs); unknown fields fail."""
    validate(obj, K8S_VERSION, strict=True)


def make_spec(**overrides: Any) -> JobSpec:
    base: dict[str, Any] = {
        "name": "llama-8b-fsdp",
        "backend": "kubernetes",
        "image": "123456789012.dkr.ecr.us-west-2.amazonaws.com/ftplane-trainer:0.1.0",
        "namespace": NS,
        "command": ["python", "-m", "ftplane.trainer", "--model", "tiny"],
        "nodes": 2,
        "procs_per_node": 8,
        "resources": {"gpus_per_node": 8, "efa_per_node": 32, "cpu": "96", "memory": "1Ti", "shm": "256Gi"},
        "checkpoint": {"dir": "/checkpoints/llama-8b", "pvc": "fsx-checkpoints", "engine": "async"},
        "resiliency": {"max_job_restarts": 2, "exclude_failed_nodes": True},
        "labels": {"team": "pretraining"},
    }
    base.update(overrides)
    scheduling = dict(base.get("scheduling") or {})
    pinned = scheduling.get("zone") or (scheduling.get("node_selector") or {}).get("topology.kubernetes.io/zone")
    pinned = pinned or any(r.get("key") == "topology.kubernetes.io/zone" for r in scheduling.get("affinity") or [])
    if not pinned and (base.get("resources") or {}).get("efa_per_node"):
        base["scheduling"] = {**scheduling, "zone": "us-west-2c"}  # an EFA job names its zone
    return JobSpec.model_validate(base)


def make_request(
    spec: JobSpec | None = None, *, attempt: int = 0, excluded: tuple[str, ...] = (), job_id: str = JOB_ID
) -> LaunchRequest:
    return LaunchRequest(
        job_id=job_id,
        attempt=attempt,
        spec=spec or make_spec(),
        token=TOKEN,
        control_plane_url="http://ftplane-api.ftplane.svc.cluster.local:8000",
        excluded_nodes=excluded,
    )


SPEC = make_spec()
A0 = m.attempt_name(JOB_ID, SPEC.name, 0)
A1 = m.attempt_name(JOB_ID, SPEC.name, 1)
SECRET = m.secret_name(JOB_ID, SPEC.name, 0)


def objects_of(fake: FakeKube, attempt_name: str) -> list[tuple[str, str]]:
    return sorted(
        (plural, name)
        for (plural, _, name) in fake.objects
        if plural != "events" and (name == attempt_name or name.startswith(attempt_name + "-"))
    )


def option(request: Request, key: str) -> str | None:
    """A delete option, sent in the query or in the DeleteOptions body depending on the client version."""
    if request.query.get(key):
        return request.query[key][0]
    value = (request.body or {}).get(key)
    return None if value is None else str(value)


def running_attempt(fake: FakeKube, backend: KubernetesBackend, attempt: int = 0, **kw: object) -> str:
    request = make_request(attempt=attempt, **kw)  # type: ignore[arg-type]
    backend.launch(request)
    name = m.attempt_name(JOB_ID, SPEC.name, attempt)
    fake.schedule(name, NS)
    fake.run(name, NS)
    backend.status(JOB_ID, attempt, request.spec)  # the backend has read it running (its pods are watched)
    return name


def spec_body(**overrides: Any) -> dict[str, Any]:
    """A kubernetes spec as a user submits it (make_spec's fields), for the jobs API."""
    return make_spec(**overrides).model_dump(mode="json", exclude_defaults=True)


def submit(admin: Any, **overrides: Any) -> tuple[str, JobSpec]:
    """Submit a kubernetes job through the API and launch its attempt 0 at once; (job id, its spec)."""
    from tests.support.supervision import supervise

    response = admin.post("/v1/jobs", json=spec_body(**overrides))
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    supervise(job_id, force_launch=True)
    return job_id, make_spec(**overrides)


def job_detail(admin: Any, job_id: str) -> dict[str, Any]:
    return dict(admin.get(f"/v1/jobs/{job_id}").json())


def events_of(admin: Any, job_id: str, type_: str) -> list[dict[str, Any]]:
    return list(admin.get(f"/v1/jobs/{job_id}/events", params={"type": type_, "limit": 1000}).json()["items"])


def start_job(admin: Any, fake: FakeKube, **overrides: Any) -> tuple[str, JobSpec, str]:
    """Submit a kubernetes job, launch it, place and start its pods, and let supervision see it run:
    (job id, its spec, its attempt 0's name)."""
    from tests.support.supervision import supervise

    job_id, spec = submit(admin, **overrides)
    name = m.attempt_name(job_id, spec.name, 0)
    fake.schedule(name, NS)
    fake.run(name, NS)
    supervise()
    return job_id, spec, name


class SettledBackend(KubernetesBackend):
    """Each status read first waits, briefly, until the attempt's pod watch has applied every change the fake made
    so far: a test reads what it just did (an informer in a worker sees it a moment later)."""

    fake: FakeKube

    def status(self, job_id: str, attempt: int, spec: Any) -> Any:
        watch = self.pod_watches.get(spec.namespace, m.attempt_selector(job_id, attempt))
        if watch is not None and watch.resource_version is not None:
            target = self.fake.current_rv()
            deadline = time.monotonic() + 5.0
            while watch.applied < target and time.monotonic() < deadline:
                time.sleep(0.002)
        return super().status(job_id, attempt, spec)


def backend_for(fake: FakeKube, **options: Any) -> KubernetesBackend:
    options.setdefault("request_timeout", (2.0, 1.0))
    options.setdefault("retry", RetryPolicy(attempts=4, base_wait_s=0.01, max_wait_s=0.05, deadline_s=10))
    options.setdefault("clock", lambda: time.time() + fake.offset)  # the fake's clock: tests move it past tolerations
    backend = SettledBackend(fake.api_client(), **options)
    backend.fake = fake
    return backend
