"""The fake API refuses what a Kubernetes 1.33 API server refuses, with the same Status: a schema error is a 400 or
422 answered (it used to drop the connection, which the backend retried as transient), on create, PUT and PATCH;
so is an invalid name or label, and a change to an immutable field."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from tests.workers.backends.kubernetes.k8s_support import A0, JOB_ID, NS, make_request
from workers.backends.kubernetes import KubernetesBackendError
from workers.backends.kubernetes import manifests as m


def batch(fake: Any) -> Any:
    return k8s_client.BatchV1Api(fake.api_client())


def core(fake: Any) -> Any:
    return k8s_client.CoreV1Api(fake.api_client())


def refused(call: Any, *args: Any, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(ApiException) as caught:
        call(*args, **kwargs)
    return caught.value.status, json.loads(caught.value.body)


JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"


def raw(fake: Any, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    """A request as any client sends it (the `kubernetes` client checks some of this itself before sending)."""
    request = urllib.request.Request(
        fake.url + path, data=json.dumps(body).encode(), method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def job(**changes: Any) -> dict[str, Any]:
    manifest = m.job_manifest(make_request())
    manifest.update(changes)
    return manifest


def test_an_unknown_field_is_a_400_strict_decoding_error(fake):
    bad = job()
    bad["spec"]["template"]["spec"]["containers"][0]["resourcez"] = {}
    code, status = raw(fake, "POST", JOBS, bad)
    assert code == 400 and status["kind"] == "Status" and status["reason"] == "BadRequest"
    assert 'strict decoding error: unknown field "spec.template.spec.containers[0].resourcez"' in status["message"]


def test_a_value_of_the_wrong_type_is_a_400(fake):
    bad = job()
    bad["spec"]["completions"] = "two"
    code, status = raw(fake, "POST", JOBS, bad)
    assert code == 400 and "cannot be handled as a Job" in status["message"]


def test_a_missing_required_field_is_a_422_naming_it(fake):
    bad = job()
    del bad["spec"]["template"]["spec"]["containers"][0]["name"]
    code, status = raw(fake, "POST", JOBS, bad)
    assert code == 422 and status["reason"] == "Invalid"
    (cause,) = status["details"]["causes"]
    assert cause["field"] == "spec.template.spec.containers[0]" and "'name' is a required property" in cause["message"]
    # and on PUT and PATCH too
    backend_job = job()
    assert raw(fake, "POST", JOBS, backend_job)[0] == 201
    code, _ = raw(fake, "PUT", f"{JOBS}/{backend_job['metadata']['name']}", bad | {"metadata": backend_job["metadata"]})
    assert code == 422
    code, status = raw(fake, "PATCH", f"{JOBS}/{backend_job['metadata']['name']}", {"spec": {"parallelism": "x"}})
    assert code == 400 and "cannot be handled as a Job" in status["message"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Not_A_Name"}, "metadata.name"),
        ({"name": "x" * 254}, "metadata.name"),
        ({"labels": {"team": "not ok!"}}, "metadata.labels"),
        ({"labels": {"bad key!": "x"}}, "metadata.labels"),
        ({"annotations": {"-bad/": "x"}}, "metadata.annotations"),
    ],
)
def test_names_labels_and_annotation_keys_are_checked(fake, change, field):
    bad = job()
    bad["metadata"].update(change)
    code, status = refused(batch(fake).create_namespaced_job, NS, bad)
    assert code == 422 and field in [c["field"] for c in status["details"]["causes"]]


def test_a_service_name_must_be_a_dns_label(fake):
    service = m.service_manifest(make_request())
    service["metadata"]["name"] = "has.dots"
    code, status = refused(core(fake).create_namespaced_service, NS, service)
    assert code == 422 and status["details"]["causes"][0]["field"] == "metadata.name"


def test_immutable_fields_are_refused_on_put_and_patch(fake, backend):
    backend.launch(make_request())
    api = batch(fake)
    stored = api.read_namespaced_job(A0, NS).to_dict()
    code, status = refused(api.patch_namespaced_job, A0, NS, {"spec": {"completions": 5}})
    assert code == 422 and status["details"]["causes"] == [
        {"reason": "FieldValueInvalid", "message": "Invalid value: field is immutable", "field": "spec.completions"}
    ]
    current = fake.get("jobs", NS, A0)
    current["spec"]["template"]["spec"]["containers"][0]["image"] = "other:1"
    code, status = refused(api.replace_namespaced_job, A0, NS, current)
    assert code == 422 and status["details"]["causes"][0]["field"] == "spec.template"
    # what may change does: suspension, and the Job is unchanged by the refusals
    api.patch_namespaced_job(A0, NS, {"spec": {"suspend": True}})
    assert fake.get("jobs", NS, A0)["spec"]["completions"] == stored["spec"]["completions"]
    service = fake.get("services", NS, A0)
    service["spec"]["clusterIP"] = "10.0.0.9"
    code, _ = refused(core(fake).replace_namespaced_service, A0, NS, service)
    assert code == 422


def test_a_stale_resource_version_is_a_conflict(fake, backend):
    backend.launch(make_request())
    old = fake.get("jobs", NS, A0)
    batch(fake).patch_namespaced_job(A0, NS, {"metadata": {"annotations": {"a": "b"}}})
    old["metadata"]["labels"]["x"] = "y"
    code, status = refused(batch(fake).replace_namespaced_job, A0, NS, old)
    assert code == 409 and status["reason"] == "Conflict"


def test_the_backend_does_not_retry_a_refusal_and_says_why(fake, backend, monkeypatch):
    real = m.job_manifest

    def broken(request, **kw):
        manifest = real(request, **kw)
        manifest["metadata"]["labels"]["ftplane.io/owner"] = "someone with spaces"
        return manifest

    monkeypatch.setattr(m, "job_manifest", broken)
    with pytest.raises(KubernetesBackendError) as caught:
        backend.launch(make_request())
    assert caught.value.status == 422 and not caught.value.retryable
    assert "Kubernetes rejected the object" in str(caught.value)
    posts = [r for r in fake.requests if r.method == "POST" and r.path.endswith("/jobs")]
    assert [r.status for r in posts] == [422]  # answered, not a dropped connection retried as transient
    assert fake.get("jobs", NS, m.attempt_name(JOB_ID, "llama-8b-fsdp", 0)) is None
