"""What one reading of an attempt (its Job, pods, the Events asked for, its nodes' health, its Kueue Workload)
means: an `AttemptStatus` with a structured cause and idempotent events.

`AttemptView` decides the phase (pending, running, succeeded, failed):
- queued in Kueue: pending (`kueue`), or failed when Kueue took the admission back (preempted);
- `scheduled` and `running` are reported once `nodes` pods got there (hot spares may still be placing);
- a failure: each pod's (`failures`), and a pod on a node whose Node object says it is broken
  (`nodes.unhealthy`). A lost or evicted node explains the ranks that failed after it, so node-level
  failures come first, then the earliest. With hot spares, losses a spare replaces (the node agent's 94,
  disruptions) do not end the attempt: each is reported (`node_failed`, `preempted`) and blames its
  node, and when the last spare is spent, `spares_exhausted`; one more, or any other failure, ends it;
- what keeps pods from starting is a `scheduling` cause (`pending`): pending while Kubernetes may still
  succeed, failed once it cannot.

Which Events to read is the view's to say (`needs_events`, `event_pods`): none while all is well, else
the Job's own and those of at most MAX_EVENT_PODS of its pods, never a whole namespace's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from api.schemas.causes import Cause, CauseClass
from api.schemas.spec import JobSpec
from workers.backends.base import AttemptPhase, AttemptStatus, ObservedEvent
from workers.backends.kubernetes import kueue, pending
from workers.backends.kubernetes.failures import Failure, cause, node_loss_event, pod_cause, vanished_cause
from workers.backends.kubernetes.nodes import NodeState, unhealthy
from workers.backends.kubernetes.objects import (
    completion_index,
    condition,
    event_time,
    iso,
    parse_ts,
    phase,
    started_at,
    trainer_status,
    true_conditions,
)
from workers.backends.kubernetes.policy import pod_count

MAX_EVENT_PODS = 8  # pods whose Events one pass reads at most
_ASSIGNED = re.compile(r"Successfully assigned \S+ to (\S+)")
_CREATED = re.compile(r"Created pod: (\S+)")


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
        nodes: Mapping[str, NodeState] | None = None,
        workload: dict[str, Any] | None = None,
        kueue_missing: bool = False,
    ) -> None:
        self.job = job
        self.name = job["metadata"]["name"]
        self.uid = job["metadata"].get("uid", self.name)
        self.spec = spec
        self.now = datetime.fromtimestamp(now, UTC)
        self.image_pull_grace_s = image_pull_grace_s
        self.nodes = nodes or {}
        self.workload = workload
        self.kueue_missing = kueue_missing
        self.pods = [p for p in pods if completion_index(p) is not None]
        self.expected = pod_count(spec)
        # Events of this attempt's Job and pods (also of pods already gone).
        self._pod_name = re.compile(rf"^{re.escape(self.name)}-(\d+)-[a-z0-9]+$")
        self.job_events: list[dict[str, Any]] = []
        self.pod_events: dict[str, list[dict[str, Any]]] = {}
        for ev in sorted(events, key=event_time):
            obj = ev.get("involvedObject") or {}
            if obj.get("kind") == "Job" and obj.get("name") == self.name:
                self.job_events.append(ev)
            elif obj.get("kind") == "Pod" and self._pod_name.match(obj.get("name", "")):
                self.pod_events.setdefault(obj["name"], []).append(ev)

    # --- what to read

    def needs_events(self) -> bool:
        """Events are read only when something is off: a steady running attempt costs two reads."""
        if condition(self.job, "Complete"):
            return False
        if kueue.suspended(self.job) or self._failing():
            return True
        live = [p for p in self.pods if not p["metadata"].get("deletionTimestamp")]
        return len(live) < self.expected or any(not _healthy(p) for p in live)

    def event_pods(self, job_events: Iterable[dict[str, Any]] = ()) -> list[str]:
        """The pods whose Events are worth reading (at most MAX_EVENT_PODS): the troubled ones first, then
        pods the Job made (its `SuccessfulCreate` Events) that are gone."""
        order = {"Unknown": 0, "Failed": 1, "Running": 3, "Pending": 4}
        troubled = sorted(
            (p for p in self.pods if not _healthy(p)),
            key=lambda p: (
                0 if p["metadata"].get("deletionTimestamp") else order.get(phase(p) or "", 2),
                completion_index(p),
            ),
        )
        names = [p["metadata"]["name"] for p in troubled]
        listed = {p["metadata"]["name"] for p in self.pods}
        for ev in job_events:
            found = _CREATED.search(str(ev.get("message") or ""))
            if ev.get("reason") == "SuccessfulCreate" and found and found.group(1) not in listed:
                names.append(found.group(1))
        return list(dict.fromkeys(names))[:MAX_EVENT_PODS]

    def suspect_nodes(self) -> list[str]:
        """The nodes of pods that look lost (bound, and not Running and Ready, or being deleted): read afresh."""
        return [str(p["spec"]["nodeName"]) for p in self.pods if p.get("spec", {}).get("nodeName") and not _healthy(p)]

    # --- facts about pods

    def _node_of(self, pod_name: str, pod: dict[str, Any] | None = None) -> str | None:
        node = (pod or {}).get("spec", {}).get("nodeName")
        if node:
            return str(node)
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
        found = pod_cause(pod, node, loss=loss)
        if found is None:
            return self._node_failure(pod, node)
        term = (trainer_status(pod).get("state") or {}).get("terminated")
        at = parse_ts((term or {}).get("finishedAt")) or parse_ts(meta.get("deletionTimestamp"))
        return Failure(
            name, meta.get("uid", name), completion_index(pod), node, found.cause, found.node_level, at, found.spare_ok
        )

    def _node_failure(self, pod: dict[str, Any], node: str | None) -> Failure | None:
        """A pod still running, or bound, on a node whose Node object says it is broken."""
        state = self.nodes.get(node or "")
        if state is None or phase(pod) not in ("Running", "Pending"):
            return None
        found = unhealthy(state, self.now)
        if found is None:
            return None
        meta = pod["metadata"]
        at = state.ready_since if found.facts.get("condition") == "Ready" else self.now
        return Failure(meta["name"], meta.get("uid", meta["name"]), completion_index(pod), node, found, True, at, True)

    def _vanished_failures(self, present: set[str]) -> tuple[list[Failure], list[Failure]]:
        """Pods of this attempt that are gone but left Events. Returns (node losses, other deletions); the
        latter explain a failed Job only when nothing else does (the Job controller itself deletes pods)."""
        out: list[Failure] = []
        deleted: list[Failure] = []
        for name in sorted(self.pod_events):
            found = self._pod_name.match(name)
            if name in present or not found:
                continue
            events = self.pod_events[name]
            uids = [ev["involvedObject"]["uid"] for ev in events if ev["involvedObject"].get("uid")]
            uid = uids[0] if uids else name
            node = self._node_of(name)
            loss = node_loss_event(events)
            why, node_level = vanished_cause(name, node, loss)
            at = event_time(loss) if loss else (event_time(events[-1]) if events else None)
            target = out if node_level else deleted
            target.append(Failure(name, uid, int(found.group(1)), node, why, node_level, at, node_level))
        return out, deleted

    def _failing(self) -> dict[str, Any] | None:
        return condition(self.job, "Failed") or condition(self.job, "FailureTarget")

    # --- the verdict

    def status(self) -> AttemptStatus:
        events: list[ObservedEvent] = []
        if self.spec.queue:
            queued = kueue.queue_state(self.job, self.workload, queue=self.spec.queue, kueue_missing=self.kueue_missing)
            if queued.event is not None:
                events.append(queued.event)
            if queued.state == "preempted":
                assert queued.cause is not None
                preempted = ObservedEvent(
                    key=f"k8s:{self.uid}:preempted", type="preempted", details=queued.cause.details()
                )
                return AttemptStatus(phase=AttemptPhase.failed, cause=queued.cause, events=[*events, preempted])
            if queued.state == "waiting":
                return AttemptStatus(phase=AttemptPhase.pending, cause=queued.cause, events=events)

        by_index: dict[int, dict[str, Any]] = {}
        for pod in sorted(self.pods, key=lambda p: p["metadata"].get("creationTimestamp") or ""):
            by_index[completion_index(pod) or 0] = pod  # the newest pod of each index
        events += self._progress_events(by_index)

        failures = [f for f in (self._pod_failure(p) for p in self.pods) if f]
        lost, deleted = self._vanished_failures({p["metadata"]["name"] for p in self.pods})
        failures += lost
        if self._succeeded(by_index, failures):
            return AttemptStatus(phase=AttemptPhase.succeeded, events=events)
        failing = self._failing()
        if failing and not failures:
            failures = deleted
        spent = self._spares_spent(failures, failing)
        if spent is not None:
            events += spent
        elif failures or failing:
            return self._failed(failures, failing, events)

        stuck = pending.stuck(self.pods, image=self.spec.image or "", now=self.now, grace_s=self.image_pull_grace_s)
        if stuck is not None:
            failed, why = stuck
            return AttemptStatus(
                phase=AttemptPhase.failed if failed else AttemptPhase.pending, cause=why, events=events
            )
        gone = {f.index for f in failures}
        running = [p for i, p in by_index.items() if i not in gone and phase(p) in ("Running", "Succeeded")]
        if len(running) >= self.spec.nodes:
            return AttemptStatus(phase=AttemptPhase.running, events=events, failed_nodes=())
        why = pending.waiting_cause(
            self.job,
            self.pods,
            self.pod_events,
            self.job_events,
            expected=self.expected,
            needed=self.spec.nodes,
            running=len(running),
        )
        return AttemptStatus(phase=AttemptPhase.pending, cause=why, events=events)

    def _progress_events(self, by_index: dict[int, dict[str, Any]]) -> list[ObservedEvent]:
        """`scheduled` and `running`, once `nodes` pods got there."""
        events = []
        n = self.spec.nodes
        scheduled = [p for p in by_index.values() if p.get("spec", {}).get("nodeName")]
        if len(scheduled) >= n:
            nodes = sorted({p["spec"]["nodeName"] for p in scheduled})
            conds = [c for p in scheduled for c in true_conditions(p, "PodScheduled")]
            details = _with_ts(
                {"nodes": nodes, "pods": len(scheduled)}, [parse_ts(c.get("lastTransitionTime")) for c in conds]
            )
            if self.spec.resiliency.spare_nodes:
                details["spares"] = self.spec.resiliency.spare_nodes
            node = nodes[0] if len(nodes) == 1 else None
            events.append(ObservedEvent(key=f"k8s:{self.uid}:scheduled", type="scheduled", node=node, details=details))
        started = [p for p in by_index.values() if started_at(p) is not None]
        if len(started) >= n:
            details = _with_ts({"pods": len(started)}, [started_at(p) for p in started])
            events.append(ObservedEvent(key=f"k8s:{self.uid}:running", type="running", details=details))
        return events

    def _succeeded(self, by_index: dict[int, dict[str, Any]], failures: list[Failure]) -> bool:
        done = {i for i, p in by_index.items() if phase(p) == "Succeeded"}
        if condition(self.job, "Complete") or len(done) >= self.expected:
            return True
        # with hot spares the Job ends Failed (FailedIndexes) when a spare was spent, though training finished
        ended = condition(self.job, "Failed") or {}
        spent = {f.index for f in failures if f.spare_ok}
        others = [f for f in failures if not f.spare_ok]
        return ended.get("reason") == "FailedIndexes" and len(done) >= self.spec.nodes and not others and bool(spent)

    def _spares_spent(self, failures: list[Failure], failing: dict[str, Any] | None) -> list[ObservedEvent] | None:
        """With hot spares: the events of losses the spares absorbed; None when the attempt is over (no spares,
        a failure no spare replaces, or more losses than spares)."""
        spares = self.spec.resiliency.spare_nodes
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
            details = {
                **cause(CauseClass.node, text, reason="SparesExhausted").details(),
                "spares": spares,
                "nodes": nodes,
            }
            events.append(
                ObservedEvent(key=f"k8s:{self.uid}:spares_exhausted", type="spares_exhausted", details=details)
            )
        return events

    def _failed(
        self, failures: list[Failure], failing: dict[str, Any] | None, events: list[ObservedEvent]
    ) -> AttemptStatus:
        # A lost or evicting node explains the rest (ranks elsewhere fail after it), so it comes first; among the
        # same sort of failure, the earliest is the cause.
        far = datetime.max.replace(tzinfo=UTC)
        failures.sort(key=lambda f: (not f.node_level, f.at or far, f.index or 0))
        if failures:
            why: Cause = failures[0].cause
            first_crash = next((f for f in failures if not f.node_level), None)
            reported = [
                f for f in failures if f.node_level or f is first_crash or f.cause.cause_class == CauseClass.preempted
            ]
        else:
            reason = (failing or {}).get("reason") or "Failed"
            message = (failing or {}).get("message") or "the Job failed"
            text = f"deadline exceeded: {message}" if reason == "DeadlineExceeded" else f"{message} ({reason})"
            why = cause(CauseClass.other, text, reason=reason)
            reported = []
        events += [f.event() for f in reported]
        failed_nodes = tuple(sorted({f.node for f in failures if f.node_level and f.node}))
        return AttemptStatus(phase=AttemptPhase.failed, cause=why, failed_nodes=failed_nodes, events=events)


def _healthy(pod: dict[str, Any]) -> bool:
    """Running and Ready, or done."""
    if pod["metadata"].get("deletionTimestamp"):
        return False
    if phase(pod) == "Succeeded":
        return True
    return phase(pod) == "Running" and bool(true_conditions(pod, "Ready"))


def _with_ts(details: dict[str, Any], times: Iterable[datetime | None]) -> dict[str, Any]:
    known = [t for t in times if t]
    if known:
        details["ts"] = iso(max(known))  # when the last pod got there
    return details
