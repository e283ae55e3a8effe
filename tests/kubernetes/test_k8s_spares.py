"""Hot spares end to end against the fake API (resiliency.spare_nodes: 1 on a 2-node job, so 3 pods): a lost node
spends the spare and the attempt goes on (the node blamed, `spares_exhausted` once the last spare is in use); the
next loss ends the attempt and the job restarts with fresh pods and a fresh spare, without the nodes lost. A crash
of the program spends no spare: it ends the attempt at once."""

from __future__ import annotations

from api.schemas.causes import CauseClass
from tests.kubernetes.k8s_support import (
    JOB_ID,
    NS,
    events_of,
    job_detail,
    make_spec,
    running_attempt,
    start_job,
    submit,
)
from tests.support.supervision import supervise
from workers.backends.base import AttemptPhase
from workers.backends.kubernetes import manifests as m


def condition(job, kind):
    return next((c for c in job["status"].get("conditions") or [] if c["type"] == kind), None)


def test_a_spare_takes_a_lost_nodes_place_and_the_job_finishes(admin, fake, supervised):
    job_id, spec = submit(admin, resiliency={"spare_nodes": 1, "max_job_restarts": 1})
    a0 = m.attempt_name(job_id, spec.name, 0)
    assert len(fake.schedule(a0, NS)) == 3
    fake.run(a0, NS)
    supervise()
    lost = fake.pod(a0, NS, 2)["spec"]["nodeName"]
    fake.exit(a0, NS, 2, 94, message="GPU 0: uncorrectable ECC error")
    assert condition(fake.get("jobs", NS, a0), "Failed") is None  # the Job fails only the index
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["attempt"] == 0 and detail["job_restarts"] == 0  # no job-level restart: the spare took over
    assert [e["node"] for e in events_of(admin, job_id, "node_failed")] == [lost]
    (spent,) = events_of(admin, job_id, "spares_exhausted")
    assert spent["details"]["spares"] == 1 and spent["details"]["nodes"] == [lost]
    assert "the next node lost ends the attempt" in spent["details"]["cause"]

    fake.succeed(a0, NS)  # training finishes on the two nodes left
    job = fake.get("jobs", NS, a0)
    assert condition(job, "Failed")["reason"] == "FailedIndexes"  # what Kubernetes says of a Job with a spent spare
    supervise()
    assert job_detail(admin, job_id)["status"] == "SUCCEEDED"


def test_when_the_spares_are_spent_the_next_loss_restarts_the_job_without_the_lost_nodes(admin, fake, supervised):
    job_id, spec, a0 = start_job(admin, fake, resiliency={"spare_nodes": 1, "max_job_restarts": 1})
    first = fake.pod(a0, NS, 1)["spec"]["nodeName"]
    fake.exit(a0, NS, 1, 94)
    supervise()
    second = fake.pod(a0, NS, 0)["spec"]["nodeName"]
    fake.not_ready(second)
    fake.advance(31)  # its pod is marked for deletion (DisruptionTarget): a second index would fail
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["attempt"] == 1 and sorted(detail["excluded_nodes"]) == sorted([first, second])
    a1 = fake.get("jobs", NS, m.attempt_name(job_id, spec.name, 1))
    assert a1["spec"]["completions"] == 3 and a1["spec"]["maxFailedIndexes"] == 1  # a fresh spare
    placed = fake.schedule(a1["metadata"]["name"], NS)
    assert len(placed) == 3 and first not in placed and second not in placed


def test_a_crash_spends_no_spare(fake, backend):
    spec = make_spec(resiliency={"spare_nodes": 2})
    name = running_attempt(fake, backend, spec=spec)
    fake.exit(name, NS, 3, 1)
    job = fake.get("jobs", NS, name)
    assert condition(job, "Failed")["reason"] == "PodFailurePolicy"
    status = backend.status(JOB_ID, 0, spec)
    assert status.phase == AttemptPhase.failed and status.cause.cause_class == CauseClass.crash
    assert status.failed_nodes == () and not [e for e in status.events if e.type == "spares_exhausted"]
