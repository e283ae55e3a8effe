"""What one reading of an attempt (its Job, pods and Events) means: an `AttemptStatus` with a structured cause.

`AttemptView` decides the phase (pending, running, succeeded, failed), reports
`scheduled` and `running` once every pod got there, and, for a failure, which
pod's failure is the cause (`failures`): a lost or evicted node explains the
ranks that failed after it, so node-level failures come first, then the
earliest. What keeps pods from starting (unschedulable, refused, an image that
cannot be pulled) is a `scheduling` cause: pending while Kubernetes may still
succeed, failed once it cannot.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from api.schemas.causes import Cause, CauseClass
from api.schemas.spec import JobSpec
from workers.backends.base import AttemptPhase, AttemptStatus, ObservedEvent
from workers.backends.kubernetes.failures import (
    Failure,
    cause,
    injected_loss,
    node_loss_event,
    pod_cause,
    vanished_cause,
)
from workers.backends.kubernetes.objects import (
    completion_index,
    condition,
    event_time,
    injected_node_loss,
    iso,
    parse_ts,
    phase,
    started_at,
    trainer_status,
    true_conditions,
)

IMAGE_ERRORS_PERMANENT = frozenset({"InvalidImageName", "ErrImageNeverPull"})
# Waiting reasons that may clear up by themselves (a registry hiccup, a Secret or PVC not there yet).
STUCK_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)

_ASSIGNED = re.compile(r"Successfully assigned \S+ to (\S+)")


class AttemptView:
    """One reading of an attempt (Job, pods, Events as the API returned them) and what it means."""

    def __init__(
        self,
        job: dict[str, Any],
        pods: Iterable[dict[str, Any]],
        events: Iterable[dict[str, Any]],
        *,
        spec: JobSpec,
        now: float,
        image_pull_grace_s: float = 300.0,
    ) -> None:
        self.job = job
        self.name = job["metadata"]["name"]
        self.uid = job["metadata"].get("uid", self.name)
        self.spec = spec
        self.now = datetime.fromtimestamp(now, UTC)
        self.image_pull_grace_s = image_pull_grace_s
        self.pods = [p for p in pods if completion_index(p) is not None]
        self.injected = injected_node_loss(job)
        # Events of this attempt's Job and pods (also of pods already gone).
        pod_name = re.compile(rf"^{re.escape(self.name)}-(\d+)-[a-z0-9]+$")
        self.job_events: list[dict[str, Any]] = []
        self.pod_events: dict[str, list[dict[str, Any]]] = {}
        for ev in sorted(events, key=event_time):
            obj = ev.get("involvedObject") or {}
            if obj.get("kind") == "Job" and obj.get("name") == self.name:
                self.job_events.append(ev)
            elif obj.get("kind") == "Pod" and pod_name.match(obj.get("name", "")):
                self.pod_events.setdefault(obj["name"], []).append(ev)
        self._pod_name = pod_name

    # --- what to read

    def needs_events(self) -> bool:
        """Events are read only when something is off: a steady running attempt costs two reads."""
        if condition(self.job, "Complete"):
            return False
        live = [p for p in self.pods if not p["metadata"].get("deletionTimestamp")]
        healthy = {"Running", "Succeeded"}
        return len(live) < self.spec.nodes or any(phase(p) not in healthy for p in live)

    # --- facts about pods

    def _node_of(self, pod_name: str, pod: dict[str, Any] | None = None) -> str | None:
        node = (pod or {}).get("spec", {}).get("nodeName")
        if node:
            return str(node)
        if pod_name in self.injected and self.injected[pod_name]:
            return self.injected[pod_name]
        for ev in self.pod_events.get(pod_name, []):
            found = _ASSIGNED.search(ev.get("message") or "")
            if ev.get("reason") == "Scheduled" and found:
                return found.group(1)
        for ev in self.pod_events.get(pod_name, []):
            host = (ev.get("source") or {}).get("host")
            if host:
                return str(host)
        return None

    def _pod_failure(self, pod: dict[str, Any]) -> Failure | None:
        meta = pod["metadata"]
        name = meta["name"]
        node = self._node_of(name, pod)
        loss = node_loss_event(self.pod_events.get(name, []))
        found = pod_cause(pod, node, injected=name in self.injected, loss=loss)
        if found is None:
            return None
        term = (trainer_status(pod).get("state") or {}).get("terminated")
        at = parse_ts((term or {}).get("finishedAt")) or parse_ts(meta.get("deletionTimestamp"))
        return Failure(name, meta.get("uid", name), completion_index(pod), node, *found, at=at)

    def _vanished_failures(self, present: set[str]) -> tuple[list[Failure], list[Failure]]:
        """Pods of this attempt that are gone but left Events (or an injected-fault record).

        Returns (node losses, other deletions); the latter explain a failed Job only when
        nothing else does (the Job controller itself deletes the pods of a failed Job).
        """
        out: list[Failure] = []
        deleted: list[Failure] = []
        for name in sorted(set(self.pod_events) | set(self.injected)):
            found = self._pod_name.match(name)
            if name in present or not found:
                continue
            index = int(found.group(1))
            node = self._node_of(name)
            events = self.pod_events.get(name, [])
            uids = [ev["involvedObject"]["uid"] for ev in events if ev["involvedObject"].get("uid")]
            uid = uids[0] if uids else name
            at = event_time(events[-1]) if events else None
            if name in self.injected:
                out.append(Failure(name, uid, index, node, injected_loss(name, node), True, at=at))
                continue
            loss = node_loss_event(events)
            why, node_level = vanished_cause(name, node, loss)
            if node_level:
                out.append(Failure(name, uid, index, node, why, True, at=event_time(loss) if loss else at))
            else:
                deleted.append(Failure(name, uid, index, node, why, False, at=at))
        return out, deleted

    def _failing(self) -> dict[str, Any] | None:
        return condition(self.job, "Failed") or condition(self.job, "FailureTarget")

    # --- the verdict

    def status(self) -> AttemptStatus:
        n = self.spec.nodes
        events: list[ObservedEvent] = []
        by_index: dict[int, dict[str, Any]] = {}
        for pod in sorted(self.pods, key=lambda p: p["metadata"].get("creationTimestamp") or ""):
            by_index[completion_index(pod) or 0] = pod  # the newest pod of each index

        scheduled = [p for p in by_index.values() if p.get("spec", {}).get("nodeName")]
        if len(scheduled) >= n:
            nodes = sorted({p["spec"]["nodeName"] for p in scheduled})
            conds = [c for p in scheduled for c in true_conditions(p, "PodScheduled")]
            times = [parse_ts(c.get("lastTransitionTime")) for c in conds]
            events.append(
                ObservedEvent(
                    key=f"k8s:{self.uid}:scheduled",
                    type="scheduled",
                    node=nodes[0] if len(nodes) == 1 else None,
                    details=_with_ts({"nodes": nodes, "pods": n}, times),
                )
            )
        started = [p for p in by_index.values() if started_at(p) is not None]
        if len(started) >= n:
            events.append(
                ObservedEvent(
                    key=f"k8s:{self.uid}:running",
                    type="running",
                    details=_with_ts({"pods": n}, [started_at(p) for p in started]),
                )
            )

        if condition(self.job, "Complete") or (
            len(by_index) >= n and all(phase(p) == "Succeeded" for p in by_index.values())
        ):
            return AttemptStatus(phase=AttemptPhase.succeeded, events=events)

        failures = [f for f in (self._pod_failure(p) for p in self.pods) if f]
        lost, deleted = self._vanished_failures({p["metadata"]["name"] for p in self.pods})
        failures += lost
        failing = self._failing()
        if failing and not failures:
            failures = deleted
        if failures or failing:
            return self._failed(failures, failing, events)

        stuck = self._stuck()
        if stuck is not None:
            failed, why = stuck
            return AttemptStatus(
                phase=AttemptPhase.failed if failed else AttemptPhase.pending, cause=why, events=events
            )

        running = [p for p in by_index.values() if phase(p) in ("Running", "Succeeded")]
        if len(running) >= n:
            return AttemptStatus(phase=AttemptPhase.running, events=events)
        return AttemptStatus(phase=AttemptPhase.pending, cause=self._pending_cause(len(running)), events=events)

    def _failed(
        self, failures: list[Failure], failing: dict[str, Any] | None, events: list[ObservedEvent]
    ) -> AttemptStatus:
        # A lost or evicting node explains the rest (ranks elsewhere fail after it), so it comes
        # first; among the same sort of failure, the earliest is the cause.
        far = datetime.max.replace(tzinfo=UTC)
        failures.sort(key=lambda f: (not f.node_level, f.at or far, f.index or 0))
        if failures:
            why = failures[0].cause
            # every node blamed, and the first failure of a program (later ones are its echoes)
            first_crash = next((f for f in failures if not f.node_level), None)
            reported = [f for f in failures if f.node_level or f is first_crash]
        else:
            reason = (failing or {}).get("reason") or "Failed"
            message = (failing or {}).get("message") or "the Job failed"
            deadline = reason == "DeadlineExceeded"
            text = f"deadline exceeded: {message}" if deadline else f"{message} ({reason})"
            why = cause(CauseClass.other, text, reason=reason)
            reported = []
        events += [f.event() for f in reported]
        failed_nodes = tuple(sorted({f.node for f in failures if f.node_level and f.node}))
        return AttemptStatus(phase=AttemptPhase.failed, cause=why, failed_nodes=failed_nodes, events=events)

    def _stuck(self) -> tuple[bool, Cause] | None:
        """A pod that cannot start: (fail the attempt?, cause)."""
        for pod in self.pods:
            if pod.get("status", {}).get("phase") != "Pending":
                continue
            waiting = (trainer_status(pod).get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason") or ""
            message = waiting.get("message") or ""
            image = self.spec.image
            node = pod.get("spec", {}).get("nodeName")
            if reason in IMAGE_ERRORS_PERMANENT:
                text = f"image {image} cannot be used ({reason}): {message}".rstrip(": ")
                return True, cause(CauseClass.scheduling, text, node=node, reason=reason)
            if reason in STUCK_WAITING_REASONS:
                bound = [parse_ts(c.get("lastTransitionTime")) for c in true_conditions(pod, "PodScheduled")]
                created = parse_ts(pod["metadata"].get("creationTimestamp"))
                since = next((t for t in bound if t), None) or created
                waited = (self.now - (since or self.now)).total_seconds()
                pulling = "Image" in reason
                what = f"image {image} cannot be pulled" if pulling else "the container cannot be created"
                detail = f"{what} ({reason}): {message}".rstrip(": ")
                if waited >= self.image_pull_grace_s:
                    text = f"{detail}; still failing after {waited:.0f} s"
                    return True, cause(CauseClass.scheduling, text, node=node, reason=reason)
                text = f"{detail}; Kubernetes keeps retrying"
                return False, cause(CauseClass.scheduling, text, node=node, reason=reason)
        return None

    def _pending_cause(self, running: int) -> Cause:
        n = self.spec.nodes
        for pod in self.pods:
            for cond in pod.get("status", {}).get("conditions") or []:
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                    why = cond.get("message") or cond.get("reason")
                    text = f"waiting for nodes ({running}/{n} pods running): {why}"
                    return cause(CauseClass.scheduling, text, reason=cond.get("reason"))
        for ev in reversed(self.job_events):
            if ev.get("reason") == "FailedCreate":
                text = f"pods cannot be created: {ev.get('message')}"
                return cause(CauseClass.scheduling, text, reason="FailedCreate")
        created = len(self.pods)
        if created < n:
            return cause(CauseClass.scheduling, f"{created}/{n} pods created")
        bound = sum(1 for p in self.pods if p.get("spec", {}).get("nodeName"))
        if bound < n:
            return cause(CauseClass.scheduling, f"waiting for the scheduler ({bound}/{n} pods bound to nodes)")
        return cause(CauseClass.scheduling, f"containers starting ({running}/{n} pods running)")


def _with_ts(details: dict[str, Any], times: Iterable[datetime | None]) -> dict[str, Any]:
    known = [t for t in times if t]
    if known:
        details["ts"] = iso(max(known))  # when the last pod got there
    return details
