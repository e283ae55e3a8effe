"""Kueue against the fake API: a job with a queue is created suspended with the queue-name label; while Kueue has
not admitted it the attempt is queued (a `queued` event with Kueue's reason, no pending timeout); admission starts
it; a preemption by re-suspension fails the attempt as preempted and the job queues again from its preemption
budget. The time spent queued is its own goodput bucket."""

from __future__ import annotations

from datetime import timedelta

from api.schemas.causes import CauseClass
from tests.fake_kubernetes.kueue import PENDING_MESSAGE
from tests.support.supervision import supervise
from tests.workers.backends.kubernetes.k8s_support import (
    JOB_ID,
    NS,
    events_of,
    job_detail,
    make_request,
    make_spec,
    submit,
)
from workers.backends.base import AttemptPhase
from workers.backends.kubernetes import manifests as m

QUEUED = make_spec(queue="team-a")
A0 = m.attempt_name(JOB_ID, QUEUED.name, 0)


def test_queued_admitted_running_then_preempted(fake, backend):
    backend.launch(make_request(QUEUED))
    job = fake.get("jobs", NS, A0)
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert fake.pods(A0, NS) == []  # nothing runs before Kueue says so

    status = backend.status(JOB_ID, 0, QUEUED)
    assert status.phase == AttemptPhase.pending and status.cause.cause_class == CauseClass.scheduling
    assert status.cause.message == f"queued in LocalQueue team-a: {PENDING_MESSAGE}"
    (waiting,) = status.events
    assert (waiting.type, waiting.details["queue_state"]) == ("queued", "waiting")

    fake.kueue_admit(A0, NS)
    assert len(fake.pods(A0, NS)) == 2
    status = backend.status(JOB_ID, 0, QUEUED)
    admitted = [e for e in status.events if e.type == "queued"]
    assert [e.details["queue_state"] for e in admitted] == ["admitted"]
    assert admitted[0].details["ts"] == fake.get("jobs", NS, A0)["status"]["startTime"]  # when Kueue resumed it
    fake.schedule(A0, NS)
    fake.run(A0, NS)
    assert backend.status(JOB_ID, 0, QUEUED).phase == AttemptPhase.running

    fake.kueue_preempt(A0, NS)
    assert fake.pods(A0, NS) == []
    status = backend.status(JOB_ID, 0, QUEUED)
    assert status.phase == AttemptPhase.failed and status.cause.cause_class == CauseClass.preempted
    assert status.cause.message.startswith("preempted by Kueue in LocalQueue team-a (Preempted): Preempted to ")
    assert status.failed_nodes == ()
    assert [e.type for e in status.events] == ["preempted"]


def test_without_kueue_the_cause_says_so(fake, backend):
    fake.kueue_installed = False
    backend.launch(make_request(QUEUED))
    status = backend.status(JOB_ID, 0, QUEUED)
    assert status.phase == AttemptPhase.pending
    assert "no Kueue in this cluster" in status.cause.message and "remove `queue`" in status.cause.message


def test_no_pending_timeout_while_queued_and_a_preemption_queues_the_job_again(admin, fake, supervised):
    from api.core.db import session_scope
    from api.database.tables import Attempt, Event

    job_id, spec = submit(admin, queue="team-a", resiliency={"pending_timeout_s": 60, "max_job_restarts": 0})
    a0 = m.attempt_name(job_id, spec.name, 0)
    supervise()
    with session_scope() as session:  # an hour in the queue
        row = session.query(Attempt).filter_by(job_id=job_id, number=0).one()
        row.launched_at = row.launched_at - timedelta(hours=1)
        for event in session.query(Event).filter_by(job_id=job_id):
            event.ts = event.ts - timedelta(hours=1)
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["attempt"] == 0 and detail["attempts"][0]["status"] == "LAUNCHED"
    assert detail["attempts"][0]["cause"].startswith("queued in LocalQueue team-a")
    assert events_of(admin, job_id, "scheduling_failed") == []

    fake.kueue_admit(a0, NS)
    fake.schedule(a0, NS)
    fake.run(a0, NS)
    supervise()
    assert [e["details"]["queue_state"] for e in events_of(admin, job_id, "queued")] == ["waiting", "admitted"]
    goodput = admin.get(f"/v1/jobs/{job_id}/goodput").json()
    assert goodput["lost_s"]["queued"] >= 3600  # the hour in the queue is the queue's, not initialization

    fake.kueue_preempt(a0, NS)
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["attempt"] == 1 and detail["status"] == "RECOVERING"  # max_job_restarts 0: the preemption budget
    (restart,) = events_of(admin, job_id, "job_restart")
    assert restart["details"]["cause_class"] == "preempted" and restart["details"]["preemption"] == 1
    a1 = fake.get("jobs", NS, m.attempt_name(job_id, spec.name, 1))
    assert a1["spec"]["suspend"] is True  # in the queue again
