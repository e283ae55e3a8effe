"""The API client: transient errors retried within bounds, typed errors with advice, status that never
raises, and where the configuration comes from (kubeconfig context, in-cluster service account)."""

from __future__ import annotations

import pytest
import yaml

from api.core.config import Settings
from api.schemas.causes import CauseClass
from tests.workers.backends.kubernetes.k8s_support import (
    A0,
    JOB_ID,
    NS,
    SPEC,
    backend_for,
    make_request,
    objects_of,
)
from workers.backends.base import AttemptPhase
from workers.backends.kubernetes import KubernetesBackend, KubernetesBackendError, RetryPolicy


def test_transient_errors_are_retried(fake, backend):
    fake.fail("POST", r"/secrets$", 503)
    fake.fail("POST", r"/jobs$", 500, times=2)
    fake.fail("GET", r"/jobs/", 429, retry_after=0)
    fake.fail("POST", r"/services$", 502)
    backend.launch(make_request())
    assert fake.get("services", NS, A0) is not None
    fake.fail("GET", r"/pods$", 500, times=3)
    fake.schedule(A0, NS)
    fake.run(A0, NS)
    assert backend.status(JOB_ID, 0, SPEC).phase == AttemptPhase.running
    fake.fail("DELETE", r"/jobs/", 429, retry_after=0)
    backend.cancel(JOB_ID, 0, SPEC)
    assert objects_of(fake, A0) == []
    assert all(rule.hits == rule.times for rule in fake.rules)


def test_timeouts_are_retried_and_a_create_that_landed_is_not_an_error(fake, request):
    backend = backend_for(fake, request_timeout=(2.0, 0.5), retry=RetryPolicy(attempts=3, base_wait_s=0.01))
    request.addfinalizer(backend.close)
    # the first POST of the Job is processed but answered too late: the retry meets 409 = already there
    fake.delay("POST", r"/jobs$", 0.8, after=True)
    fake.delay("GET", r"/pods$", 0.8)
    backend.launch(make_request())
    assert [r.status for r in fake.requests if r.method == "POST" and r.path.endswith("/jobs")] == [201, 409]
    assert len(fake.pods(A0, NS)) == 2
    assert backend.status(JOB_ID, 0, SPEC).phase == AttemptPhase.pending


def test_status_never_raises(fake, backend):
    fake.fail("GET", r"/jobs/", 500, times=100)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.pending
    assert status.cause.message.startswith("status unknown: the Kubernetes API could not be read (HTTP 500")
    assert status.cause.cause_class == CauseClass.unknown
    fake.stop()
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.pending and status.cause.message.startswith("status unknown")


def test_persistent_errors_end_in_a_typed_error_with_advice(fake, backend):
    fake.fail("POST", r"/secrets$", 403, times=100)
    with pytest.raises(KubernetesBackendError) as refused:
        backend.launch(make_request())
    assert refused.value.status == 403 and not refused.value.retryable
    assert "RBAC" in str(refused.value)

    fake.rules.clear()
    fake.fail("POST", r"/jobs$", 500, times=100)
    with pytest.raises(KubernetesBackendError) as down:
        backend.launch(make_request())
    assert down.value.retryable and "can be retried" in str(down.value)
    assert len([r for r in fake.requests if r.path.endswith("/jobs") and r.status == 500]) == 4  # RetryPolicy.attempts


# ---------------------------------------------------------------- configuration


def test_kubeconfig_context_is_used(fake, tmp_path, monkeypatch):
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": fake.url}}],
        "users": [{"name": "me", "user": {"token": "kubeconfig-token"}}],
        "contexts": [
            {"name": "other", "context": {"cluster": "fake", "user": "me", "namespace": "x"}},
            {"name": "fake-ctx", "context": {"cluster": "fake", "user": "me"}},
        ],
        "current-context": "other",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    backend = KubernetesBackend(settings=Settings(kube_context="fake-ctx"))
    assert backend.status(JOB_ID, 0, SPEC).phase == AttemptPhase.missing
    assert backend.api_client.configuration.host == fake.url
    assert backend.api_client.configuration.retries is False


def test_in_cluster_service_account(tmp_path, monkeypatch):
    from kubernetes.config import incluster_config

    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("sa-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    backend = KubernetesBackend(settings=Settings())  # auto: in a pod
    configuration = backend.api_client.configuration
    assert configuration.host == "https://127.0.0.1:6443"
    assert any(str(v).endswith("sa-token") for v in configuration.api_key.values())


def test_no_configuration_is_reported_not_raised_by_status(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    backend = KubernetesBackend(settings=Settings(kube_in_cluster=False), retry=RetryPolicy(attempts=1))
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.pending
    assert "FTPLANE_KUBE_CONTEXT" in status.cause.message
    with pytest.raises(KubernetesBackendError, match="cannot load the Kubernetes configuration"):
        backend.launch(make_request())
    # rendering needs no cluster at all
    assert "kind: Job" in backend.render(make_request())
