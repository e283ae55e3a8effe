"""What a status pass reads (finding 12): a full list of the attempt's pods every pass (10-15 KB a pod: 20-30 MB at
2,048 pods, every 5 s) and up to 9 Event lists a pass, as if kube-apiserver kept a watch cache for Events (it does
not: each list reads the namespace's Events from etcd). Pods are now listed once and then watched; Events are read
for the pods that need explaining only, a few lists a pass, each kept for a while."""

from __future__ import annotations

from api.schemas.spec import JobSpec
from tests.fake_kubernetes import FakeKube
from tests.support.waiting import wait_for
from tests.workers.backends.kubernetes.k8s_support import JOB_ID, NS, backend_for, make_request, make_spec
from workers.backends.base import AttemptPhase
from workers.backends.kubernetes import KubernetesBackend, events
from workers.backends.kubernetes import manifests as m
from workers.backends.kubernetes.pods import PodWatch


def pod_reads(fake: FakeKube, since: int) -> list:
    return [r for r in fake.requests[since:] if r.path.endswith("/pods") and r.query.get("watch") != ["true"]]


def test_a_steady_attempt_reads_no_pods_and_no_events_after_its_first_pass(fake):
    backend = backend_for(fake, node_refresh_s=3600.0)
    spec = make_spec(nodes=8)
    backend.launch(make_request(spec))
    name = m.attempt_name(JOB_ID, spec.name, 0)
    fake.schedule(name, NS)
    fake.run(name, NS)
    assert backend.status(JOB_ID, 0, spec).phase == AttemptPhase.running
    before, lists = len(fake.requests), fake.event_lists
    for _ in range(5):
        assert backend.status(JOB_ID, 0, spec).phase == AttemptPhase.running
    assert pod_reads(fake, before) == [] and fake.event_lists == lists
    fake.exit(name, NS, 3, 1)  # a change reaches the pass through the watch
    assert backend.status(JOB_ID, 0, spec).phase == AttemptPhase.failed
    assert pod_reads(fake, before) == []
    backend.close()


def test_many_troubled_pods_cost_a_few_event_lists_a_pass(fake):
    backend = backend_for(fake, node_refresh_s=3600.0)
    spec = make_spec(nodes=40)  # 8 nodes for 40 pods: 32 stay Unschedulable
    backend.launch(make_request(spec))
    fake.schedule(m.attempt_name(JOB_ID, spec.name, 0), NS)
    per_pass = []
    for _ in range(16):
        lists = fake.event_lists
        status = backend.status(JOB_ID, 0, spec)
        per_pass.append(fake.event_lists - lists)
    assert status.phase == AttemptPhase.pending and "0/8 nodes are available" in status.cause.message
    assert max(per_pass) == events.LISTS_PER_PASS  # never the Job's and eight pods' a pass
    assert sum(per_pass) == 1 + 40  # the Job's, then each pending pod's (bound or not) once, a few a pass
    assert per_pass[-1] == 0  # all kept, within REFRESH_S
    fake.advance(events.REFRESH_S + 1)
    lists = fake.event_lists
    backend.status(JOB_ID, 0, spec)
    assert fake.event_lists - lists == events.LISTS_PER_PASS
    backend.close()


def pod_requests(fake: FakeKube, since: int) -> list[tuple[str, str | None]]:
    """The pod collection's requests since `since`: ("watch" or "list", the resourceVersion asked from)."""
    return [
        ("watch" if r.query.get("watch") == ["true"] else "list", (r.query.get("resourceVersion") or [None])[0])
        for r in fake.requests[since:]
        if r.path.endswith("/pods")
    ]


def running_attempt(fake: FakeKube, backend: KubernetesBackend, nodes: int = 4) -> tuple[JobSpec, str, PodWatch]:
    spec = make_spec(nodes=nodes)
    backend.launch(make_request(spec))
    name = m.attempt_name(JOB_ID, spec.name, 0)
    fake.schedule(name, NS)
    fake.run(name, NS)
    assert backend.status(JOB_ID, 0, spec).phase == AttemptPhase.running
    watch = backend.pod_watches.get(NS, m.attempt_selector(JOB_ID, 0))
    assert watch is not None
    # Before a test counts requests: the watch's thread has asked to watch, and what it was due has reached it.
    newest = fake.current_rv()
    watching = wait_for(
        "the watch to watch and catch up",
        lambda: any(verb == "watch" for verb, _ in pod_requests(fake, 0)) and watch.applied >= newest,
        30,
    )
    assert watching
    return spec, name, watch


def test_a_watch_compacted_away_mid_attempt_lists_again_and_sees_what_changed_in_the_gap(fake):
    backend = backend_for(fake, node_refresh_s=3600.0)
    spec, name, watch = running_attempt(fake, backend)
    had = watch.resource_version
    before = len(fake.requests)
    with fake.cut_watches():  # the watch's connection lost for a while
        fake.exit(name, NS, 2, 1)  # meanwhile index 2 fails: never streamed to the watch
        fake.compact()  # and etcd compacts past the watch's resourceVersion
    relisted = wait_for("the watch to list again", lambda: len(pod_requests(fake, before)) >= 3, 30)
    assert relisted
    # Watched again from where it was, told 410 Gone, listed (no read asked for it), watched on from the list.
    (watched, gone_from), (listed, _), (rewatched, listed_rv) = pod_requests(fake, before)[:3]
    assert (watched, gone_from, listed, rewatched) == ("watch", had, "list", "watch")
    assert listed_rv is not None and int(listed_rv) >= fake.compacted  # watchable again
    status = backend.status(JOB_ID, 0, spec)
    assert status.phase == AttemptPhase.failed  # the pod that changed in the gap is seen
    failed = next(p for p in watch.pods() if p["metadata"]["name"].startswith(f"{name}-2-"))
    assert failed["status"]["phase"] == "Failed"
    backend.close()


def test_a_bookmark_moves_the_watch_on_while_the_attempts_pods_do_not_change(fake):
    backend = backend_for(fake, node_refresh_s=3600.0)
    spec, _, watch = running_attempt(fake, backend)
    before = len(fake.requests)
    had = watch.applied
    # Other objects change (another job's Secret): no pod of the attempt does, and no pod is listed.
    fake.create("secrets", NS, {"metadata": {"name": "other-job-token"}, "data": {}})
    moved = fake.current_rv()
    assert moved > had
    wait_for("a bookmark to reach the watch", lambda: watch.applied >= moved, 30)
    assert pod_reads(fake, before) == []
    # Its connection lost, the watch goes on from the bookmark's resourceVersion, not from its last pod's.
    with fake.cut_watches():
        pass
    wait_for("the watch to watch again", lambda: len(pod_requests(fake, before)) >= 1, 30)
    verb, resumed_at = pod_requests(fake, before)[0]
    # Bookmarks go on arriving on the new watch, so what it has applied since may be later still.
    assert verb == "watch" and moved <= int(resumed_at or 0) <= watch.applied
    assert backend.status(JOB_ID, 0, spec).phase == AttemptPhase.running
    backend.close()
