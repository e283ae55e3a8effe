"""Launching and tearing down attempts: the real `kubernetes` client against the fake API server."""

from __future__ import annotations

import base64
import json

import yaml

from tests.workers.backends.kubernetes.k8s_support import (
    A0,
    A1,
    JOB_ID,
    NS,
    SECRET,
    SPEC,
    TOKEN,
    make_request,
    objects_of,
    option,
    running_attempt,
)
from workers.backends.base import AttemptPhase
from workers.backends.kubernetes import manifests as m


def test_launch_creates_what_render_shows_and_passes_the_token_by_reference(fake, backend):
    request = make_request()
    rendered = list(yaml.safe_load_all(backend.render(request)))
    backend.launch(request)

    job = fake.get("jobs", NS, A0)
    service = fake.get("services", NS, A0)
    secret = fake.get("secrets", NS, SECRET)
    assert job and service and secret
    # created suspended, resumed once its Secret and Service existed
    assert job["spec"].pop("suspend") is False
    assert job["spec"] == rendered[0]["spec"]
    resumed = [r for r in fake.requests if r.method == "PATCH"]
    assert [r.body for r in resumed] == [{"spec": {"suspend": False}}]
    assert job["metadata"]["labels"] == rendered[0]["metadata"]["labels"]
    assert service["spec"] == rendered[1]["spec"]
    # one delete removes the attempt: the Service and the token Secret are owned by the Job, the pods by the
    # Job controller
    owner = [{"apiVersion": "batch/v1", "kind": "Job", "name": A0, "uid": job["metadata"]["uid"]}]
    assert service["metadata"]["ownerReferences"] == owner == secret["metadata"]["ownerReferences"]
    # the token is only in the Secret; everything else refers to it
    assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN
    pods = fake.pods(A0, NS)
    assert [p["metadata"]["labels"][m.COMPLETION_INDEX_LABEL] for p in pods] == ["0", "1"]
    for obj in [job, service, *pods]:
        assert TOKEN not in json.dumps(obj)
    env = {e["name"]: e for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env["FTPLANE_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": SECRET, "key": "token"}}
    assert env["FTPLANE_MASTER_ADDR"]["value"] == f"{A0}-0.{A0}.{NS}.svc.cluster.local"
    assert pods[1]["spec"]["hostname"] == f"{A0}-1" and pods[1]["spec"]["subdomain"] == A0
    # every object the backend created passed the fake's validation, asked for strictly
    created = [r for r in fake.requests if r.method == "POST"]
    assert {r.path.rsplit("/", 1)[-1] for r in created} == {"secrets", "jobs", "services"}
    assert {r.status for r in created} == {201}
    assert all(r.query.get("fieldValidation") == ["Strict"] for r in created)


def test_launch_is_idempotent_and_keeps_the_first_token(fake, backend):
    backend.launch(make_request())
    again = make_request().__class__(**{**make_request().__dict__, "token": "ftp_trainer_second"})
    backend.launch(again)  # 409s on Job, Secret and Service are "already there"
    # the pods hold the first launch's token (still valid): the worker never reads or replaces a Secret
    secret = fake.get("secrets", NS, SECRET)
    assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN
    assert len([k for k in fake.objects if k[0] == "jobs"]) == 1
    assert len(fake.pods(A0, NS)) == 2
    assert [r.status for r in fake.requests if r.method == "POST"][-3:] == [409, 409, 409]
    assert {r.method for r in fake.requests if "/secrets" in r.path} == {"POST"}


# ---------------------------------------------------------------- cancel / cleanup


def test_cancel_removes_every_object_of_the_attempt(fake, backend):
    running_attempt(fake, backend)
    assert len(objects_of(fake, A0)) == 5  # Job, Service, token Secret, 2 pods
    backend.cancel(JOB_ID, 0, SPEC)
    assert objects_of(fake, A0) == []  # the token Secret went with its Job
    deletes = [r for r in fake.requests if r.method == "DELETE"]
    assert option(deletes[0], "propagationPolicy") == "Background"
    backend.cancel(JOB_ID, 0, SPEC)  # idempotent: 404s are fine
    assert backend.status(JOB_ID, 0, SPEC).phase == AttemptPhase.missing


def test_delete_job_resources_removes_all_attempts_and_the_secret(fake, backend):
    running_attempt(fake, backend)
    running_attempt(fake, backend, attempt=1)
    other = make_request(job_id="another-job")
    backend.launch(other)
    backend.delete_job_resources(JOB_ID, SPEC)
    assert objects_of(fake, A0) == objects_of(fake, A1) == []
    assert [k for k in fake.objects if k[0] == "secrets" and k[2].startswith(A0[:-3])] == []
    assert {r.method for r in fake.requests if "/secrets" in r.path} == {"POST"}  # gone with their Jobs
    assert fake.get("jobs", NS, m.attempt_name("another-job", SPEC.name, 0)) is not None
    backend.delete_job_resources(JOB_ID, SPEC)  # idempotent
