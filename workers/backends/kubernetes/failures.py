"""What one pod's failure means: its `Cause` (class and facts, the sentence people read), whether its node is to
blame, and whether a hot spare can take its place, as a `PodFailure` that becomes an idempotent event.

The class is set here, where Kubernetes' reason is known:
- crash: an exit code or an OOM kill (with the exit code, and the signal a code above 128 stands for);
- verdict: the node agent's exit 93, NVRx decided not to restart (the job fails, no job-level restart);
- node: the node agent's exit 94 (the node is unhealthy), a node lost, unresponsive or refusing the pod,
  a Node condition saying it is broken (`nodes`), no EFA device or provider (the EFA check's 94);
- other: a node-pressure eviction for disk the job itself used beyond its ephemeral-storage request (the
  kubelet names the container): the job's doing, not the node's (no node blamed, no preemption budget);
- preempted: a disruption (DisruptionTarget) that took the pod away on purpose: the Eviction API (a
  drain, Karpenter replacing or reclaiming the node, a spot interruption), the scheduler making room, the
  kubelet's node-pressure eviction or graceful node shutdown. Whatever exit code the container had then
  (143 after SIGTERM), the pod was preempted, not crashed;
- launch: the image cannot do what the pod asked (the EFA check's 78: no aws-ofi-nccl plugin);
- other: a pod deleted or failed without saying why.

A failure blames its node (`node_level`) when the node itself is at fault, or was taken away by its own
kubelet; evictions through the API and the scheduler's preemptions do not blame it (the node is fine,
and being drained it takes no new pods anyway). A hot spare replaces what the Job's policy fails only
the index for (`spare_ok`): the node agent's 94, and any disruption (policy.failure_policy).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from api.schemas.causes import Cause, CauseClass, signal_name
from ftplane.contract import NODE_UNHEALTHY, VERDICT
from workers.backends.base import ObservedEvent
from workers.backends.kubernetes.objects import condition, init_failure, iso, trainer_status
from workers.backends.kubernetes.policy import IMAGE_BROKEN

# Why a pod or its node went away, as Kubernetes words it.
NODE_LEVEL_POD_REASONS = frozenset(
    {"Evicted", "NodeLost", "Shutdown", "Terminated", "NodeShutdown", "UnexpectedAdmissionError"}
)
NODE_LOSS_DISRUPTIONS = frozenset({"DeletionByTaintManager", "DeletionByPodGC"})
NODE_LOSS_EVENT_REASONS = ("NodeNotReady", "NodeLost", "NodeShutdown", "TaintManagerEviction")
# Disruptions that take a pod away on purpose, in words; the kubelet's blame its node (node pressure,
# a node shutting down), the others do not.
PREEMPTIONS = {
    "EvictionByEvictionAPI": "evicted through the Eviction API (a drain, or the node being replaced or reclaimed)",
    "PreemptionByScheduler": "preempted by a higher-priority pod",
    "TerminationByKubelet": "terminated by its kubelet (node pressure or a node shutdown)",
}
BLAMING_PREEMPTIONS = frozenset({"TerminationByKubelet"})
# Of the node-level pod reasons, the ones where the node was taken away on purpose: preempted.
PREEMPTION_REASONS = frozenset({"Evicted", "Shutdown", "Terminated", "NodeShutdown", "TerminationByKubelet"})
MAX_MESSAGE = 300  # of a container's termination message, in a cause


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


def said(term: dict[str, Any]) -> str:
    """The container's termination message (or its last output line), shortened, as ': <text>'."""
    text = " ".join(str(term.get("message") or "").split())
    if len(text) > MAX_MESSAGE:
        text = "..." + text[-MAX_MESSAGE:]
    return f": {text}" if text else ""


@dataclass
class PodFailure:
    """A pod of the attempt that failed or went away, and why (`cause.facts["reason"]`: Kubernetes' word)."""

    pod: str
    uid: str
    index: int | None
    node: str | None
    cause: Cause
    node_level: bool
    at: datetime | None = None
    spare_ok: bool = False  # a hot spare takes its place (the Job fails only its index)

    @property
    def reason(self) -> str:
        return str(self.cause.facts.get("reason", "Failed"))

    def event(self) -> ObservedEvent:
        details: dict[str, Any] = {**self.cause.details(), "pod": self.pod}
        if self.index is not None:
            details["node_rank"] = self.index
        if self.at:
            details["ts"] = iso(self.at)
        if self.cause.cause_class == CauseClass.preempted:
            key, kind = f"k8s:{self.uid}:preempted", "preempted"
        elif self.node_level and self.reason == "NodeUnhealthy" and "condition" in self.cause.facts:
            key, kind = f"k8s:{self.uid}:node_unhealthy", "node_unhealthy"
        elif self.node_level:
            key, kind = f"k8s:{self.uid}:node_failed", "node_failed"
        else:
            key, kind = f"k8s:{self.uid}:{self.reason}", "rank_failed"
        return ObservedEvent(key=key, type=kind, node=self.node, details=details)


def node_loss_event(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The most telling Event of a node going away (NodeNotReady says more than the eviction after it)."""
    found = [ev for ev in events if ev.get("reason") in NODE_LOSS_EVENT_REASONS]
    return min(found, key=lambda ev: NODE_LOSS_EVENT_REASONS.index(ev["reason"]), default=None)


@dataclass(frozen=True)
class Verdict:
    """What a pod's failure says: its cause, whether its node is blamed, whether a spare can replace it."""

    cause: Cause
    node_level: bool
    spare_ok: bool = False


def pod_cause(pod: dict[str, Any], node: str | None, *, loss: dict[str, Any] | None) -> Verdict | None:
    """Why a pod still listed failed; None while it has not failed. `loss`: its `node_loss_event`, if any."""
    meta, status = pod["metadata"], pod.get("status", {})
    name = meta["name"]
    on_node = f" on node {node}" if node else ""
    pod_phase = status.get("phase")
    disruption = condition(pod, "DisruptionTarget") or {}
    disruption_reason = disruption.get("reason", "")
    term = (trainer_status(pod).get("state") or {}).get("terminated")

    if pod_phase == "Failed":
        init = init_failure(pod)
        if init is not None:
            return _init_verdict(*init, name=name, node=node)
        reason = status.get("reason") or ""
        message = status.get("message") or disruption.get("message") or ""
        if reason == "Evicted" and _used_beyond_its_request(message, "ephemeral-storage"):
            text = (
                f"pod evicted{on_node} for its own disk use: {message.strip()} The job's files (its logs, its "
                "ranks' output) outgrew its ephemeral storage request: raise resources.ephemeral_storage, or write "
                "less to the container's disk"
            )
            return Verdict(cause(CauseClass.other, text, node=node, reason="EvictedForStorage"), False, True)
        if reason == "Evicted":
            text = f"pod evicted{on_node}: {message}".rstrip(": ")
            return Verdict(cause(CauseClass.preempted, text, node=node, reason="Evicted"), True, True)
        if reason in NODE_LEVEL_POD_REASONS or disruption_reason in NODE_LOSS_DISRUPTIONS:
            why = reason or disruption_reason
            text = f"node {node or '?'} failed ({why}): {message}".rstrip(": ")
            return Verdict(cause(node_cause_class(why), text, node=node, reason=why), True, True)
        code = (term or {}).get("exitCode")
        if disruption_reason in PREEMPTIONS:
            shown = f" (exit code {code})" if code is not None else ""
            text = f"pod {name}{on_node} {PREEMPTIONS[disruption_reason]}{shown}"
            facts = {"node": node, "reason": disruption_reason, "exit_code": code, "signal": exit_signal(code)}
            return Verdict(cause(CauseClass.preempted, text, **facts), disruption_reason in BLAMING_PREEMPTIONS, True)
        if term:
            return _exit_verdict(term, node, on_node)
        said_ = f": {reason} {message}".rstrip() if reason or message else ""
        text = f"pod {name} failed{on_node}{said_}"
        return Verdict(cause(CauseClass.other, text, node=node, reason=reason or "Failed"), False)
    if pod_phase == "Unknown":
        text = f"node {node or '?'} stopped responding (pod {name} is in phase Unknown)"
        return Verdict(cause(CauseClass.node, text, node=node, reason="NodeLost"), True, True)
    if meta.get("deletionTimestamp"):
        if disruption_reason in NODE_LOSS_DISRUPTIONS or loss:
            why = disruption_reason or (loss or {}).get("reason", "NodeLost")
            text = f"node {node or '?'} lost ({why}): pod {name} is being deleted"
            return Verdict(cause(node_cause_class(why), text, node=node, reason="NodeLost"), True, True)
        if disruption_reason in PREEMPTIONS:
            text = f"pod {name}{on_node} {PREEMPTIONS[disruption_reason]}"
            facts = {"node": node, "reason": disruption_reason}
            return Verdict(cause(CauseClass.preempted, text, **facts), disruption_reason in BLAMING_PREEMPTIONS, True)
    return None


def _used_beyond_its_request(message: str, resource: str) -> bool:
    """The kubelet evicted the pod for `resource` pressure and names the trainer container as using more than it
    requested (the kubelet's evictionMessage names each container over its request): the job's own doing."""
    return f"low on resource: {resource}" in message and "Container trainer was using" in message


def _exit_verdict(term: dict[str, Any], node: str | None, on_node: str) -> Verdict:
    code = term.get("exitCode")
    treason = term.get("reason") or ""
    facts = {"node": node, "exit_code": code, "signal": exit_signal(code)}
    if code == VERDICT:
        text = f"NVRx decided not to restart (exit code {VERDICT}){on_node}{said(term)}"
        return Verdict(cause(CauseClass.verdict, text, reason="Verdict", **facts), False)
    if code == NODE_UNHEALTHY:
        text = f"node {node or '?'} is unhealthy (the node agent exited {NODE_UNHEALTHY}){said(term)}"
        return Verdict(cause(CauseClass.node, text, reason="NodeUnhealthy", **facts), True, True)
    shown = f" ({treason})" if treason and treason not in ("Error", "Completed") else ""
    text = f"exit code {code}{shown}{on_node}"
    return Verdict(cause(CauseClass.crash, text, reason=treason or "Error", **facts), False)


def _init_verdict(container: str, term: dict[str, Any], *, name: str, node: str | None) -> Verdict:
    code = term.get("exitCode")
    facts = {"node": node, "exit_code": code}
    if code == NODE_UNHEALTHY:
        text = f"node {node or '?'} cannot run the pod: its {container} check failed{said(term)}"
        return Verdict(cause(CauseClass.node, text, reason="NodeUnhealthy", **facts), True, True)
    if code == IMAGE_BROKEN:
        text = f"the image cannot run this pod: its {container} check failed (exit code {code}){said(term)}"
        return Verdict(cause(CauseClass.launch, text, reason="ImageMisconfigured", **facts), False)
    text = f"init container {container} of pod {name} exited {code}{' on node ' + node if node else ''}{said(term)}"
    return Verdict(cause(CauseClass.crash, text, reason="InitContainerFailed", **facts), False)


def vanished_cause(name: str, node: str | None, loss: dict[str, Any] | None) -> tuple[Cause, bool]:
    """A pod no longer listed: its node was lost when an Event says so, else it was deleted (not the node's fault)."""
    if loss:
        told = loss.get("message") or "pod deleted"
        text = f"node {node or '?'} lost ({loss.get('reason')}): {told}"
        return cause(node_cause_class(loss["reason"]), text, node=node, reason="NodeLost"), True
    text = f"pod {name}{' on node ' + node if node else ''} was deleted before it finished"
    return cause(CauseClass.other, text, node=node, reason="Deleted"), False
