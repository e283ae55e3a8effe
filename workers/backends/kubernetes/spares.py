"""Hot spares (`resiliency.spare_nodes`) as an attempt's reading reports them: the losses the spares absorbed
(`node_failed`, `preempted`, and `spares_exhausted` once the last one is in use), and the standbys that cannot
be placed or started while the active nodes run (`spare_unavailable`: a fact for people, never a failure)."""

from __future__ import annotations

from typing import Any

from api.schemas.causes import CauseClass
from workers.backends.base import ObservedEvent
from workers.backends.kubernetes.failures import PodFailure, cause
from workers.backends.kubernetes.objects import completion_index, waiting_reason


def spares_spent(
    spares: int, uid: str, failures: list[PodFailure], failing: dict[str, Any] | None
) -> list[ObservedEvent] | None:
    """The events of losses the spares absorbed; None when the attempt is over (no spares, a failure no spare
    replaces, or more losses than spares)."""
    if not spares or failing or not failures or any(not f.spare_ok for f in failures):
        return None
    lost = {f.index for f in failures}
    if len(lost) > spares:
        return None
    events = [f.event() for f in failures]
    if len(lost) == spares:
        nodes = sorted({f.node for f in failures if f.node})
        text = (
            f"all {spares} hot spare(s) are in use after losing node(s) {', '.join(nodes) or '?'}: the next node "
            "lost ends the attempt, and the job restarts with new pods (and fresh spares) without the nodes lost"
        )
        details = {**cause(CauseClass.node, text, reason="SparesExhausted").details(), "spares": spares, "nodes": nodes}
        events.append(ObservedEvent(key=f"k8s:{uid}:spares_exhausted", type="spares_exhausted", details=details))
    return events


def unavailable_spares(standbys: list[dict[str, Any]]) -> list[ObservedEvent]:
    """A standby pod that cannot be placed (the scheduler's reason) or started (its container's waiting reason),
    once per pod and reason."""
    out = []
    for pod in standbys:
        reason, message = waiting_reason(pod)
        if not reason:
            conditions = pod.get("status", {}).get("conditions") or []
            unscheduled: dict[str, Any] = next((c for c in conditions if c.get("type") == "PodScheduled"), {})
            if unscheduled.get("status") != "False":
                continue
            reason, message = str(unscheduled.get("reason") or "Unschedulable"), str(unscheduled.get("message"))
        name = pod["metadata"]["name"]
        text = f"hot spare {name} is not available ({reason}): {message}".rstrip(": ")
        details = {
            **cause(CauseClass.scheduling, text, reason=reason).details(),
            "pod": name,
            "node_rank": completion_index(pod),
        }
        key = f"k8s:{pod['metadata'].get('uid', name)}:spare_unavailable:{reason}"
        node = pod.get("spec", {}).get("nodeName")
        out.append(ObservedEvent(key=key, type="spare_unavailable", node=node, details=details))
    return out
