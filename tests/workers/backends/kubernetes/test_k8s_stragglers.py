"""A straggler with `resiliency.stragglers.action: exclude` on the Kubernetes backend (the fake API server): once
the episode has lasted exclude_after_s, the job restarts without the straggler's node, and the new attempt's pods
are kept off it."""

from __future__ import annotations

from datetime import timedelta

from api.schemas.events import utcnow
from tests.support.supervision import supervise
from tests.workers.backends.kubernetes.k8s_support import NS, events_of, job_detail, start_job
from workers.backends.kubernetes import manifests as m

WINDOW_S = 20.0


def test_a_straggler_moves_the_job_off_its_node(admin, fake, supervised):
    job_id, spec, a0 = start_job(
        admin,
        fake,
        resiliency={
            "max_job_restarts": 2,
            "exclude_failed_nodes": True,
            "stragglers": {"window_s": WINDOW_S, "action": "exclude", "exclude_after_s": 5},
        },
    )
    assert job_detail(admin, job_id)["status"] == "RUNNING"
    nodes = [fake.pod(a0, NS, i)["spec"]["nodeName"] for i in range(spec.nodes)]
    slow_node = nodes[1]
    per_node = spec.procs_per_node
    start = utcnow() - timedelta(hours=1)  # heartbeats dated in the past are taken as sent
    from api.core.db import session_scope
    from workers.supervision import detect_stragglers

    for t in range(40):
        now = start + timedelta(seconds=t)
        beats = [
            {
                "rank": rank,
                "step": t + 1,
                "ts": now.isoformat(),
                "node": nodes[rank // per_node],
                "step_time_s": 1.6,
                "compute_s": 1.5 if rank == per_node + 3 else 1.0,  # rank 11, on the second node, is slow
            }
            for rank in range(spec.world_size)
        ]
        assert admin.post(f"/v1/jobs/{job_id}/heartbeats", json={"heartbeats": beats}).status_code == 200
        with session_scope() as session:
            detect_stragglers.run_once(session, now)
        if events_of(admin, job_id, "job_restart"):
            break

    (detected,) = events_of(admin, job_id, "straggler_detected")
    assert detected["rank"] == per_node + 3 and detected["node"] == slow_node
    (restart,) = events_of(admin, job_id, "job_restart")
    assert restart["details"]["cause_class"] == "straggler" and restart["details"]["node"] == slow_node
    (excluded,) = events_of(admin, job_id, "node_excluded")
    assert excluded["node"] == slow_node
    detail = job_detail(admin, job_id)
    assert detail["attempt"] == 1 and detail["excluded_nodes"] == [slow_node]

    supervise()  # the launch duty tears attempt 0 down and launches attempt 1 without the node
    a1 = m.attempt_name(job_id, spec.name, 1)
    placed = fake.schedule(a1, NS)
    assert slow_node not in placed and len(placed) == spec.nodes
