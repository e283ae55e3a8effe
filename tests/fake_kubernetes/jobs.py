"""The fake's Job controller: pods per completion index, and the Job's end as its policies decide it.

Pods are named `<job>-<index>-<random>`, labelled and annotated with their completion index, owned by
the Job. A suspended Job has no pods (suspending one removes its active pods, resuming creates them).
A pod that fails is judged by the Job's `podFailurePolicy` (rules in order: `onExitCodes` on a named or
any container, init containers too, exit code 0 never matching; `onPodConditions`), with the actions
FailJob, FailIndex (needs `backoffLimitPerIndex`), Ignore (the pod is replaced, nothing is counted) and
Count; a failure no rule matches counts. Counted failures fail the Job past `backoffLimit`, or, with
`backoffLimitPerIndex`, fail the index past it; more failed indexes than `maxFailedIndexes` fail the Job
at once, and a Job whose indexes all ended with some failed fails with FailedIndexes. A pod deleted
while active counts as a failure. All indexes succeeded completes the Job, and so does a met
`successPolicy` rule (`succeededIndexes` and/or `succeededCount`) unless a failure policy ended it first.

How a Job ends, as 1.31+ controllers do it (https://kubernetes.io/docs/concepts/workloads/controllers/job/
#terminal-job-conditions, #success-policy): the controller first adds the interim condition (FailureTarget, or
SuccessCriteriaMet), judges no further pod failure, and terminates the active pods gracefully (a deletion with
the pod's `terminationGracePeriodSeconds`: the kubelet sends SIGTERM, SIGKILL once the grace is over); only
when no pod is left running does it add the terminal condition (Failed or Complete) with the same reason.
By default a kubelet's containers honour SIGTERM at once (exit 143); with `hold_termination`, they run on
until the test ends them (`exit`) or the grace period passes (`advance`: exit 137); on a node that is
unreachable they never confirm, and the Job keeps its interim condition. A terminated pod the controller
deleted is then removed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tests.fake_kubernetes.store import suffix
from tests.fake_kubernetes.volumes import Volumes

INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


@dataclass
class _JobState:
    counted: set[str] = field(default_factory=set)  # uids of pod failures already judged
    failed: int = 0  # failures counted against backoffLimit
    failed_pods: int = 0  # status.failed: every failed pod not ignored
    index_failures: dict[int, int] = field(default_factory=dict)
    failed_indexes: set[int] = field(default_factory=set)
    succeeded: set[int] = field(default_factory=set)


def _index(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["labels"][INDEX_LABEL])


def _terminated(pod: dict[str, Any]) -> list[tuple[str, int]]:
    """(container name, exit code) of every container and init container that terminated."""
    status = pod.get("status", {})
    out = []
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        term = (cs.get("state") or {}).get("terminated")
        if term is not None:
            out.append((cs["name"], int(term.get("exitCode", 0))))
    return out


def _true(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in job["status"].get("conditions") or []:
        if cond["type"] == kind and cond["status"] == "True":
            return dict(cond)
    return None


class JobController(Volumes):
    """The store, with the Job controller reacting to Jobs created, suspended or resumed, and pods deleted."""

    def __init__(self) -> None:
        super().__init__()
        self._jobs: dict[str, _JobState] = {}
        self.hold_termination = False  # True: terminated containers run on until the test ends them

    def node_reachable(self, node: str | None) -> bool:
        """Whether the node's kubelet can stop containers and confirm it (the cluster says otherwise)."""
        return True

    def _created(self, plural: str, obj: dict[str, Any]) -> None:
        super()._created(plural, obj)
        if plural == "jobs":
            self._jobs[obj["metadata"]["uid"]] = _JobState()
            if obj["spec"].get("suspend"):
                self._set_suspended(obj, True)
            else:
                obj["status"]["startTime"] = self.ts()
                self._create_pods(obj)
            self._sync(obj)

    def _updated(self, plural: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        super()._updated(plural, old, new)
        if plural == "jobs" and bool(old["spec"].get("suspend")) != bool(new["spec"].get("suspend")):
            if new["spec"].get("suspend"):
                for pod in self._pods_of(new):
                    if pod["status"]["phase"] in ("Pending", "Running"):
                        self.delete("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], by_user=False)
                self._set_suspended(new, True)
            else:
                self._set_suspended(new, False)
                new["status"]["startTime"] = self.ts()
                self._create_pods(new)
            self._sync(new)

    def _deleted(self, plural: str, obj: dict[str, Any], by_user: bool) -> None:
        super()._deleted(plural, obj, by_user)
        if plural == "pods" and by_user:
            self._pod_deleted(obj)

    def _set_suspended(self, job: dict[str, Any], suspended: bool) -> None:
        conditions = [c for c in job["status"].get("conditions") or [] if c["type"] != "Suspended"]
        reason, message = ("JobSuspended", "Job suspended") if suspended else ("JobResumed", "Job resumed")
        conditions.append(
            {
                "type": "Suspended",
                "status": "True" if suspended else "False",
                "reason": reason,
                "message": message,
                "lastProbeTime": self.ts(),
                "lastTransitionTime": self.ts(),
            }
        )
        job["status"]["conditions"] = conditions
        self.event(job, "Suspended" if suspended else "Resumed", message)

    def _create_pods(self, job: dict[str, Any], indexes: list[int] | None = None) -> None:
        if indexes is None:
            indexes = list(range(job["spec"].get("completions") or 1))
        for index in indexes:
            self._create_pod(job, index)

    def _create_pod(self, job: dict[str, Any], index: int) -> None:
        template = job["spec"]["template"]
        name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
        labels = dict(template["metadata"].get("labels") or {})
        labels.update(
            {
                "batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
                "batch.kubernetes.io/job-name": name,
                "controller-uid": job["metadata"]["uid"],
                "job-name": name,
                INDEX_LABEL: str(index),
            }
        )
        annotations = dict(template["metadata"].get("annotations") or {})
        annotations[INDEX_LABEL] = str(index)
        spec = copy.deepcopy(template["spec"])
        spec["hostname"] = f"{name}-{index}"
        for c in spec["containers"]:
            c.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "value": str(index)})
        pod = {
            "metadata": {
                "name": f"{name}-{index}-{suffix()}",
                "labels": labels,
                "annotations": annotations,
                "finalizers": ["batch.kubernetes.io/job-tracking"],
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }
        created = self.create("pods", ns, pod)
        self.objects[("pods", ns, created["metadata"]["name"])]["status"] = {
            "phase": "Pending",
            "conditions": [],
            "qosClass": "Burstable",
        }
        self.event(job, "SuccessfulCreate", f"Created pod: {created['metadata']['name']}")

    def _pods_of(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        uid = job["metadata"]["uid"]
        return sorted(
            (
                o
                for (p, _, _), o in self.objects.items()
                if p == "pods" and uid in {r.get("uid") for r in o["metadata"].get("ownerReferences") or []}
            ),
            key=lambda o: (_index(o), o["metadata"]["creationTimestamp"]),
        )

    # --- the failure policy

    def _judge(self, job: dict[str, Any], pod: dict[str, Any]) -> tuple[str, str]:
        """(action, why) for a failed pod: the first matching podFailurePolicy rule's action, else Count."""
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        for i, rule in enumerate((job["spec"].get("podFailurePolicy") or {}).get("rules") or []):
            codes = rule.get("onExitCodes")
            if codes:
                for container, code in _terminated(pod):
                    if code == 0 or codes.get("containerName") not in (None, container):
                        continue
                    if (code in codes["values"]) == (codes["operator"] == "In"):
                        return rule["action"], (
                            f"Container {container} for pod {ns}/{name} failed with exit code {code} matching "
                            f"{rule['action']} rule at index {i}"
                        )
            for want in rule.get("onPodConditions") or []:
                for cond in pod["status"].get("conditions") or []:
                    if cond["type"] == want["type"] and cond.get("status") == want.get("status", "True"):
                        return rule["action"], (
                            f"Pod {ns}/{name} has condition {want['type']} matching {rule['action']} rule at index {i}"
                        )
        return "Count", ""

    def _end_job(self, job: dict[str, Any], interim: str, reason: str, message: str) -> None:
        """The interim condition (FailureTarget or SuccessCriteriaMet) now, the active pods terminated, the terminal
        condition once none is left running (`_finish`)."""
        ts = self.ts()
        status = job["status"]
        status["conditions"] = [c for c in status.get("conditions") or [] if c["type"] == "Suspended"] + [
            {
                "type": interim,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": ts,
                "lastProbeTime": ts,
            }
        ]
        self.event(job, reason, message, "Warning" if interim == "FailureTarget" else "Normal")
        for pod in self._pods_of(job):
            if pod["status"]["phase"] in ("Pending", "Running") and not pod["metadata"].get("deletionTimestamp"):
                self._terminate(pod)
        self._finish(job)

    def _fail_job(self, job: dict[str, Any], reason: str, message: str) -> None:
        self._end_job(job, "FailureTarget", reason, message)

    def _terminate(self, pod: dict[str, Any]) -> None:
        """A graceful deletion: a pod that never started goes at once, a running one gets SIGTERM."""
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        node = pod["spec"].get("nodeName")
        if pod["status"]["phase"] != "Running":
            self.delete("pods", ns, name, by_user=False)
            return
        self.event(pod, "Killing", "Stopping container trainer", host=node)
        pod["metadata"]["deletionTimestamp"] = self.ts()
        pod["metadata"]["deletionGracePeriodSeconds"] = pod["spec"].get("terminationGracePeriodSeconds", 30)
        pod["metadata"]["resourceVersion"] = str(next(self.rv))
        if not self.hold_termination and self.node_reachable(node):
            self._stop_container(pod, 143)

    def _stop_container(self, pod: dict[str, Any], code: int) -> None:
        """The kubelet ends the trainer container (143: it honoured SIGTERM; 137: SIGKILL after the grace)."""
        started = pod["status"].get("startTime") or self.ts()
        term = {"exitCode": code, "reason": "Error", "startedAt": started, "finishedAt": self.ts()}
        pod["status"].update(
            phase="Failed",
            containerStatuses=[
                {**cs, "ready": False, "started": False, "state": {"terminated": term}}
                for cs in pod["status"].get("containerStatuses") or [{"name": "trainer"}]
            ],
        )
        pod["metadata"]["resourceVersion"] = str(next(self.rv))

    def _finish(self, job: dict[str, Any]) -> None:
        """The terminal condition, once the interim one is there and no pod of the Job is left running; the
        terminated pods the controller deleted are removed."""
        interim = _true(job, "FailureTarget") or _true(job, "SuccessCriteriaMet")
        if interim is None or _true(job, "Failed") or _true(job, "Complete"):
            return
        pods = self._pods_of(job)
        if any(p["status"]["phase"] in ("Pending", "Running") for p in pods):
            return
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp") and ("pods", *self._key(pod)) in self.objects:
                self.delete("pods", *self._key(pod), by_user=False)
        ts = self.ts()
        terminal = "Failed" if interim["type"] == "FailureTarget" else "Complete"
        job["status"]["conditions"].append(
            {
                "type": terminal,
                "status": "True",
                "reason": interim["reason"],
                "message": interim["message"],
                "lastTransitionTime": ts,
                "lastProbeTime": ts,
            }
        )
        if terminal == "Complete":
            job["status"]["completionTime"] = ts
            self.event(job, "Completed", "Job completed")
        job["status"]["active"] = 0
        job["metadata"]["resourceVersion"] = str(next(self.rv))

    @staticmethod
    def _key(pod: dict[str, Any]) -> tuple[str, str]:
        return pod["metadata"]["namespace"], pod["metadata"]["name"]

    def _tick(self) -> None:
        """The kubelets SIGKILL the containers whose grace period ran out."""
        super()._tick()
        now = self.now()
        for (p, _, _), pod in list(self.objects.items()):
            meta = pod["metadata"]
            if p != "pods" or pod["status"].get("phase") != "Running" or not meta.get("deletionTimestamp"):
                continue
            since = datetime.fromisoformat(meta["deletionTimestamp"].replace("Z", "+00:00"))
            grace = meta.get("deletionGracePeriodSeconds") or 0
            if now >= since + timedelta(seconds=grace) and self.node_reachable(pod["spec"].get("nodeName")):
                self._stop_container(pod, 137)
                for ref in meta.get("ownerReferences") or []:
                    job = self.objects.get(("jobs", meta["namespace"], ref["name"]))
                    if job is not None:
                        self._sync(job)

    def _sync(self, job: dict[str, Any]) -> None:
        """Judge new pod failures, replace what the policy retries, and end the Job when it is over."""
        status = job["status"]
        if any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in status.get("conditions") or []):
            return
        if _true(job, "FailureTarget") or _true(job, "SuccessCriteriaMet"):  # ending: nothing more is judged
            self._finish(job)
            return
        state = self._jobs.setdefault(job["metadata"]["uid"], _JobState())
        spec = job["spec"]
        per_index = spec.get("backoffLimitPerIndex")
        for pod in self._pods_of(job):
            uid = pod["metadata"]["uid"]
            if pod["status"]["phase"] == "Succeeded":
                state.succeeded.add(_index(pod))
            if pod["status"]["phase"] != "Failed" or uid in state.counted:
                continue
            state.counted.add(uid)
            action, why = self._judge(job, pod)
            index = _index(pod)
            if action != "Ignore":
                state.failed_pods += 1
            if action == "FailJob":
                self._fail_job(job, "PodFailurePolicy", why)
                break
            if action == "Ignore":
                self._create_pod(job, index)
                continue
            if action == "FailIndex" or (per_index is not None and state.index_failures.get(index, 0) + 1 > per_index):
                state.failed_indexes.add(index)
                state.index_failures[index] = state.index_failures.get(index, 0) + 1
                continue
            state.failed += 1
            if per_index is not None:
                state.index_failures[index] = state.index_failures.get(index, 0) + 1
                self._create_pod(job, index)
            elif state.failed > spec.get("backoffLimit", 6):
                self._fail_job(job, "BackoffLimitExceeded", "Job has reached the specified backoff limit")
                break
            else:
                self._create_pod(job, index)
        self._update_status(job, state)

    def _update_status(self, job: dict[str, Any], state: _JobState) -> None:
        status = job["status"]
        spec = job["spec"]
        phases = [p["status"]["phase"] for p in self._pods_of(job)]
        status.update(
            active=sum(ph in ("Pending", "Running") for ph in phases),
            succeeded=len(state.succeeded),
            failed=state.failed_pods,
            ready=phases.count("Running"),
        )
        if state.failed_indexes:
            status["failedIndexes"] = ",".join(str(i) for i in sorted(state.failed_indexes))
        if any(c["type"] in ("FailureTarget", "SuccessCriteriaMet") for c in status.get("conditions") or []):
            return
        max_failed = spec.get("maxFailedIndexes")
        completions = spec.get("completions") or 1
        if state.succeeded:
            status["completedIndexes"] = _ranges(sorted(state.succeeded))
        rule = _success_rule(spec, state.succeeded)
        if max_failed is not None and len(state.failed_indexes) > max_failed:
            self._fail_job(
                job, "MaxFailedIndexesExceeded", "Job has exceeded the specified maximal number of failed indexes"
            )
        elif rule is not None:
            self._end_job(job, "SuccessCriteriaMet", "SuccessPolicy", f"Matched rules at index {rule}")
        elif len(state.succeeded | state.failed_indexes) >= completions and state.failed_indexes:
            self._fail_job(job, "FailedIndexes", "Job has failed indexes")
        elif len(state.succeeded) >= completions:
            self._end_job(job, "SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods")

    def _pod_deleted(self, pod: dict[str, Any]) -> None:
        if pod.get("status", {}).get("phase") not in ("Pending", "Running"):
            return
        for ref in pod["metadata"].get("ownerReferences") or []:
            job = self.objects.get(("jobs", pod["metadata"]["namespace"], ref["name"]))
            if job and job["metadata"]["uid"] == ref["uid"] and not job["spec"].get("suspend"):
                state = self._jobs.setdefault(job["metadata"]["uid"], _JobState())
                state.failed += 1
                state.failed_pods += 1
                if (
                    state.failed > job["spec"].get("backoffLimit", 6)
                    and job["spec"].get("backoffLimitPerIndex") is None
                ):
                    self._fail_job(job, "BackoffLimitExceeded", "Job has reached the specified backoff limit")
                self._update_status(job, state)

    # --- reading what the controller made

    def job(self, name: str, ns: str) -> dict[str, Any]:
        return self.objects[("jobs", ns, name)]

    def pods(self, job: str, ns: str) -> list[dict[str, Any]]:
        with self.lock:
            return self._pods_of(self.job(job, ns))

    def pod(self, job: str, ns: str, index: int) -> dict[str, Any]:
        """The newest pod of a completion index."""
        return [p for p in self.pods(job, ns) if _index(p) == index][-1]


def _indexes(text: str) -> set[int]:
    """`succeededIndexes`' syntax: "0,2-3"."""
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def _ranges(indexes: list[int]) -> str:
    parts, start = [], None
    for i, index in enumerate(indexes):
        if start is None:
            start = index
        if i + 1 == len(indexes) or indexes[i + 1] != index + 1:
            parts.append(f"{start}-{index}" if index != start else str(index))
            start = None
    return ",".join(parts)


def _success_rule(spec: dict[str, Any], succeeded: set[int]) -> int | None:
    """The first `successPolicy` rule the succeeded indexes meet: with `succeededIndexes`, those of them that
    succeeded (all of them, or `succeededCount` of them); without, `succeededCount` indexes."""
    for i, rule in enumerate((spec.get("successPolicy") or {}).get("rules") or []):
        among = succeeded & _indexes(rule["succeededIndexes"]) if "succeededIndexes" in rule else succeeded
        needed = rule.get("succeededCount") or len(_indexes(rule.get("succeededIndexes", "")))
        if needed and len(among) >= needed:
            return i
    return None
