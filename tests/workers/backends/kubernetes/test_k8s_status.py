"""How one reading of an attempt (Job, pods, Events as dicts) maps to an AttemptReading, without a server."""

from __future__ import annotations

import time
from typing import Any

from api.schemas.causes import CauseClass
from tests.workers.backends.kubernetes.k8s_support import make_spec
from workers.backends.base import AttemptPhase
from workers.backends.kubernetes.status import AttemptView

SPEC = make_spec(nodes=2)
NAME = "llama-8b-fsdp-f2c48fa0c3-a0"


def job(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": NAME, "uid": "job-uid", "annotations": {}}, "status": status}


def pod(index: int, phase: str, node: str | None = "ip-10-0-1-1", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{NAME}-{index}-abcde",
            "uid": f"pod-{index}",
            "labels": {"batch.kubernetes.io/job-completion-index": str(index)},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase, **status},
    }


def view(j: dict[str, Any], pods: list[dict[str, Any]], events: list[Any] | None = None) -> AttemptView:
    return AttemptView(j, pods, events or [], spec=SPEC, now=time.time())


def test_unknown_phase_blames_the_node():
    status = view(job(), [pod(0, "Running"), pod(1, "Unknown", node="ip-10-0-9-9")]).status()
    assert status.phase == AttemptPhase.failed
    assert status.failed_nodes == ("ip-10-0-9-9",)
    assert "stopped responding" in status.cause.message
    assert status.cause.cause_class == CauseClass.node and status.cause.facts["node"] == "ip-10-0-9-9"


def test_deadline_exceeded_without_pods_left():
    failed = {
        "type": "Failed",
        "status": "True",
        "reason": "DeadlineExceeded",
        "message": "Job was active longer",
    }
    status = view(job(conditions=[failed]), []).status()
    assert status.phase == AttemptPhase.failed
    assert status.cause.message == "deadline exceeded: Job was active longer"
    assert status.cause.facts == {"reason": "DeadlineExceeded"}


def test_quota_refusal_is_a_pending_cause():
    event = {
        "involvedObject": {"kind": "Job", "name": NAME},
        "reason": "FailedCreate",
        "message": 'pods "x" is forbidden: exceeded quota: gpu-quota',
        "lastTimestamp": "2026-01-01T00:00:01Z",
    }
    v = view(job(), [], [event])
    assert v.needs_events()
    status = v.status()
    assert status.phase == AttemptPhase.pending
    assert status.cause.message == 'pods cannot be created: pods "x" is forbidden: exceeded quota: gpu-quota'
    assert status.cause.cause_class == CauseClass.scheduling


def test_node_shutdown_is_node_level_and_preemption_is_not():
    shutdown = pod(
        1,
        "Failed",
        node="ip-10-0-2-2",
        reason="Terminated",
        message="Pod was terminated in response to imminent node shutdown.",
    )
    status = view(job(), [pod(0, "Running"), shutdown]).status()
    assert status.failed_nodes == ("ip-10-0-2-2",)
    # a node shut down on purpose (a drain, a spot interruption) preempted the attempt; the node is still excluded
    assert status.cause.cause_class == CauseClass.preempted and status.cause.facts["reason"] == "Terminated"
    preempted = pod(
        1,
        "Failed",
        conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
        containerStatuses=[{"name": "trainer", "state": {"terminated": {"exitCode": 143}}}],
    )
    status = view(job(), [pod(0, "Running"), preempted]).status()
    assert status.failed_nodes == ()
    assert (
        status.cause.message
        == f"pod {NAME}-1-abcde on node ip-10-0-1-1 preempted by a higher-priority pod (exit code 143)"
    )
    assert status.cause.cause_class == CauseClass.preempted
    assert status.cause.facts["exit_code"] == 143 and status.cause.facts["signal"] == "SIGTERM"


def test_vanished_pod_node_comes_from_its_scheduled_event():
    events = [
        {
            "involvedObject": {"kind": "Pod", "name": f"{NAME}-1-zzzzz", "uid": "gone"},
            "reason": "Scheduled",
            "message": f"Successfully assigned training/{NAME}-1-zzzzz to ip-10-0-7-7",
            "lastTimestamp": "2026-01-01T00:00:01Z",
        },
        {
            "involvedObject": {"kind": "Pod", "name": f"{NAME}-1-zzzzz", "uid": "gone"},
            "reason": "TaintManagerEviction",
            "message": f"Marking for deletion Pod training/{NAME}-1-zzzzz",
            "lastTimestamp": "2026-01-01T00:05:01Z",
        },
        # a pod of another attempt whose name shares the prefix must not count
        {
            "involvedObject": {"kind": "Pod", "name": f"{NAME}0-1-yyyyy", "uid": "other"},
            "reason": "NodeNotReady",
            "lastTimestamp": "2026-01-01T00:05:01Z",
        },
    ]
    status = view(job(failed=1), [pod(0, "Running")], events).status()
    assert status.phase == AttemptPhase.failed
    assert status.failed_nodes == ("ip-10-0-7-7",)
    (event,) = [e for e in status.events if e.type == "node_failed"]
    assert event.key == "k8s:gone:node_failed" and event.details["node_rank"] == 1
    assert event.details["cause_class"] == "node" and event.details["node"] == "ip-10-0-7-7"


def test_all_succeeded_before_the_job_says_complete():
    done = {"name": "trainer", "state": {"terminated": {"exitCode": 0, "startedAt": "2026-01-01T00:00:05Z"}}}
    pods = [pod(i, "Succeeded", containerStatuses=[done]) for i in (0, 1)]
    status = view(job(), pods).status()
    assert status.phase == AttemptPhase.succeeded
    assert [e.type for e in status.events] == ["scheduled", "running"]


def exited(index: int, code: int, message: str = "", **status: Any) -> dict[str, Any]:
    term = {"exitCode": code, "reason": "Error", "message": message, "finishedAt": "2026-01-01T00:10:00Z"}
    return pod(index, "Failed", containerStatuses=[{"name": "trainer", "state": {"terminated": term}}], **status)


def test_the_agents_exit_codes():
    verdict = view(job(), [pod(0, "Running"), exited(1, 93, "no progress over 3 cycles")]).status()
    assert verdict.cause.cause_class == CauseClass.verdict and verdict.failed_nodes == ()
    assert (
        verdict.cause.message
        == "NVRx decided not to restart (exit code 93) on node ip-10-0-1-1: no progress over 3 cycles"
    )
    sick = view(job(), [pod(0, "Running"), exited(1, 94, "GPU 2: Xid 48 (double-bit ECC)")]).status()
    assert sick.cause.cause_class == CauseClass.node and sick.failed_nodes == ("ip-10-0-1-1",)
    assert (
        sick.cause.message == "node ip-10-0-1-1 is unhealthy (the node agent exited 94): GPU 2: Xid 48 (double-bit ECC)"
    )
    assert [e.type for e in sick.events if e.type.endswith("_failed")] == ["node_failed"]


def test_a_pod_being_evicted_is_preempted_before_it_ends():
    leaving = pod(
        1, "Running", conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]
    )
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    status = view(job(), [pod(0, "Running"), leaving]).status()
    assert status.phase == AttemptPhase.failed and status.cause.cause_class == CauseClass.preempted
    assert status.failed_nodes == () and [e.type for e in status.events] == ["scheduled", "preempted"]


def test_a_long_termination_message_is_shortened():
    status = view(job(), [pod(0, "Running"), exited(1, 94, "x" * 5000)]).status()
    assert len(status.cause.message) < 400 and status.cause.message.endswith("x" * 50)
