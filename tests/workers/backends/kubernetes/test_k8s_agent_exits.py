"""The node agent's exit codes on Kubernetes, end to end (the supervision duties against the fake API): 94 (this node
is unhealthy) is a job restart without the node; 93 (NVRx decided not to restart) fails the job with no restart;
the EFA check's 94 blames the node, its 78 (the image cannot do EFA) fails the job."""

from __future__ import annotations

from tests.support.supervision import supervise
from tests.workers.backends.kubernetes.k8s_support import NS, events_of, job_detail, start_job, submit
from workers.backends.kubernetes import manifests as m


def test_exit_94_restarts_the_job_without_the_node(admin, fake, supervised):
    job_id, spec, a0 = start_job(admin, fake)
    sick = fake.pod(a0, NS, 1)["spec"]["nodeName"]
    fake.exit(a0, NS, 1, 94, message="GPU 3: Xid 79 (fallen off the bus)")
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["attempt"] == 1 and detail["excluded_nodes"] == [sick]
    (failed,) = events_of(admin, job_id, "node_failed")
    assert failed["node"] == sick and failed["details"]["cause_class"] == "node"
    assert failed["details"]["exit_code"] == 94 and "Xid 79" in failed["details"]["cause"]
    # the job's own Job said so too: its pod failure policy counted the failure
    a1 = m.attempt_name(job_id, spec.name, 1)
    assert fake.get("jobs", NS, a0) is None  # the attempt was torn down before the next one
    template = fake.get("jobs", NS, a1)["spec"]["template"]["spec"]
    terms = template["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [sick]}]}]
    assert sick not in fake.schedule(a1, NS)


def test_exit_93_fails_the_job_without_a_restart(admin, fake, supervised):
    job_id, spec, a0 = start_job(admin, fake, resiliency={"max_job_restarts": 5})
    fake.exit(a0, NS, 0, 93, message="ft_launcher: no progress over 3 restart cycles")
    job = fake.get("jobs", NS, a0)
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert (
        failed["reason"] == "PodFailurePolicy" and "exit code 93 matching FailJob rule at index 0" in failed["message"]
    )
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["status"] == "FAILED" and detail["attempt"] == 0 and detail["job_restarts"] == 0
    assert "NVRx decided not to restart (exit code 93)" in detail["status_reason"]
    (end,) = events_of(admin, job_id, "failed")
    assert end["details"]["cause_class"] == "verdict" and end["details"]["exit_code"] == 93
    assert fake.get("jobs", NS, m.attempt_name(job_id, spec.name, 1)) is None


def test_the_efa_checks_exits_blame_the_node_or_fail_the_job(admin, fake, supervised):
    job_id, spec = submit(admin)
    a0 = m.attempt_name(job_id, spec.name, 0)
    fake.schedule(a0, NS)
    node = fake.pod(a0, NS, 0)["spec"]["nodeName"]
    fake.init_exit(a0, NS, 0, "efa-check", 94, "no EFA device (/dev/infiniband/uverbs*) in the container")
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["attempt"] == 1 and detail["excluded_nodes"] == [node]

    a1 = m.attempt_name(job_id, spec.name, 1)
    fake.schedule(a1, NS)
    fake.init_exit(a1, NS, 0, "efa-check", 78, "the aws-ofi-nccl plugin (libnccl-net*.so) is not in the image")
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["status"] == "FAILED" and detail["attempt"] == 1  # the image is broken: restarts cannot help
    assert "the image cannot run this pod: its efa-check check failed (exit code 78)" in detail["status_reason"]
    (end,) = events_of(admin, job_id, "failed")
    assert end["details"]["cause_class"] == "launch"


def test_a_verdict_on_any_node_is_the_attempts_cause_whichever_node_failed_first(admin, fake, supervised):
    """Finding 4: when NVRx decides to stop, a node that missed its stop key exits 1, maybe first; ftplane took the
    earliest failure for the cause and restarted the job. The failing Job terminates its other pods before it is
    Failed (FailureTarget first); the attempt is judged once they stopped, and exit 93 on any node is its verdict."""
    fake.hold_termination = True  # the node agents outlive SIGTERM long enough to end on their own
    job_id, spec, a0 = start_job(admin, fake, resiliency={"max_job_restarts": 5})
    fake.exit(a0, NS, 1, 1, message="ft_launcher: rendezvous closed")  # missed the stop key: first to fail
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["attempt"] == 0 and detail["status"] != "FAILED"  # the Job is failing: its pods are stopping
    fake.exit(a0, NS, 0, 93, message="ft_launcher: no progress over 3 restart cycles")
    supervise()
    detail = job_detail(admin, job_id)
    assert detail["status"] == "FAILED" and detail["job_restarts"] == 0
    assert "NVRx decided not to restart (exit code 93)" in detail["status_reason"]
