"""What one reading of an attempt (its Job, pods, the Events asked for, its nodes' health, its Kueue Workload)
means: an `AttemptReading` with a structured cause and idempotent events.

`AttemptView` decides the phase (pending, running, succeeded, failed):
- queued in Kueue: pending (`kueue`), or failed when Kueue took the admission back (preempted);
- `scheduled` and `running` are reported once `nodes` pods got there (hot spares may still be placing);
- a failure: each pod's (`failures`), and a pod on a node whose Node object says it is broken
  (`nodes.unhealthy`). A lost or evicted node explains the ranks that failed after it, so node-level
  failures come first, then the earliest. With hot spares, losses a spare replaces (the node agent's 94,
  disruptions) do not end the attempt: each is reported (`node_failed`, `preempted`) and blames its
  node, and when the last spare is spent, `spares_exhausted`; one more, or any other failure, ends it;
- what keeps pods from starting is a `scheduling` cause (`pending`): pending while Kubernetes may still
  succeed, failed once it cannot. With hot spares, once `nodes` pods run the others are standbys: one that
  cannot be placed or started is reported (`spare_unavailable`, once per pod and reason), never a failure;
- success: the Job's SuccessCriteriaMet or Complete (with spares, its `successPolicy` is met once `nodes`
  indexes succeeded, whatever the standbys do);
- NVRx's verdict (the node agent's exit 93) on any node is the attempt's cause, whichever node failed first.
  A failing Job (FailureTarget) terminates its pods before it is Failed: the attempt is judged once they have
  stopped (or their grace period is long over), so a node that ends with the verdict while its pod is
  terminated is heard.

Which Events to read is the view's to say (`needs_events`, `event_pods`): none while all is well, else
the Job's own and those of the pods whose status does not say why they are in trouble, never a whole
namespace's; how many a pass lists is the reader's bound (events.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from api.schemas.causes import Cause, CauseClass
from api.schemas.spec import JobSpec
from workers.backends.base import AttemptPhase, AttemptReading, ObservedEvent
from workers.backends.kubernetes import kueue, pending
from workers.backends.kubernetes.ending import is_collateral, rank_failures
from workers.backends.kubernetes.failures import (
    PodFailure,
    Verdict,
    cause,
    node_loss_event,
    pod_cause,
    vanished_cause,
)
from workers.backends.kubernetes.nodes import NodeState, tolerated_s, unhealthy
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
    waiting_reason,
)
from workers.backends.kubernetes.pods import DELETED_ANNOTATION
from workers.backends.kubernetes.policy import pod_count
from workers.backends.kubernetes.spares import spares_spent, unavailable_spares

ENDING_MARGIN_S = 30.0  # past the pods' grace period, a failing Job whose pods still run is judged anyway
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
        """The pods whose Events are worth reading, most telling first: those whose own status does not say why
        they are in trouble (`_needs_explaining`), then pods the Job made (its `SuccessfulCreate` Events) that are
        gone. The reader bounds how many it lists a pass (events.py)."""
        order = {"Unknown": 0, "Failed": 1, "Running": 3, "Pending": 4}
        troubled = sorted(
            (p for p in self.pods if _needs_explaining(p)),
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
        return list(dict.fromkeys(names))

    def needs_nodes(self) -> bool:
        """Whether the nodes' states matter: a pod is bound (its node's health), or has been Unschedulable long
        enough that the nodes' allocatable may say it can never fit (pending.py)."""
        for pod in self.pods:
            if pod.get("spec", {}).get("nodeName"):
                return True
            since = pending.unschedulable_since(pod)
            if since is not None and (self.now - since).total_seconds() >= pending.UNSATISFIABLE_ALONE_S:
                return True
        return False

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

    def _pod_failure(self, pod: dict[str, Any]) -> PodFailure | None:
        meta = pod["metadata"]
        name = meta["name"]
        node = self._node_of(name, pod)
        loss = node_loss_event(self.pod_events.get(name, []))
        found = pod_cause(pod, node, loss=loss)
        if found is None and (meta.get("annotations") or {}).get(DELETED_ANNOTATION) and phase(pod) != "Succeeded":
            why, node_level = vanished_cause(name, node, loss)  # gone while it ran, and nothing said why
            found = Verdict(why, node_level, node_level)
        if found is None:
            return self._node_failure(pod, node)
        term = (trainer_status(pod).get("state") or {}).get("terminated")
        at = parse_ts((term or {}).get("finishedAt")) or parse_ts(meta.get("deletionTimestamp"))
        return PodFailure(
            name, meta.get("uid", name), completion_index(pod), node, found.cause, found.node_level, at, found.spare_ok
        )

    def _node_failure(self, pod: dict[str, Any], node: str | None) -> PodFailure | None:
        """A pod still running, or bound, on a node whose Node object says it is broken."""
        state = self.nodes.get(node or "")
        if state is None or phase(pod) not in ("Running", "Pending"):
            return None
        found = unhealthy(state, self.now, tolerated_s(pod.get("spec", {}).get("tolerations"), state.ready))
        if found is None:
            return None
        meta = pod["metadata"]
        at = state.ready_since if found.facts.get("condition") == "Ready" else self.now
        return PodFailure(
            meta["name"], meta.get("uid", meta["name"]), completion_index(pod), node, found, True, at, True
        )

    def _vanished_failures(self, present: set[str]) -> tuple[list[PodFailure], list[PodFailure]]:
        """Pods of this attempt that are gone but left Events. Returns (node losses, other deletions); the
        latter explain a failed Job only when nothing else does (the Job controller itself deletes pods)."""
        out: list[PodFailure] = []
        deleted: list[PodFailure] = []
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
            target.append(PodFailure(name, uid, int(found.group(1)), node, why, node_level, at, node_level))
        return out, deleted

    def _failing(self) -> dict[str, Any] | None:
        """The condition that says the Job began to fail: FailureTarget, added before the controller stops the
        other pods (it stays when Failed follows, once they all stopped); Failed alone where there is none."""
        return condition(self.job, "FailureTarget") or condition(self.job, "Failed")

    # --- the verdict

    def status(self) -> AttemptReading:
        events: list[ObservedEvent] = []
        if self.spec.queue:
            queued = kueue.queue_state(self.job, self.workload, queue=self.spec.queue, kueue_missing=self.kueue_missing)
            events += [e for e in (queued.event, queued.inadmissible) if e is not None]
            if queued.state == "preempted":
                assert queued.cause is not None
                preempted = ObservedEvent(
                    key=f"k8s:{self.uid}:preempted", type="preempted", details=queued.cause.details()
                )
                return AttemptReading(phase=AttemptPhase.failed, cause=queued.cause, events=[*events, preempted])
            if queued.state == "waiting":
                return AttemptReading(phase=AttemptPhase.pending, cause=queued.cause, events=events)

        by_index: dict[int, dict[str, Any]] = {}
        for pod in sorted(self.pods, key=lambda p: p["metadata"].get("creationTimestamp") or ""):
            by_index[completion_index(pod) or 0] = pod  # the newest pod of each index
        events += self._progress_events(by_index)

        failures = [f for f in (self._pod_failure(p) for p in self.pods) if f]
        lost, deleted = self._vanished_failures({p["metadata"]["name"] for p in self.pods})
        failures += lost
        if self._succeeded(by_index, failures):
            return AttemptReading(phase=AttemptPhase.succeeded, events=events)
        ending = self._ending(by_index)
        if ending is not None:
            return AttemptReading(phase=AttemptPhase.running, cause=ending, events=events)
        failing = self._failing()
        deleted += [f for f in failures if f.reason == "Deleted"]
        failures = [f for f in failures if f.reason != "Deleted"]
        if failing:
            failures += deleted  # (ranked below the failures that say why: `rank_failures`)
        spent = spares_spent(self.spec.resiliency.spare_nodes, self.uid, failures, failing)
        if spent is not None:
            events += spent
        elif failures or failing:
            return self._failed(failures, failing, events)

        gone = {f.index for f in failures}
        running = [p for i, p in by_index.items() if i not in gone and phase(p) in ("Running", "Succeeded")]
        if len(running) >= self.spec.nodes:
            standbys = [p for i, p in by_index.items() if i not in gone and p not in running]
            events += unavailable_spares(standbys)
            return AttemptReading(phase=AttemptPhase.running, events=events, failed_nodes=())
        never = pending.unsatisfiable(self.pods, self.pod_events, now=self.now, nodes=self.nodes)
        if never is not None:
            said = ObservedEvent(key=f"k8s:{self.uid}:unsatisfiable", type="scheduling_failed", details=never.details())
            return AttemptReading(phase=AttemptPhase.failed, cause=never, events=[*events, said])
        stuck = pending.stuck(self.pods, image=self.spec.image or "", now=self.now, grace_s=self.image_pull_grace_s)
        if stuck is not None:
            failed, why = stuck
            return AttemptReading(
                phase=AttemptPhase.failed if failed else AttemptPhase.pending, cause=why, events=events
            )
        why = pending.waiting_cause(
            self.job,
            self.pods,
            self.pod_events,
            self.job_events,
            expected=self.expected,
            needed=self.spec.nodes,
            running=len(running),
        )
        return AttemptReading(phase=AttemptPhase.pending, cause=why, events=events)

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

    def _ending(self, by_index: dict[int, dict[str, Any]]) -> Cause | None:
        """While a failing Job (FailureTarget, not yet Failed) still has pods running, and their grace period is not
        long over: why the attempt is not judged yet (their exits may hold NVRx's verdict)."""
        target = condition(self.job, "FailureTarget")
        if target is None or condition(self.job, "Failed"):
            return None
        stopping = [p for p in by_index.values() if phase(p) in ("Running", "Pending") and self._stoppable(p)]
        since = parse_ts(target.get("lastTransitionTime")) or self.now
        grace = max((p.get("spec", {}).get("terminationGracePeriodSeconds") or 30 for p in stopping), default=0)
        if not stopping or (self.now - since).total_seconds() > grace + ENDING_MARGIN_S:
            return None
        said = target.get("message") or target.get("reason") or "failed"
        text = f"the Job is failing ({said}); waiting for its {len(stopping)} running pod(s) to stop"
        return cause(CauseClass.other, text, reason=target.get("reason") or "FailureTarget")

    def _stoppable(self, pod: dict[str, Any]) -> bool:
        """Whether the pod's kubelet can still stop it and say so (its node is not NotReady, unreachable, lost)."""
        node = pod.get("spec", {}).get("nodeName")
        state = self.nodes.get(node or "")
        lost = node_loss_event(self.pod_events.get(pod["metadata"]["name"], []))
        return lost is None and (state is None or state.ready == "True")

    def _succeeded(self, by_index: dict[int, dict[str, Any]], failures: list[PodFailure]) -> bool:
        done = {i for i, p in by_index.items() if phase(p) == "Succeeded"}
        if condition(self.job, "Complete") or condition(self.job, "SuccessCriteriaMet") or len(done) >= self.expected:
            return True
        # with hot spares the Job ends Failed (FailedIndexes) when a spare was spent, though training finished
        ended = condition(self.job, "Failed") or {}
        spent = {f.index for f in failures if f.spare_ok}
        others = [f for f in failures if not f.spare_ok]
        return ended.get("reason") == "FailedIndexes" and len(done) >= self.spec.nodes and not others and bool(spent)

    def _failed(
        self, failures: list[PodFailure], failing: dict[str, Any] | None, events: list[ObservedEvent]
    ) -> AttemptReading:
        failures = rank_failures(failures, failing)
        if failures:
            why: Cause = failures[0].cause
            first_crash = next((f for f in failures if not f.node_level and not is_collateral(f, failing)), None)
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
        return AttemptReading(phase=AttemptPhase.failed, cause=why, failed_nodes=failed_nodes, events=events)


def _needs_explaining(pod: dict[str, Any]) -> bool:
    """A pod in trouble whose own status does not say why (its Events may): a pod going away with no disruption
    condition (a lost node says so in Events), one no node takes (an autoscaler's refusal), one bound but not
    starting (a volume that cannot be mounted), one failed without an exit code or reason."""
    if _healthy(pod):
        return False
    status = pod.get("status", {})
    if pod["metadata"].get("deletionTimestamp"):
        return condition(pod, "DisruptionTarget") is None
    if phase(pod) == "Pending":
        return not waiting_reason(pod)[0] or waiting_reason(pod)[0] == "ContainerCreating"
    if phase(pod) == "Failed":
        return not status.get("reason") and not (trainer_status(pod).get("state") or {}).get("terminated")
    return False


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
