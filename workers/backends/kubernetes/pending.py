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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from api.schemas.causes import Cause, CauseClass
from workers.backends.kubernetes.failures import cause
from workers.backends.kubernetes.objects import parse_ts, phase, true_conditions, waiting_reason

IMAGE_ERRORS_PERMANENT = frozenset({"InvalidImageName", "ErrImageNeverPull"})
# Waiting reasons that may clear up by themselves (a registry hiccup, a Secret or PVC not there yet).
STUCK_WAITING_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
MAX_NAMED_EXCLUSIONS = 5


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
