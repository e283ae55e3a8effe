"""The Kubernetes backend driven through the real `kubernetes` client against a fake API server."""

from __future__ import annotations

import base64
import json
import time

import pytest
import yaml

from api.core.config import Settings
from api.schemas.causes import Cause, CauseClass
from tests.fake_kubernetes import FakeKube, Request
from tests.kubernetes.k8s_support import JOB_ID, NS, TOKEN, make_request, make_spec
from workers.backends.base import AttemptPhase, FaultNotSupported, FaultRequest
from workers.backends.kubernetes import KubernetesBackend, KubernetesBackendError, RetryPolicy
from workers.backends.kubernetes import manifests as m

SPEC = make_spec()
A0 = m.attempt_name(JOB_ID, SPEC.name, 0)
A1 = m.attempt_name(JOB_ID, SPEC.name, 1)
SECRET = m.secret_name(JOB_ID, SPEC.name)


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
    return name


# ---------------------------------------------------------------- submit


def test_launch_creates_what_render_shows_and_passes_the_token_by_reference(fake, backend):
    request = make_request()
    rendered = list(yaml.safe_load_all(backend.render(request)))
    backend.launch(request)

    job = fake.get("jobs", NS, A0)
    service = fake.get("services", NS, A0)
    secret = fake.get("secrets", NS, SECRET)
    assert job and service and secret
    assert job["spec"] == rendered[0]["spec"]
    assert job["metadata"]["labels"] == rendered[0]["metadata"]["labels"]
    assert service["spec"] == rendered[1]["spec"]
    # one delete removes the attempt: the Service is owned by the Job, the pods by the Job controller
    assert service["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": A0, "uid": job["metadata"]["uid"]}
    ]
    # the token is only in the Secret; everything else refers to it
    assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN
    assert "ownerReferences" not in secret["metadata"]
    pods = fake.pods(A0, NS)
    assert [p["metadata"]["labels"][m.COMPLETION_INDEX_LABEL] for p in pods] == ["0", "1"]
    for obj in [job, service, *pods]:
        assert TOKEN not in json.dumps(obj)
    env = {e["name"]: e for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env["FTPLANE_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": SECRET, "key": "token"}}
    assert env["FTPLANE_MASTER_ADDR"]["value"] == f"{A0}-0.{A0}.{NS}.svc.cluster.local"
    assert pods[1]["spec"]["hostname"] == f"{A0}-1" and pods[1]["spec"]["subdomain"] == A0
    # every object the backend created passed strict schema validation in the fake (FakeKube.validate)
    created = [r for r in fake.requests if r.method == "POST"]
    assert {r.path.rsplit("/", 1)[-1] for r in created} == {"secrets", "jobs", "services"}


def test_launch_is_idempotent_and_replaces_the_token(fake, backend):
    backend.launch(make_request())
    rotated = make_request().__class__(**{**make_request().__dict__, "token": "ftp_trainer_rotated"})
    backend.launch(rotated)  # 409s on Job and Service are "already there"
    secret = fake.get("secrets", NS, SECRET)
    assert base64.b64decode(secret["data"]["token"]).decode() == "ftp_trainer_rotated"
    assert len([k for k in fake.objects if k[0] == "jobs"]) == 1
    assert len(fake.pods(A0, NS)) == 2
    assert [r.status for r in fake.requests if r.method == "POST"][-2:] == [409, 409]


# ---------------------------------------------------------------- lifecycle


def test_pending_scheduled_running_succeeded(fake, backend):
    backend.launch(make_request())
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.pending
    assert status.cause is not None and "waiting for the scheduler (0/2" in status.cause.message
    assert status.cause.cause_class == CauseClass.scheduling

    nodes = fake.schedule(A0, NS)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.pending
    assert [e.type for e in status.events] == ["scheduled"]
    assert status.events[0].details["nodes"] == sorted(nodes)

    fake.run(A0, NS)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.running and status.cause is None
    assert [e.type for e in status.events] == ["scheduled", "running"]
    uid = fake.get("jobs", NS, A0)["metadata"]["uid"]
    assert [e.key for e in status.events] == [f"k8s:{uid}:scheduled", f"k8s:{uid}:running"]
    # a steady running attempt costs two reads, no Event listing
    before = len(fake.requests)
    again = backend.status(JOB_ID, 0, SPEC)
    assert [e.key for e in again.events] == [e.key for e in status.events]  # idempotent keys
    assert [r.path.rsplit("/", 1)[-1] for r in fake.requests[before:]] == [A0, "pods"]

    fake.succeed(A0, NS)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.succeeded
    assert status.failed_nodes == ()


def test_in_pod_failure_reports_exit_code_and_node(fake, backend):
    running_attempt(fake, backend)
    node = fake.pod(A0, NS, 1)["spec"]["nodeName"]
    fake.exit(A0, NS, 1, 1)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert status.cause.message == f"exit code 1 on node {node}"
    assert status.cause.cause_class == CauseClass.crash
    assert status.cause.facts == {"node": node, "reason": "Error", "exit_code": 1}
    assert status.failed_nodes == ()  # a crashing program is not the node's fault
    (event,) = [e for e in status.events if e.type == "rank_failed"]
    assert event.node == node and event.details["exit_code"] == 1 and event.details["node_rank"] == 1
    # the event carries the structured cause (as `Cause.details()` writes it) and what it always did
    assert event.details["cause"] == status.cause.message and event.details["cause_class"] == "crash"
    assert event.details["reason"] == "Error" and event.details["node"] == node
    assert event.details["pod"] == fake.pod(A0, NS, 1)["metadata"]["name"]
    assert Cause.of(event.details) == status.cause
    assert event.key.startswith("k8s:") and event.key.endswith(":Error")
    # the Job controller stopped the other pod; that is collateral, not a second cause
    assert [p["metadata"]["labels"][m.COMPLETION_INDEX_LABEL] for p in fake.pods(A0, NS)] == ["1"]
    assert backend.status(JOB_ID, 0, SPEC).cause == status.cause


def test_oom_killed(fake, backend):
    running_attempt(fake, backend)
    node = fake.pod(A0, NS, 0)["spec"]["nodeName"]
    fake.oom(A0, NS, 0)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert status.cause.message == f"exit code 137 (OOMKilled) on node {node}"
    assert status.cause.cause_class == CauseClass.crash
    assert status.cause.facts["exit_code"] == 137 and status.cause.facts["signal"] == "SIGKILL"
    assert status.cause.facts["reason"] == "OOMKilled"
    assert status.failed_nodes == ()


def test_eviction_blames_the_node(fake, backend):
    running_attempt(fake, backend)
    node = fake.pod(A0, NS, 1)["spec"]["nodeName"]
    fake.evict(A0, NS, 1)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert status.cause.message.startswith(f"pod evicted on node {node}: The node was low on resource: memory")
    assert status.cause.cause_class == CauseClass.preempted
    assert status.failed_nodes == (node,)
    assert [e.type for e in status.events if e.type.endswith("_failed")] == ["node_failed"]


def test_node_loss_then_job_restart_excludes_the_node(fake, backend):
    running_attempt(fake, backend)
    lost = fake.pod(A0, NS, 1)["spec"]["nodeName"]
    fake.lose_node(lost)

    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert status.failed_nodes == (lost,)
    assert f"node {lost} lost (NodeNotReady)" in status.cause.message
    assert status.cause.cause_class == CauseClass.node and status.cause.facts["node"] == lost
    (event,) = [e for e in status.events if e.type == "node_failed"]
    assert event.node == lost and event.details["node_rank"] == 1
    assert event.details["cause_class"] == "node" and event.details["reason"] == "NodeLost"

    # what the supervisor does for a job-level restart: cancel, then launch attempt + 1 without the node
    backend.cancel(JOB_ID, 0, SPEC)
    backend.launch(make_request(attempt=1, excluded=status.failed_nodes))
    job = fake.get("jobs", NS, A1)
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    not_in = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [lost]}
    assert terms == [{"matchExpressions": [not_in]}]
    fake.not_ready.discard(lost)  # even back, the node is not used again
    placed = fake.schedule(A1, NS)
    assert lost not in placed and len(placed) == 2
    fake.run(A1, NS)
    assert backend.status(JOB_ID, 1, SPEC).phase == AttemptPhase.running
    assert objects_of(fake, A0) == []
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["FTPLANE_ATTEMPT"] == "1"


def test_spent_budget_attempt_reports_failure_and_nothing_is_relaunched(fake, backend):
    spec = make_spec(resiliency={"max_job_restarts": 1})
    backend.launch(make_request(spec))
    fake.schedule(A0, NS)
    fake.run(A0, NS)
    fake.exit(A0, NS, 0, 1)
    assert backend.status(JOB_ID, 0, spec).phase == AttemptPhase.failed
    backend.cancel(JOB_ID, 0, spec)
    backend.launch(make_request(spec, attempt=1))
    fake.schedule(A1, NS)
    fake.run(A1, NS)
    node = fake.pod(A1, NS, 1)["spec"]["nodeName"]
    fake.exit(A1, NS, 1, 3)
    final = backend.status(JOB_ID, 1, spec)
    # the budget decision is the supervisor's; the backend says what happened, and launches nothing itself
    assert final.phase == AttemptPhase.failed
    assert final.cause.message == f"exit code 3 on node {node}"
    assert final.cause.cause_class == CauseClass.crash
    assert not any(name.endswith("-a2") for (_, _, name) in fake.objects)
    assert final.phase == backend.status(JOB_ID, 1, spec).phase


def test_pod_deleted_by_someone_fails_the_attempt_without_blaming_the_node(fake, backend):
    running_attempt(fake, backend)
    pod = fake.pod(A0, NS, 0)
    fake.delete("pods", NS, pod["metadata"]["name"])
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert status.failed_nodes == ()
    assert (
        status.cause.message
        == f"pod {pod['metadata']['name']} on node {pod['spec']['nodeName']} was deleted before it finished"
    )
    assert status.cause.cause_class == CauseClass.other and status.cause.facts["reason"] == "Deleted"


def test_image_pull_errors_pending_then_failed(fake):
    clock = [time.time()]
    backend = KubernetesBackend(fake.api_client(), image_pull_grace_s=300, clock=lambda: clock[0])
    backend.launch(make_request())
    fake.schedule(A0, NS)
    fake.image_pull_error(A0, NS)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.pending
    assert status.cause.message.startswith(f"image {SPEC.image} cannot be pulled (ImagePullBackOff)")
    assert status.cause.cause_class == CauseClass.scheduling
    clock[0] += 301
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert "still failing after 30" in status.cause.message
    assert status.cause.cause_class == CauseClass.scheduling and status.cause.facts["reason"] == "ImagePullBackOff"


def test_invalid_image_fails_at_once(fake, backend):
    backend.launch(make_request())
    fake.schedule(A0, NS)
    fake.image_pull_error(A0, NS, reason="InvalidImageName")
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert "(InvalidImageName)" in status.cause.message
    assert status.cause.cause_class == CauseClass.scheduling


def test_unschedulable_is_pending_with_the_schedulers_words(fake, backend):
    fake.nodes = fake.nodes[:1]
    backend.launch(make_request())
    fake.schedule(A0, NS)
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.pending
    assert status.cause.message.startswith("waiting for nodes (0/2 pods running): 0/1 nodes are available")
    assert status.cause.cause_class == CauseClass.scheduling and status.cause.facts["reason"] == "Unschedulable"


def test_missing_attempt(backend):
    status = backend.status(JOB_ID, 7, SPEC)
    assert status.phase == AttemptPhase.missing
    assert "no Job" in status.cause.message


# ---------------------------------------------------------------- cancel / cleanup


def test_cancel_removes_every_object_of_the_attempt(fake, backend):
    running_attempt(fake, backend)
    assert len(objects_of(fake, A0)) == 4  # Job, Service, 2 pods
    backend.cancel(JOB_ID, 0, SPEC)
    assert objects_of(fake, A0) == []
    deletes = [r for r in fake.requests if r.method == "DELETE"]
    assert option(deletes[0], "propagationPolicy") == "Background"
    assert fake.get("secrets", NS, SECRET) is not None  # the token outlives attempts
    backend.cancel(JOB_ID, 0, SPEC)  # idempotent: 404s are fine
    assert backend.status(JOB_ID, 0, SPEC).phase == AttemptPhase.missing


def test_delete_job_resources_removes_all_attempts_and_the_secret(fake, backend):
    running_attempt(fake, backend)
    running_attempt(fake, backend, attempt=1)
    other = make_request(job_id="another-job")
    backend.launch(other)
    backend.delete_job_resources(JOB_ID, SPEC)
    assert objects_of(fake, A0) == objects_of(fake, A1) == []
    assert fake.get("secrets", NS, SECRET) is None
    assert fake.get("jobs", NS, m.attempt_name("another-job", SPEC.name, 0)) is not None
    backend.delete_job_resources(JOB_ID, SPEC)  # idempotent


# ---------------------------------------------------------------- faults


def test_node_loss_fault_deletes_the_pod_of_the_ranks_node(fake, backend):
    running_attempt(fake, backend)
    victim = fake.pod(A0, NS, 1)
    backend.inject_fault(JOB_ID, 0, SPEC, FaultRequest(id="f1", kind="node_loss", rank=9))
    (delete,) = [r for r in fake.requests if r.method == "DELETE"]
    assert delete.path.endswith("/pods/" + victim["metadata"]["name"])
    assert option(delete, "gracePeriodSeconds") == "0"
    assert fake.get("pods", NS, victim["metadata"]["name"]) is None
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert status.failed_nodes == (victim["spec"]["nodeName"],)
    assert "injected node_loss" in status.cause.message
    assert status.cause.cause_class == CauseClass.node


@pytest.mark.parametrize(("kind", "signal"), [("crash", "KILL"), ("hang", "STOP")])
def test_crash_and_hang_signal_the_rank_through_exec(fake, backend, kind, signal):
    running_attempt(fake, backend)
    backend.inject_fault(JOB_ID, 0, SPEC, FaultRequest(id="f", kind=kind, rank=10))
    assert fake.signals == [(fake.pod(A0, NS, 1)["metadata"]["name"], 10, signal)]
    exec_calls = [r for r in fake.requests if r.path.endswith("/exec")]
    assert len(exec_calls) == 1
    assert exec_calls[0].query["command"][:2] == ["sh", "-c"]
    assert exec_calls[0].query["container"] == ["trainer"]


def test_exec_searches_the_other_pods_when_the_rank_is_elsewhere(fake, backend):
    request = make_request()
    backend.launch(request)
    fake.schedule(A0, NS)
    fake.run(A0, NS, rank_layout=lambda index, ppn: [(1 - index) * ppn + i for i in range(ppn)])  # swapped
    backend.inject_fault(JOB_ID, 0, SPEC, FaultRequest(id="f", kind="crash", rank=3))
    assert fake.signals == [(fake.pod(A0, NS, 1)["metadata"]["name"], 3, "KILL")]
    assert len([r for r in fake.requests if r.path.endswith("/exec")]) == 2


def test_exception_faults_belong_to_the_trainer(backend):
    with pytest.raises(FaultNotSupported):
        backend.inject_fault(JOB_ID, 0, SPEC, FaultRequest(id="f", kind="exception", rank=1))


def test_fault_into_an_attempt_without_pods_is_a_clear_error(fake, backend):
    with pytest.raises(KubernetesBackendError, match="no running pod"):
        backend.inject_fault(JOB_ID, 0, SPEC, FaultRequest(id="f", kind="hang", rank=1))
    with pytest.raises(KubernetesBackendError, match="no live pod for rank 1"):
        backend.inject_fault(JOB_ID, 0, SPEC, FaultRequest(id="f", kind="node_loss", rank=1))


# ---------------------------------------------------------------- API errors


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


def test_timeouts_are_retried_and_a_create_that_landed_is_not_an_error(fake):
    backend = KubernetesBackend(
        fake.api_client(), request_timeout=(2.0, 0.5), retry=RetryPolicy(attempts=3, base_wait_s=0.01)
    )
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
    assert len([r for r in fake.requests if r.path.endswith("/jobs")]) == 4  # bounded: RetryPolicy.attempts


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


def test_a_lost_node_is_the_cause_even_when_a_rank_elsewhere_failed_first(fake, backend):
    running_attempt(fake, backend)
    sick = fake.pod(A0, NS, 1)
    fake.event(sick, "NodeNotReady", "Node is not ready", "Warning")  # the node controller's notice
    fake.exit(A0, NS, 0, 1)  # rank 0's node sees its peers vanish and fails; the Job deletes pod 1
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert status.failed_nodes == (sick["spec"]["nodeName"],)
    assert status.cause.message.startswith(f"node {sick['spec']['nodeName']} lost (NodeNotReady)")
    assert status.cause.cause_class == CauseClass.node
    assert sorted(e.type for e in status.events if e.type.endswith("_failed")) == [
        "node_failed",
        "rank_failed",
    ]
