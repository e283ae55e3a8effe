"""Disruptions end to end against the fake API: an eviction through the Eviction API (kubectl drain, Karpenter), a
spot interruption (Karpenter taints the node and drains it) are preemptions, not "exit code 143": the job restarts
from its own bounded preemption budget, max_job_restarts untouched, and the node is not blamed."""

from __future__ import annotations

from kubernetes import client as k8s_client

from api.schemas.causes import CauseClass
from tests.support.supervision import supervise
from tests.workers.backends.kubernetes.k8s_support import (
    JOB_ID,
    NS,
    SPEC,
    events_of,
    job_detail,
    running_attempt,
    start_job,
)
from workers.backends.base import AttemptPhase
from workers.backends.kubernetes import manifests as m

DISRUPTED = {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}


def evict(fake, pod: str) -> None:
    body = k8s_client.V1Eviction(metadata=k8s_client.V1ObjectMeta(name=pod, namespace=NS))
    k8s_client.CoreV1Api(fake.api_client()).create_namespaced_pod_eviction(pod, NS, body)


def test_an_api_eviction_is_a_preemption_not_an_exit_code(fake, backend):
    name = running_attempt(fake, backend)
    pod = fake.pod(name, NS, 1)
    evict(fake, pod["metadata"]["name"])
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert status.cause.cause_class == CauseClass.preempted
    assert "evicted through the Eviction API" in status.cause.message and "(exit code 143)" in status.cause.message
    assert status.cause.facts["reason"] == "EvictionByEvictionAPI" and status.cause.facts["signal"] == "SIGTERM"
    assert status.failed_nodes == ()  # a drained node is fine, and being drained it takes no new pods anyway
    (event,) = [e for e in status.events if e.type == "preempted"]
    assert event.node == pod["spec"]["nodeName"]


def test_a_sigterm_without_a_disruption_is_still_a_crash(fake, backend):
    name = running_attempt(fake, backend)
    fake.exit(name, NS, 0, 143)
    assert backend.status(JOB_ID, 0, SPEC).cause.cause_class == CauseClass.crash


def test_spot_interruptions_restart_from_the_preemption_budget(admin, fake, supervised):
    job_id, spec, a0 = start_job(admin, fake, resiliency={"max_job_restarts": 0, "max_preemptions": 1})
    interrupted = fake.pod(a0, NS, 0)["spec"]["nodeName"]
    fake.drain(interrupted, taint=DISRUPTED)  # Karpenter handling the spot interruption notice
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["status"] == "RECOVERING" and detail["attempt"] == 1  # max_job_restarts is 0
    assert detail["excluded_nodes"] == []
    (restart,) = events_of(admin, job_id, "job_restart")
    assert restart["details"]["cause_class"] == "preempted"
    assert (restart["details"]["preemption"], restart["details"]["preemption_budget"]) == (1, 1)
    assert [e["node"] for e in events_of(admin, job_id, "preempted")] == [interrupted]

    a1 = m.attempt_name(job_id, spec.name, 1)
    assert interrupted not in fake.schedule(a1, NS)  # cordoned and tainted: the scheduler keeps away
    fake.run(a1, NS)
    supervise()
    fake.drain(fake.pod(a1, NS, 1)["spec"]["nodeName"], taint=DISRUPTED)
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["status"] == "FAILED" and detail["status_reason"].endswith("preemption budget (1) spent")


def test_the_pods_a_failing_job_stops_before_it_is_failed_are_its_consequences(admin, fake, supervised):
    """The Job controller adds FailureTarget, stops the other pods (each in its own time within its grace), and
    adds Failed once the last one stopped: a pod that stopped in between was stopped by the failing Job. Judged
    against Failed's time, such a pod read as a crash of its own, and the attempt's cause when it stopped in the
    eviction's second (a CI run saw a spot interruption become "exit code 143 after rank failure")."""
    fake.hold_termination = True  # each container outlives SIGTERM until the test ends it
    job_id, _, a0 = start_job(admin, fake, nodes=3)
    fake.drain(fake.pod(a0, NS, 1)["spec"]["nodeName"], taint=DISRUPTED)
    fake.exit(a0, NS, 1, 143)  # the evicted pod honours its SIGTERM: the Job is failing
    fake.exit(a0, NS, 0, 143)  # stopped by the failing Job within the same second
    fake.advance(2)
    fake.exit(a0, NS, 2, 143)  # the last one: the Job is Failed now, two seconds on
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["attempt"] == 1 and "evicted through the Eviction API" in detail["attempts"][0]["cause"]
    (restart,) = events_of(admin, job_id, "job_restart")
    assert restart["details"]["cause_class"] == "preempted"
    assert events_of(admin, job_id, "rank_failed") == []  # neither stopped pod is taken for a crash


def test_a_disk_pressure_eviction_for_the_jobs_own_disk_use_is_the_jobs(fake, backend):
    """Finding 14: the node agent's and the ranks' output grew in the container's writable layer with no
    ephemeral-storage request, and the disk-pressure eviction that followed was blamed on the node. The pods now
    request ephemeral storage, and an eviction the kubelet says was for this pod's own use beyond it is the
    job's: no node blamed, no preemption."""
    name = running_attempt(fake, backend)
    fake.evict(name, NS, 1, resource="ephemeral-storage", using="85Gi")
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed and status.failed_nodes == ()
    assert status.cause.cause_class == CauseClass.other and status.cause.facts["reason"] == "EvictedForStorage"
    assert "Container trainer was using 85Gi, request is 20Gi" in status.cause.message
    assert "raise resources.ephemeral_storage" in status.cause.message


def test_a_disk_pressure_eviction_within_the_request_is_still_the_nodes(fake, backend):
    name = running_attempt(fake, backend)
    node = fake.pod(name, NS, 1)["spec"]["nodeName"]
    fake.evict(name, NS, 1, resource="ephemeral-storage")  # another tenant filled the disk
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.cause.cause_class == CauseClass.preempted and status.failed_nodes == (node,)
