"""Hot spares end to end against the fake API (resiliency.spare_nodes: 1 on a 2-node job, so 3 pods): a lost node
spends the spare and the attempt goes on (the node blamed, `spares_exhausted` once the last spare is in use); the
next loss ends the attempt and the job restarts with fresh pods and a fresh spare, without the nodes lost. A crash
of the program spends no spare: it ends the attempt at once."""

from __future__ import annotations

from api.schemas.causes import CauseClass
from tests.support.paths import REPO
from tests.support.supervision import supervise
from tests.workers.backends.kubernetes.k8s_support import (
    JOB_ID,
    NS,
    backend_for,
    events_of,
    job_detail,
    make_request,
    make_spec,
    running_attempt,
    start_job,
    submit,
)
from workers.backends.base import AttemptPhase
from workers.backends.kubernetes import manifests as m
from workers.backends.kubernetes import rendezvous


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
    assert condition(job, "Complete")["reason"] == "SuccessPolicy"  # succeededCount: nodes, the spent index aside
    supervise()
    assert job_detail(admin, job_id)["status"] == "SUCCEEDED"


def test_when_the_spares_are_spent_the_next_loss_restarts_the_job_without_the_lost_nodes(admin, fake, supervised):
    job_id, spec, a0 = start_job(admin, fake, resiliency={"spare_nodes": 1, "max_job_restarts": 1})
    first = fake.pod(a0, NS, 1)["spec"]["nodeName"]
    fake.exit(a0, NS, 1, 94)
    supervise()
    second = fake.pod(a0, NS, 0)["spec"]["nodeName"]
    fake.not_ready(second)
    fake.advance(301)  # its pod is marked for deletion (DisruptionTarget): a second index would fail
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


def test_a_spare_that_never_gets_a_node_does_not_keep_a_finished_run_from_succeeding(admin, fake, supervised):
    """Finding 2: with capacity for `nodes` only, the spare stayed Pending, the Job never completed, ftplane kept
    reporting running and hang detection restarted a finished run. A standby that cannot be placed is a fact
    (`spare_unavailable`), and the run succeeds when its active nodes do (the Job's successPolicy)."""
    for extra in fake.nodes[2:]:
        fake.delete("nodes", "", extra)  # capacity short by one: two p5 nodes for three pods
    job_id, spec = submit(admin, resiliency={"spare_nodes": 1})
    a0 = m.attempt_name(job_id, spec.name, 0)
    assert len(fake.schedule(a0, NS)) == 2
    fake.run(a0, NS)
    supervise()
    assert job_detail(admin, job_id)["status"] == "RUNNING"
    (unavailable,) = events_of(admin, job_id, "spare_unavailable")
    assert unavailable["details"]["reason"] == "Unschedulable"
    assert "0/2 nodes are available: 2 Insufficient" in unavailable["details"]["cause"]
    for index in (0, 1):
        fake.exit(a0, NS, index, 0)  # training finishes on the active nodes
    assert condition(fake.get("jobs", NS, a0), "Complete")["reason"] == "SuccessPolicy"
    supervise()
    assert job_detail(admin, job_id)["status"] == "SUCCEEDED"


def test_a_spare_whose_image_cannot_be_pulled_is_reported_not_a_failure(fake):
    backend = backend_for(fake, node_refresh_s=3600.0, image_pull_grace_s=0.0)
    spec = make_spec(resiliency={"spare_nodes": 1})
    backend.launch(make_request(spec))
    name = m.attempt_name(JOB_ID, spec.name, 0)
    fake.schedule(name, NS)
    fake.image_pull_error(name, NS, indexes=[2])  # the standby's node cannot pull the image (a registry mirror?)
    fake.run(name, NS, indexes=[0, 1])
    status = backend.status(JOB_ID, 0, spec)
    assert status.phase == AttemptPhase.running and status.cause is None
    (unavailable,) = [e for e in status.events if e.type == "spare_unavailable"]
    assert unavailable.details["reason"] == "ImagePullBackOff" and unavailable.details["node_rank"] == 2
    backend.close()


def test_losing_the_rendezvous_hosts_node_blames_that_node_not_the_launchers_it_took_down(fake, backend):
    """Finding 9: index 0's launcher hosts the rendezvous store; losing its node ends every launcher (they exit 1
    without the store) although a spare stands by. The cause is the store host's lost node, which is blamed, and the
    job restarts without it with fresh spares; the launchers' exits are consequences."""
    spec = make_spec(resiliency={"spare_nodes": 1})
    name = running_attempt(fake, backend, spec=spec)
    host = fake.pod(name, NS, 0)["spec"]["nodeName"]
    fake.hold_termination = True
    fake.lose_node(host)
    fake.exit(name, NS, 1, 1, message="RendezvousConnectionError: the store at index 0 is gone")
    fake.exit(name, NS, 2, 1, message="RendezvousConnectionError: the store at index 0 is gone")
    status = backend.status(JOB_ID, 0, spec)
    assert status.phase == AttemptPhase.failed
    assert status.cause.cause_class == CauseClass.node and status.failed_nodes == (host,)
    assert f"node {host} lost" in status.cause.message


def test_the_deploy_docs_say_that_losing_index_0_restarts_the_job_spares_or_not():
    """What the test above holds, said where an operator reads it (deploy/README.md) and in rendezvous.py."""
    readme = " ".join((REPO / "deploy" / "README.md").read_text().split())
    section = readme[readme.index("**The rendezvous store's node.**") :][:1200]
    assert "Index 0's pod hosts the c10d rendezvous store" in section
    assert "even with a spare standing by" in section and "job restart without that node" in section
    assert "blames and excludes that node only" in section and "fresh spares" in section
    docstring = " ".join((rendezvous.__doc__ or "").split())
    assert "job restart without that node, spares or not" in docstring and "The rendezvous store's node" in docstring
