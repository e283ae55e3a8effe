"""Why an attempt is not running yet, named from its pods' conditions and Events: a `scheduling` cause, and
whether Kubernetes may still get there (pending) or cannot (failed).

In order of what says most:
1. an image that can never be used (InvalidImageName, ErrImageNeverPull): failed at once;
2. a container Kubernetes keeps failing to start: an image it cannot pull (ErrImagePull,
   ImagePullBackOff), a configuration it cannot build (CreateContainerConfigError: a Secret or key of
   `secret_env` that is not there), CreateContainerError, RunContainerError: pending, failed once it has
   lasted `image_pull_grace_s`;
3. a volume that cannot be mounted (FailedMount: e.g. an FSx file system the nodes cannot reach): pending,
   with the kubelet's words, until the pending timeout;
4. no node fits (Unschedulable): pending with the scheduler's words, and the nodes this job excluded when
   the scheduler says that affinity ruled nodes out;
5. pods that cannot be created (FailedCreate on the Job: a quota, an admission webhook);
6. otherwise, how far it got: pods created, bound, running.

A pod that no node can ever fit fails the attempt (`unsatisfiable`), not only after `pending_timeout_s`:
- with an autoscaler: Unschedulable for UNSATISFIABLE_AFTER_S, and it said no node it could add would take the
  pod either: Karpenter's FailedScheduling Event ("incompatible with nodepool ..., no instance type satisfied
  resources ...", kubernetes-sigs/karpenter pkg/controllers/provisioning/scheduling) or cluster-autoscaler's
  NotTriggerScaleUp ("pod didn't trigger scale-up: ...");
- without one (no Event from Karpenter or cluster-autoscaler on the pod after UNSATISFIABLE_ALONE_S, though
  the scheduler's own FailedScheduling is there: its Events were read): the scheduler's word is the last, and
  it counts when it says that no node could hold the pod even empty, for a resource the pod requests. Either
  in so many words (kube-scheduler 1.34+, kubernetes/kubernetes#131345: every node "Preemption is not helpful
  for scheduling", with an "Insufficient R" among the reasons), or, where it cannot tell a full node from a
  small one (up to 1.33 a node short of R is "No preemption victims found" either way), from the nodes
  themselves: every node is refused for good ("not helpful": a taint, the selector) or short of R, and none of
  the nodes of the spec's labels (all read) allocates as much R as one pod requests. A node short of R only
  because other pods hold it never counts: they may end. An autoscaler that is acting (it launched or
  nominated a node) is waited for.
The cause names the resources at fault: huge pages first (no Karpenter instance type offers them), else those
the scheduler found insufficient.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from kubernetes.utils import quantity

from api.schemas.causes import Cause, CauseClass
from workers.backends.kubernetes.failures import cause
from workers.backends.kubernetes.nodes import NodeState
from workers.backends.kubernetes.objects import parse_ts, phase, true_conditions, waiting_reason

IMAGE_ERRORS_PERMANENT = frozenset({"InvalidImageName", "ErrImageNeverPull"})
# Waiting reasons that may clear up by themselves (a registry hiccup, a Secret or PVC not there yet).
STUCK_WAITING_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
MAX_NAMED_EXCLUSIONS = 5
UNSATISFIABLE = "Unsatisfiable"  # the reason of a scheduling cause no retry can help (the ladder gives up)
UNSATISFIABLE_AFTER_S = 30.0
UNSATISFIABLE_ALONE_S = 60.0  # Unschedulable this long with no autoscaler's Event: the scheduler's word is the last
AUTOSCALERS = ("karpenter", "cluster-autoscaler")
_INSUFFICIENT = re.compile(r"Insufficient ([\w./-]+)")
_NODES_REFUSED = re.compile(r"^0/(\d+) nodes are available: (.*?)\.(?: preemption: 0/\d+ nodes are available: (.*))?$")
_COUNTED_INSUFFICIENT = re.compile(r"(\d+) Insufficient ([\w./-]+)")
_NOT_HELPFUL = re.compile(r"(\d+) Preemption is not helpful for scheduling")


def excluded_nodes(job: Mapping[str, Any]) -> list[str]:
    """The nodes the attempt's Job keeps out (its `matchFields metadata.name NotIn`)."""
    affinity = (((job.get("spec") or {}).get("template") or {}).get("spec") or {}).get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    out: list[str] = []
    for term in required.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "NotIn":
                out += field.get("values") or []
    return out


def stuck(pods: Iterable[dict[str, Any]], *, image: str, now: datetime, grace_s: float) -> tuple[bool, Cause] | None:
    """A pod whose container cannot start: (fail the attempt?, cause)."""
    for pod in pods:
        if phase(pod) != "Pending":
            continue
        reason, message = waiting_reason(pod)
        node = pod.get("spec", {}).get("nodeName")
        if reason in IMAGE_ERRORS_PERMANENT:
            text = f"image {image} cannot be used ({reason}): {message}".rstrip(": ")
            return True, cause(CauseClass.scheduling, text, node=node, reason=reason)
        if reason in STUCK_WAITING_REASONS:
            bound = [parse_ts(c.get("lastTransitionTime")) for c in true_conditions(pod, "PodScheduled")]
            since = next((t for t in bound if t), None) or parse_ts(pod["metadata"].get("creationTimestamp"))
            waited = (now - (since or now)).total_seconds()
            if "Image" in reason:
                what = f"image {image} cannot be pulled"
            elif reason == "CreateContainerConfigError":
                what = "the container's configuration cannot be built (a Secret or ConfigMap it names?)"
            else:
                what = "the container cannot be created"
            detail = f"{what} ({reason}): {message}".rstrip(": ")
            if waited >= grace_s:
                text = f"{detail}; still failing after {waited:.0f} s"
                return True, cause(CauseClass.scheduling, text, node=node, reason=reason)
            return False, cause(CauseClass.scheduling, f"{detail}; Kubernetes keeps retrying", node=node, reason=reason)
    return None


def waiting_cause(
    job: Mapping[str, Any],
    pods: list[dict[str, Any]],
    pod_events: Mapping[str, list[dict[str, Any]]],
    job_events: list[dict[str, Any]],
    *,
    expected: int,
    needed: int,
    running: int,
) -> Cause:
    """What a pending attempt waits for (`expected` pods, `needed` of them running to train)."""
    progress = f"{running}/{needed} pods running"
    mount = _mount_failure(pods, pod_events)
    if mount is not None:
        node, message = mount
        text = f"a volume cannot be mounted on node {node} (FailedMount), {progress}: {message}"
        return cause(CauseClass.scheduling, text, node=node, reason="FailedMount")
    for pod in pods:
        for cond in pod.get("status", {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                why = cond.get("message") or cond.get("reason")
                text = f"waiting for nodes ({progress}): {why}"
                kept_out = excluded_nodes(job)
                if kept_out and "affinity" in str(why):
                    named = ", ".join(kept_out[:MAX_NAMED_EXCLUSIONS]) + (
                        "..." if len(kept_out) > MAX_NAMED_EXCLUSIONS else ""
                    )
                    text += (
                        f"; {len(kept_out)} node(s) are excluded after failures of this job ({named}): if too few "
                        "other nodes fit, the attempt stays pending until resiliency.pending_timeout_s ends it"
                    )
                return cause(CauseClass.scheduling, text, reason=cond.get("reason"))
    for ev in reversed(job_events):
        if ev.get("reason") == "FailedCreate":
            return cause(CauseClass.scheduling, f"pods cannot be created: {ev.get('message')}", reason="FailedCreate")
    created = len(pods)
    if created < expected:
        return cause(CauseClass.scheduling, f"{created}/{expected} pods created")
    bound = sum(1 for p in pods if p.get("spec", {}).get("nodeName"))
    if bound < needed:
        return cause(CauseClass.scheduling, f"waiting for the scheduler ({bound}/{needed} pods bound to nodes)")
    return cause(CauseClass.scheduling, f"containers starting ({progress})")


def _mount_failure(
    pods: list[dict[str, Any]], pod_events: Mapping[str, list[dict[str, Any]]]
) -> tuple[str, str] | None:
    """(node, the kubelet's words) of a pending pod whose volumes cannot be mounted."""
    for pod in pods:
        if phase(pod) != "Pending" or not pod.get("spec", {}).get("nodeName"):
            continue
        mounts = [ev for ev in pod_events.get(pod["metadata"]["name"], []) if ev.get("reason") == "FailedMount"]
        if mounts:
            setup = [ev for ev in mounts if str(ev.get("message", "")).startswith("MountVolume")]
            chosen = (setup or mounts)[-1]
            return str(pod["spec"]["nodeName"]), " ".join(str(chosen.get("message") or "").split())
    return None


def _autoscaler_refusal(events: list[dict[str, Any]]) -> str | None:
    """What Karpenter or cluster-autoscaler said when no node they could add would take the pod."""
    for ev in reversed(events):
        message = " ".join(str(ev.get("message") or "").split())
        source = (ev.get("source") or {}).get("component") or ev.get("reportingComponent") or ""
        if ev.get("reason") == "FailedScheduling" and "karpenter" in source and "no instance type satisfied" in message:
            return message
        if ev.get("reason") == "NotTriggerScaleUp":
            return message
    return None


def _autoscaled(events: list[dict[str, Any]]) -> bool:
    """Whether an autoscaler said anything of the pod (it exists, and has the last word: refused, or acting)."""
    for ev in events:
        source = str((ev.get("source") or {}).get("component") or ev.get("reportingComponent") or "")
        if any(name in source for name in AUTOSCALERS) or ev.get("reason") in ("TriggeredScaleUp", "NotTriggerScaleUp"):
            return True
    return False


def _requests(pod: dict[str, Any]) -> dict[str, Decimal]:
    """What one pod requests of a node, by resource (its containers' requests summed)."""
    out: dict[str, Decimal] = {}
    for c in pod.get("spec", {}).get("containers") or []:
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            out[k] = out.get(k, Decimal(0)) + _quantity(v)
    return out


def never_fits(message: str, requested: Mapping[str, Decimal], nodes: Mapping[str, NodeState]) -> list[str]:
    """The requested resources no node could give the pod even empty, by the scheduler's `message` (its
    FailedScheduling words) and, where it cannot tell, the `nodes`' allocatable; [] when it may still fit."""
    found = _NODES_REFUSED.match(" ".join(message.split()))
    if found is None:
        return []
    total = int(found.group(1))
    short = {res: int(n) for n, res in _COUNTED_INSUFFICIENT.findall(found.group(2)) if res in requested}
    if not short or total == 0:
        return []
    not_helpful = sum(int(n) for n in _NOT_HELPFUL.findall(found.group(3) or ""))
    if not_helpful >= total:
        return sorted(short)  # 1.34+: every node refused for good, some for want of these
    # Up to 1.33: the nodes short of R are refused for good when even the largest of them allocates less than one
    # pod asks (they passed the spec's node selector: they are among `nodes`, which must all have been read).
    return sorted(
        res
        for res, n in short.items()
        if n + not_helpful >= total
        and len(nodes) >= n
        and all(_quantity(dict(s.allocatable).get(res, "0")) < requested[res] for s in nodes.values())
    )


def _quantity(text: object) -> Decimal:
    """A Kubernetes quantity ("5120Mi", "190", "500m") as a number."""
    value: Decimal = quantity.parse_quantity(text)  # type: ignore[no-untyped-call]
    return value


def unschedulable_since(pod: dict[str, Any]) -> datetime | None:
    """When the pod became Unschedulable (None: it is not, or is bound, or not Pending)."""
    if phase(pod) != "Pending" or pod.get("spec", {}).get("nodeName"):
        return None
    conditions = pod.get("status", {}).get("conditions") or []
    cond: dict[str, Any] = next((c for c in conditions if c.get("type") == "PodScheduled"), {})
    if cond.get("status") != "False" or cond.get("reason") != "Unschedulable":
        return None
    return parse_ts(cond.get("lastTransitionTime"))


def unsatisfiable(
    pods: Iterable[dict[str, Any]],
    pod_events: Mapping[str, list[dict[str, Any]]],
    *,
    now: datetime,
    nodes: Mapping[str, NodeState] | None = None,
) -> Cause | None:
    """A pod no node can ever fit (see the module's docstring), or None. `nodes`: the states of the nodes of the
    spec's labels, their allocatable read (for a scheduler that cannot tell a full node from a small one)."""
    for pod in pods:
        since = unschedulable_since(pod)
        if since is None:
            continue
        waited = (now - since).total_seconds()
        if waited < UNSATISFIABLE_AFTER_S:
            continue
        conditions = pod.get("status", {}).get("conditions") or []
        cond: dict[str, Any] = next((c for c in conditions if c.get("type") == "PodScheduled"), {})
        events = pod_events.get(pod["metadata"]["name"], [])
        requested = _requests(pod)
        refusal = _autoscaler_refusal(events)
        if refusal is not None:
            named = sorted(r for r in requested if r.startswith("hugepages-")) or sorted(
                set(_INSUFFICIENT.findall(str(cond.get("message")))) & set(requested)
            )
        else:
            scheduler_said = any(ev.get("reason") == "FailedScheduling" for ev in events)  # its Events were read
            if waited < UNSATISFIABLE_ALONE_S or not scheduler_said or _autoscaled(events):
                continue
            named = never_fits(str(cond.get("message") or ""), requested, nodes or {})
            if not named:
                continue
            refusal = (
                f"the scheduler says {cond.get('message')} and no autoscaler (Karpenter, cluster-autoscaler) said "
                f"anything of the pod in {waited:.0f} s: no node would be added"
            )
        what = ", ".join(named) or "what it requests"
        hint = ""
        if any(r.startswith("hugepages-") for r in named):
            hint = (
                "; no Karpenter instance type offers huge pages: remove resources.hugepages, or run on a node group "
                "whose nodes allocate them"
                if _autoscaled(events)
                else "; no node allocates that many huge pages: remove resources.hugepages, or add nodes whose launch "
                "template reserves them"
            )
        text = f"no node can ever fit these pods ({what}): {refusal}{hint}"
        return cause(CauseClass.scheduling, text, reason=UNSATISFIABLE, resources=named or None)
    return None
