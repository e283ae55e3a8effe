"""How the Job controller is told what a pod's failure means (`podFailurePolicy`), hot spares, and Kueue.

Exit codes with a meaning of their own (the node agent's, ftplane/contract.py, and the image's
EFA check, deploy/docker/efa-check.sh):

    93  VERDICT         NVRx decided not to restart: FailJob, and no job-level restart either
    94  NODE_UNHEALTHY  this node must not be used again: the node is blamed (a job restart without it)
    78  IMAGE_BROKEN    the image cannot do what the pod asked (EFA without the OFI plugin): FailJob

Without spares the attempt is one Indexed Job with `backoffLimit: 0`: any pod failure ends it, and the
rules only make the Job's own verdict say why (93 and 78 FailJob; 94 and a disruption Count). With
`resiliency.spare_nodes: N` the Job runs `nodes + N` pods (ft_launcher keeps `nodes` active, the rest
standing by) with `backoffLimitPerIndex: 0` and `maxFailedIndexes: N`: a pod lost to its node (94, a
DisruptionTarget: an eviction, a drain, a lost node) fails only its index and a spare takes its place
in-job; any other failure fails the Job. The N+1st lost node fails the Job (MaxFailedIndexesExceeded):
the spares are spent, and the job restarts with new pods (and N fresh spares) without the nodes lost.

With a `queue`, the Job is created suspended and labelled for Kueue, which admits it by unsuspending it.
"""

from __future__ import annotations

from typing import Any

from api.schemas.spec import JobSpec
from ftplane.contract import NODE_UNHEALTHY, VERDICT

IMAGE_BROKEN = 78
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
EFA_CHECK_CONTAINER = "efa-check"


def pod_count(spec: JobSpec) -> int:
    """The attempt's pods: one per node, and the hot spares."""
    return spec.nodes + spec.resiliency.spare_nodes


def failure_policy(spec: JobSpec, *, container: str, efa_check: bool) -> dict[str, Any]:
    """The Job spec's completion, backoff and podFailurePolicy fields.

    A disrupted pod (eviction, drain, spot interruption: the DisruptionTarget condition) is counted, not ignored
    as Kubeflow's trainer does: `Ignore` would have the Job controller recreate the pod with no bound at all, while
    the other pods' launchers wait for it in the rendezvous. Here the attempt fails and the control plane restarts
    the job from its own bounded preemption budget (`resiliency.max_preemptions`, cause `preempted`, never
    `max_job_restarts`); with spares, the lost index fails alone and a spare takes its place."""
    spares = spec.resiliency.spare_nodes
    node_lost = "FailIndex" if spares else "Count"
    rules: list[dict[str, Any]] = [
        {"action": "FailJob", "onExitCodes": {"containerName": container, "operator": "In", "values": [VERDICT]}}
    ]
    if efa_check:
        check = {"containerName": EFA_CHECK_CONTAINER, "operator": "In", "values": [IMAGE_BROKEN]}
        rules.append({"action": "FailJob", "onExitCodes": check})
    rules += [
        {"action": node_lost, "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": node_lost, "onExitCodes": {"operator": "In", "values": [NODE_UNHEALTHY]}},
    ]
    out: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": pod_count(spec),
        "parallelism": pod_count(spec),
    }
    if spares:
        # anything else a pod dies of is the program's: the Job fails (no spare is spent on it)
        others = {"containerName": container, "operator": "NotIn", "values": [VERDICT, NODE_UNHEALTHY]}
        rules.append({"action": "FailJob", "onExitCodes": others})
        out.update(backoffLimitPerIndex=0, maxFailedIndexes=spares)
        out["successPolicy"] = {"rules": [{"succeededCount": spec.nodes}]}
    else:
        out["backoffLimit"] = 0  # any pod failure fails the attempt; restarts are the control plane's decision
    out["podFailurePolicy"] = {"rules": rules}
    return out


def queue_fields(spec: JobSpec) -> tuple[dict[str, str], dict[str, Any]]:
    """(the Job's extra labels, its extra spec fields) for Kueue: suspended, labelled with the LocalQueue."""
    if not spec.queue:
        return {}, {}
    return {QUEUE_LABEL: spec.queue}, {"suspend": True}
