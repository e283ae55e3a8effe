"""An attempt that waits in a Kueue queue: what its suspended Job and its Workload say.

The attempt's Job is created suspended with the LocalQueue's label (`policy.queue_fields`); Kueue makes a
Workload for it and admits it by unsuspending the Job. So:
- suspended, never admitted: `waiting` (pending, with Kueue's reason, e.g. "insufficient unused quota"),
  reported once as a `queued` event with `queue_state: waiting`; no pending timeout runs meanwhile (the job's
  `resiliency.queued_timeout_s` does). A Workload Kueue can never admit as its ClusterQueue stands (a resource
  it does not cover, a request beyond its quota, a LocalQueue or ClusterQueue that does not exist: Kueue's
  words in the QuotaReserved condition, INADMISSIBLE) is reported once more, `inadmissible: true` with Kueue's
  reason, so people can fix the queue (or the spec) rather than wait;
- unsuspended: `admitted`, reported once as a `queued` event with `queue_state: admitted` (the pending
  timeout counts from then);
- suspended again after its admission (the Workload evicted: preempted by a higher-priority workload,
  or its pods not ready in time): `preempted`, a failure of the attempt with a preempted cause, which
  restarts the job from the preemption budget. The new attempt queues again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from api.schemas.causes import Cause, CauseClass
from workers.backends.base import ObservedEvent
from workers.backends.kubernetes.failures import cause
from workers.backends.kubernetes.objects import condition

WORKLOAD_GROUP, WORKLOAD_PLURAL = "kueue.x-k8s.io", "workloads"
# Kueue's words for a Workload its ClusterQueue can never admit (pkg/scheduler/flavorassigner), and its reason for
# a Workload whose queue does not exist.
INADMISSIBLE = ("unavailable in ClusterQueue", "request > maximum capacity", "doesn't exist")
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
NO_KUEUE = "no Kueue in this cluster (the Workload API is not served): nothing will admit the Job"


@dataclass(frozen=True)
class QueueState:
    state: Literal["waiting", "admitted", "preempted"]
    cause: Cause | None
    event: ObservedEvent | None
    inadmissible: ObservedEvent | None = None


def suspended(job: dict[str, Any]) -> bool:
    return bool((job.get("spec") or {}).get("suspend"))


def queue_state(
    job: dict[str, Any], workload: dict[str, Any] | None, *, queue: str, kueue_missing: bool = False
) -> QueueState:
    """Where a queued attempt's Job stands with Kueue. `workload`: its Workload (None when not made or not read)."""
    uid = job["metadata"].get("uid", job["metadata"]["name"])
    if not suspended(job):
        started = (job.get("status") or {}).get("startTime")
        details = {"queue": queue, "queue_state": "admitted", "cause": f"admitted by Kueue from LocalQueue {queue}"}
        if started:
            details["ts"] = started
        admission = ((workload or {}).get("status") or {}).get("admission") or {}
        if admission.get("clusterQueue"):
            details["cluster_queue"] = admission["clusterQueue"]
        return QueueState("admitted", None, ObservedEvent(key=f"k8s:{uid}:admitted", type="queued", details=details))
    evicted = condition(workload or {}, "Evicted") or condition(workload or {}, "Preempted")
    if evicted is not None:
        reason = evicted.get("reason") or "Evicted"
        said = evicted.get("message") or "the Workload was evicted"
        text = f"preempted by Kueue in LocalQueue {queue} ({reason}): {said}"
        return QueueState("preempted", cause(CauseClass.preempted, text, reason=f"Kueue{reason}"), None)
    if kueue_missing:
        why = NO_KUEUE + "; remove `queue` from the spec, or install Kueue"
    elif workload is None:
        why = "waiting for Kueue to create the Job's Workload"
    else:
        conditions = (workload.get("status") or {}).get("conditions") or []
        reserved: dict[str, Any] = next((c for c in conditions if c.get("type") == "QuotaReserved"), {})
        why = reserved.get("message") or "waiting for quota"
    text = f"queued in LocalQueue {queue}: {why}"
    details = {"queue": queue, "queue_state": "waiting", "cause": text, "cause_class": CauseClass.scheduling.value}
    event = ObservedEvent(key=f"k8s:{uid}:queued", type="queued", details=details)
    never = None
    if workload is not None and (reserved.get("reason") == "Inadmissible" or any(w in why for w in INADMISSIBLE)):
        text = f"queued in LocalQueue {queue}, which cannot admit it as it stands: {why}"
        said = {**details, "cause": text, "inadmissible": True, "kueue_reason": reserved.get("reason") or "Pending"}
        never = ObservedEvent(key=f"k8s:{uid}:inadmissible", type="queued", details=said)
    return QueueState("waiting", cause(CauseClass.scheduling, text, reason="Queued"), event, never)
