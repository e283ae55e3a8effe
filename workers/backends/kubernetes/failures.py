"""What one pod's failure means: its `Cause` (class and facts, the sentence people read) and whether its node
is to blame, as a `Failure` that becomes an idempotent `rank_failed` or `node_failed` event.

The class is set here, where Kubernetes' reason is known: crash for an exit code
or an OOM kill (with the exit code, and the signal a code above 128 stands for),
node for a node lost, unresponsive or refusing the pod, preempted for an
eviction, a graceful node shutdown or the scheduler making room, other for a pod
deleted or failed without saying why.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from api.schemas.causes import Cause, CauseClass, signal_name
from workers.backends.base import ObservedEvent
from workers.backends.kubernetes.objects import condition, iso, trainer_status

# Why a pod or its node went away, as Kubernetes words it.
NODE_LEVEL_POD_REASONS = frozenset(
    {"Evicted", "NodeLost", "Shutdown", "Terminated", "NodeShutdown", "UnexpectedAdmissionError"}
)
NODE_LEVEL_DISRUPTIONS = frozenset({"DeletionByTaintManager", "DeletionByPodGC", "TerminationByKubelet"})
NODE_LOSS_EVENT_REASONS = ("NodeNotReady", "NodeLost", "NodeShutdown", "TaintManagerEviction")
# Of those, the ones where the node was taken away on purpose (a node-pressure eviction, a graceful
# node shutdown for a drain or a spot interruption, the scheduler making room): the attempt was
# preempted. Any other node-level reason says the node itself was lost or broken.
PREEMPTION_REASONS = frozenset(
    {"Evicted", "Shutdown", "Terminated", "NodeShutdown", "TerminationByKubelet", "PreemptionByScheduler"}
)


def cause(cause_class: CauseClass, message: str, **facts: Any) -> Cause:
    """A cause with the facts that are known (those given as None are left out)."""
    return Cause(cause_class, message, {k: v for k, v in facts.items() if v is not None})


def node_cause_class(reason: str) -> CauseClass:
    """The class of a node-level failure, by Kubernetes' reason for it."""
    return CauseClass.preempted if reason in PREEMPTION_REASONS else CauseClass.node


def exit_signal(code: int | None) -> str | None:
    """The signal a container's exit code says ended it: container runtimes report 128 + its number."""
    if code is None or not 128 < code <= 128 + 64:
        return None
    return signal_name(code - 128)


@dataclass
class Failure:
    """A pod of the attempt that failed or went away, and why (`cause.facts["reason"]`: Kubernetes' word)."""

    pod: str
    uid: str
    index: int | None
    node: str | None
    cause: Cause
    node_level: bool
    at: datetime | None = None

    @property
    def reason(self) -> str:
        return str(self.cause.facts["reason"])

    def event(self) -> ObservedEvent:
        details: dict[str, Any] = {**self.cause.details(), "pod": self.pod}
        if self.index is not None:
            details["node_rank"] = self.index
        if self.at:
            details["ts"] = iso(self.at)
        if self.node_level:
            key, kind = f"k8s:{self.uid}:node_failed", "node_failed"
        else:
            key, kind = f"k8s:{self.uid}:{self.reason}", "rank_failed"
        return ObservedEvent(key=key, type=kind, node=self.node, details=details)


def node_loss_event(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The most telling Event of a node going away (NodeNotReady says more than the eviction after it)."""
    found = [ev for ev in events if ev.get("reason") in NODE_LOSS_EVENT_REASONS]
    return min(found, key=lambda ev: NODE_LOSS_EVENT_REASONS.index(ev["reason"]), default=None)


def pod_cause(
    pod: dict[str, Any], node: str | None, *, injected: bool, loss: dict[str, Any] | None
) -> tuple[Cause, bool] | None:
    """Why a pod still listed failed, and whether its node is to blame; None while it has not failed.

    `injected`: an injected node_loss fault deleted it; `loss`: its `node_loss_event`, if any.
    """
    meta, status = pod["metadata"], pod.get("status", {})
    name = meta["name"]
    on_node = f" on node {node}" if node else ""
    pod_phase = status.get("phase")
    disruption = condition(pod, "DisruptionTarget") or {}
    disruption_reason = disruption.get("reason", "")
    term = (trainer_status(pod).get("state") or {}).get("terminated")

    if injected:
        return injected_loss(name, node), True
    if pod_phase == "Failed":
        reason = status.get("reason") or ""
        message = status.get("message") or disruption.get("message") or ""
        if reason == "Evicted":
            text = f"pod evicted{on_node}: {message}".rstrip(": ")
            return cause(CauseClass.preempted, text, node=node, reason="Evicted"), True
        if reason in NODE_LEVEL_POD_REASONS or disruption_reason in NODE_LEVEL_DISRUPTIONS:
            why = reason or disruption_reason
            text = f"node {node or '?'} failed ({why}): {message}".rstrip(": ")
            return cause(node_cause_class(why), text, node=node, reason=why), True
        if term:
            code = term.get("exitCode")
            treason = term.get("reason") or ""
            shown = f" ({treason})" if treason and treason not in ("Error", "Completed") else ""
            text = f"exit code {code}{shown}{on_node}"
            cls = CauseClass.crash
            if disruption_reason == "PreemptionByScheduler":
                text += " (preempted by a higher-priority pod)"
                cls = CauseClass.preempted
            facts = {"node": node, "reason": treason or "Error", "exit_code": code, "signal": exit_signal(code)}
            return cause(cls, text, **facts), False
        said = f": {reason} {message}".rstrip() if reason or message else ""
        text = f"pod {name} failed{on_node}{said}"
        return cause(CauseClass.other, text, node=node, reason=reason or "Failed"), False
    if pod_phase == "Unknown":
        text = f"node {node or '?'} stopped responding (pod {name} is in phase Unknown)"
        return cause(CauseClass.node, text, node=node, reason="NodeLost"), True
    if meta.get("deletionTimestamp") and (disruption_reason in NODE_LEVEL_DISRUPTIONS or loss):
        why = disruption_reason or (loss or {}).get("reason", "NodeLost")
        text = f"node {node or '?'} lost ({why}): pod {name} is being deleted"
        return cause(node_cause_class(why), text, node=node, reason="NodeLost"), True
    return None


def injected_loss(name: str, node: str | None) -> Cause:
    """A pod an injected node_loss fault deleted: its node counts as lost."""
    text = f"node {node or '?'} lost: pod {name} deleted by an injected node_loss fault"
    return cause(CauseClass.node, text, node=node, reason="NodeLost")


def vanished_cause(name: str, node: str | None, loss: dict[str, Any] | None) -> tuple[Cause, bool]:
    """A pod no longer listed: its node was lost when an Event says so, else it was deleted (not the node's fault)."""
    if loss:
        said = loss.get("message") or "pod deleted"
        text = f"node {node or '?'} lost ({loss.get('reason')}): {said}"
        return cause(node_cause_class(loss["reason"]), text, node=node, reason="NodeLost"), True
    text = f"pod {name}{' on node ' + node if node else ''} was deleted before it finished"
    return cause(CauseClass.other, text, node=node, reason="Deleted"), False
