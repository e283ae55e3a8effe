"""The fake's Job controller and watches, against what Kubernetes documents:
- a Job ends in two steps: the interim condition (FailureTarget, SuccessCriteriaMet), its running pods terminated
  gracefully (SIGTERM, SIGKILL after their grace period), then the terminal condition (Failed, Complete) once none
  runs (https://kubernetes.io/docs/concepts/workloads/controllers/job/#terminal-job-conditions);
- `successPolicy` (GA in 1.33): a met rule ends the Job as succeeded and the lingering pods are terminated
  (#success-policy); a failure policy that ends it first wins;
- a watch streams ADDED, MODIFIED, DELETED (with the last state) from a resourceVersion, BOOKMARKs when asked, and
  410 Gone for a compacted resourceVersion
  (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes)."""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s_client
from kubernetes import watch

from tests.fake_kubernetes import FakeKube
from tests.workers.backends.kubernetes.k8s_support import NS, make_request, make_spec
from workers.backends.kubernetes import manifests as m


def conditions(fake: FakeKube, name: str) -> dict[str, str]:
    job = fake.get("jobs", NS, name)
    return {c["type"]: c.get("reason", "") for c in job["status"].get("conditions") or [] if c["status"] == "True"}


def started(fake: FakeKube, **spec: Any) -> str:
    request = make_request(make_spec(**spec))
    job = m.job_manifest(request)
    fake.create("jobs", NS, job)
    name = job["metadata"]["name"]
    fake.schedule(name, NS)
    fake.run(name, NS)
    return name


def test_a_failing_job_is_failed_only_once_its_pods_have_stopped(fake):
    fake.hold_termination = True  # the containers outlive SIGTERM until the test ends them
    name = started(fake)
    fake.exit(name, NS, 0, 1)
    assert conditions(fake, name) == {"FailureTarget": "BackoffLimitExceeded"}
    other = fake.pod(name, NS, 1)
    assert other["status"]["phase"] == "Running" and other["metadata"]["deletionTimestamp"]
    assert other["metadata"]["deletionGracePeriodSeconds"] == other["spec"]["terminationGracePeriodSeconds"]
    fake.exit(name, NS, 1, 93)  # its node agent's own end, while being terminated
    assert conditions(fake, name)["Failed"] == "BackoffLimitExceeded"
    assert [p["metadata"]["name"] for p in fake.pods(name, NS)] == [fake.pod(name, NS, 0)["metadata"]["name"]]


def test_a_container_that_ignores_sigterm_is_killed_after_its_grace_period(fake):
    fake.hold_termination = True
    name = started(fake)
    fake.exit(name, NS, 1, 1)
    assert "Failed" not in conditions(fake, name)
    fake.advance(fake.pod(name, NS, 0)["spec"]["terminationGracePeriodSeconds"] + 1)
    assert conditions(fake, name)["Failed"] == "BackoffLimitExceeded"
    killed = [t for _, _, _, t in fake.tombstones if t["metadata"]["name"].startswith(f"{name}-0-")]
    assert killed[-1]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137


def test_a_met_success_policy_completes_the_job_and_ends_the_standbys(fake):
    name = started(fake, resiliency={"spare_nodes": 1})  # 3 pods, successPolicy succeededCount 2
    fake.exit(name, NS, 0, 0)
    assert "SuccessCriteriaMet" not in conditions(fake, name)
    fake.exit(name, NS, 2, 0)
    assert conditions(fake, name)["Complete"] == "SuccessPolicy"
    assert fake.get("jobs", NS, name)["status"]["completedIndexes"] == "0,2"
    assert {p["metadata"]["labels"][m.COMPLETION_INDEX_LABEL] for p in fake.pods(name, NS)} == {"0", "2"}


def test_a_failure_policy_that_ends_the_job_first_wins_over_the_success_policy(fake):
    fake.hold_termination = True
    name = started(fake, resiliency={"spare_nodes": 1})
    fake.exit(name, NS, 1, 1)  # FailJob: any other exit code is the program's
    fake.exit(name, NS, 0, 0)  # the others finish while being terminated
    fake.exit(name, NS, 2, 0)
    assert conditions(fake, name)["Failed"] == "PodFailurePolicy" and "Complete" not in conditions(fake, name)


def test_a_capacity_short_by_one_leaves_the_spare_pending_with_the_schedulers_words():
    fake = FakeKube(nodes=["ip-10-0-1-1", "ip-10-0-1-2"])
    name = started(fake, resiliency={"spare_nodes": 1})
    spare = fake.pod(name, NS, 2)
    assert spare["status"]["phase"] == "Pending" and not spare["spec"].get("nodeName")
    (unscheduled,) = spare["status"]["conditions"]
    assert unscheduled["reason"] == "Unschedulable"
    assert unscheduled["message"].startswith("0/2 nodes are available: 2 Insufficient")


def test_a_watch_streams_changes_deletions_with_their_last_state_and_bookmarks(fake):
    name = started(fake)
    api = k8s_client.CoreV1Api(fake.api_client())
    listed = api.list_namespaced_pod(NS, label_selector=f"job-name={name}")
    rv = listed.metadata.resource_version
    fake.exit(name, NS, 0, 1)  # pod 0 fails, the Job terminates pod 1 (143) and removes it
    seen = []
    for event in watch.Watch().stream(
        api.list_namespaced_pod,
        NS,
        label_selector=f"job-name={name}",
        resource_version=rv,
        allow_watch_bookmarks=True,
        timeout_seconds=1,
        _preload_content=False,
    ):
        seen.append(event)
    kinds = [(e["type"], (e["raw_object"].get("metadata") or {}).get("name", "")[-7:-6]) for e in seen]
    assert ("MODIFIED", "0") in kinds and ("DELETED", "1") in kinds and ("BOOKMARK", "") in kinds
    deleted = next(e["raw_object"] for e in seen if e["type"] == "DELETED")
    assert deleted["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143


def test_a_watch_from_a_compacted_resource_version_is_gone(fake):
    started(fake)
    api = k8s_client.CoreV1Api(fake.api_client())
    rv = api.list_namespaced_pod(NS).metadata.resource_version
    fake.compact()
    response = api.list_namespaced_pod(NS, watch=True, resource_version=rv, timeout_seconds=1, _preload_content=False)
    (line,) = [ln for ln in response.read().decode().splitlines() if ln]
    assert '"type": "ERROR"' in line and '"code": 410' in line and "too old resource version" in line


def test_an_evicted_pod_keeps_its_grace_period(fake):
    """The Eviction API deletes a pod gracefully: its containers get SIGTERM and the pod's whole
    terminationGracePeriodSeconds (the spec's stop grace and the agent's margin) before SIGKILL."""
    fake.hold_termination = True
    name = started(fake, resiliency={"stop_grace_s": 300})
    pod = fake.pod(name, NS, 1)
    fake.api_evict(NS, pod["metadata"]["name"])
    evicted = fake.pod(name, NS, 1)
    assert evicted["status"]["phase"] == "Running" and evicted["metadata"]["deletionGracePeriodSeconds"] == 320
    fake.advance(300)  # saving a checkpoint, still within the grace
    assert fake.pod(name, NS, 1)["status"]["phase"] == "Running"
    fake.advance(30)
    killed = fake.pod(name, NS, 1)
    assert killed["status"]["phase"] == "Failed"
    assert killed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
