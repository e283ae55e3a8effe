"""The fake's Kueue: a Workload per queued Job, admission and preemption by suspending and resuming the Job.

A Job created suspended with the `kueue.x-k8s.io/queue-name` label gets a Workload (`job-<name>-<hash>`,
labelled with the Job's uid, owned by it) that has no quota reserved yet. `kueue_admit` reserves quota,
admits the Workload and unsuspends the Job (the Job controller creates its pods); `kueue_preempt` evicts
the Workload and suspends the Job again (its pods are removed), as Kueue does for a higher-priority
Workload. Kueue's Events on the Job (CreatedWorkload, Started, Stopped) come with them.

Where the test made queues (ResourceFlavors, ClusterQueues, LocalQueues, through the API or `create`),
`kueue_schedule` is Kueue's scheduler (kubernetes-sigs/kueue, pkg/scheduler/flavorassigner): a Workload whose
LocalQueue or ClusterQueue does not exist is Inadmissible; a requested resource that no resource group of its
ClusterQueue covers is "resource X unavailable in ClusterQueue", one beyond the flavor's nominal quota
"insufficient quota for X in flavor F, request > maximum capacity (a > b)", one beyond what is unused
"insufficient unused quota for X in flavor F, N more needed": each the message of a QuotaReserved condition
False (reason Pending, or Inadmissible), and the Workload is never admitted. Otherwise it is admitted.
`kueue_versions` are the Workload API's served versions (v1beta1, and v1beta2 from Kueue 0.15); the API group
is discovered at /apis/kueue.x-k8s.io, and is absent (404) without Kueue.
"""

from __future__ import annotations

import hashlib
from typing import Any

from tests.fake_kubernetes.provisioning import Provisioning
from tests.fake_kubernetes.scheduler import pod_requests, quantity

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
PENDING_MESSAGE = (
    "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor p5, 16 more needed"
)


def _condition(kind: str, status: str, reason: str, message: str, ts: str) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": ts}


class Kueue(Provisioning):
    """The cluster, with Kueue's job integration for batch/v1 Jobs."""

    kueue_installed = True
    kueue_versions: tuple[str, ...] = ("v1beta1",)

    def _created(self, plural: str, obj: dict[str, Any]) -> None:
        super()._created(plural, obj)
        queue = (obj["metadata"].get("labels") or {}).get(QUEUE_LABEL)
        if plural == "jobs" and queue and obj["spec"].get("suspend") and self.kueue_installed:
            self._create_workload(obj, queue)
            if self.list("clusterqueues"):
                self.kueue_schedule()

    # --- Kueue's scheduler, where there are queues

    def kueue_schedule(self) -> None:
        """Reserve quota for (and admit) each pending Workload that fits its ClusterQueue; say why for the rest."""
        with self.lock:
            for (p, ns, _), wl in list(self.objects.items()):
                if p != "workloads" or wl["status"].get("admission"):
                    continue
                reason, message = self._why_not_admitted(ns, wl)
                if reason is None:
                    owner = wl["metadata"]["ownerReferences"][0]["name"]
                    self.kueue_admit(owner, ns, cluster_queue=message)
                    continue
                ts = self.ts()
                wl["status"]["conditions"] = [_condition("QuotaReserved", "False", reason, message, ts)]
                wl["metadata"]["resourceVersion"] = str(next(self.rv))

    def _why_not_admitted(self, ns: str, wl: dict[str, Any]) -> tuple[str | None, str]:
        """(None, the ClusterQueue) when the Workload fits; else (the condition's reason, Kueue's message)."""
        local = self.objects.get(("localqueues", ns, wl["spec"]["queueName"]))
        if local is None:
            return "Inadmissible", f"LocalQueue {wl['spec']['queueName']} doesn't exist"
        cq_name = local["spec"]["clusterQueue"]
        cq = self.objects.get(("clusterqueues", "", cq_name))
        if cq is None:
            return "Inadmissible", f"ClusterQueue {cq_name} doesn't exist"
        job = self.objects.get(("jobs", ns, wl["metadata"]["ownerReferences"][0]["name"]))
        template = {"spec": (job or {}).get("spec", {}).get("template", {}).get("spec", {})}
        count = wl["spec"]["podSets"][0]["count"]
        requests = {k: v * count for k, v in pod_requests(template).items() if k != "pods" and v > 0}
        used = self._quota_used(cq_name)
        said = []
        for resource, wanted in sorted(requests.items()):
            group = next((g for g in cq["spec"].get("resourceGroups") or [] if resource in g["coveredResources"]), None)
            if group is None:
                said.append(f"resource {resource} unavailable in ClusterQueue")
                continue
            flavor = group["flavors"][0]
            quota = next((quantity(r["nominalQuota"]) for r in flavor["resources"] if r["name"] == resource), 0.0)
            free = quota - used.get(resource, 0.0)
            if wanted > quota:
                said.append(
                    f"insufficient quota for {resource} in flavor {flavor['name']}, request > maximum capacity "
                    f"({_amount(wanted)} > {_amount(quota)})"
                )
            elif wanted > free:
                said.append(
                    f"insufficient unused quota for {resource} in flavor {flavor['name']}, "
                    f"{_amount(wanted - free)} more needed"
                )
        if said:
            return "Pending", f"couldn't assign flavors to pod set main: {', '.join(said)}"
        return None, cq_name

    def _quota_used(self, cluster_queue: str) -> dict[str, float]:
        used: dict[str, float] = {}
        for (p, ns, _), wl in self.objects.items():
            if p == "workloads" and (wl["status"].get("admission") or {}).get("clusterQueue") == cluster_queue:
                job = self.objects.get(("jobs", ns, wl["metadata"]["ownerReferences"][0]["name"]))
                template = {"spec": (job or {}).get("spec", {}).get("template", {}).get("spec", {})}
                for k, v in pod_requests(template).items():
                    used[k] = used.get(k, 0.0) + v * wl["spec"]["podSets"][0]["count"]
        return used

    def _create_workload(self, job: dict[str, Any], queue: str) -> None:
        meta = job["metadata"]
        name = f"job-{meta['name']}-{hashlib.sha256(meta['uid'].encode()).hexdigest()[:5]}"[:63]
        workload = {
            "metadata": {
                "name": name,
                "labels": {JOB_UID_LABEL: meta["uid"]},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {"queueName": queue, "podSets": [{"name": "main", "count": job["spec"].get("parallelism", 1)}]},
            "status": {"conditions": [_condition("QuotaReserved", "False", "Pending", PENDING_MESSAGE, self.ts())]},
        }
        self.create("workloads", meta["namespace"], workload)
        self.event(job, "CreatedWorkload", f"Created Workload: {meta['namespace']}/{name}", component="kueue-admission")

    def workload(self, job: str, ns: str) -> dict[str, Any]:
        uid = self.job(job, ns)["metadata"]["uid"]
        (found,) = [
            o
            for (p, n, _), o in self.objects.items()
            if p == "workloads" and n == ns and o["metadata"]["labels"][JOB_UID_LABEL] == uid
        ]
        return found

    def kueue_admit(self, job: str, ns: str, cluster_queue: str = "cluster-queue") -> None:
        with self.lock:
            workload = self.workload(job, ns)
            ts = self.ts()
            message = f"Quota reserved in ClusterQueue {cluster_queue}"
            workload["status"] = {
                "admission": {
                    "clusterQueue": cluster_queue,
                    "podSetAssignments": [{"name": "main", "flavors": {"nvidia.com/gpu": "p5"}}],
                },
                "conditions": [
                    _condition("QuotaReserved", "True", "QuotaReserved", message, ts),
                    _condition("Admitted", "True", "Admitted", "The workload is admitted", ts),
                ],
            }
            job_obj = self.job(job, ns)
            self.event(job_obj, "Started", f"Admitted by clusterQueue {cluster_queue}", component="kueue-admission")
            self.patch("jobs", ns, job, {"spec": {"suspend": False}})

    def kueue_preempt(self, job: str, ns: str) -> None:
        """A higher-priority Workload takes the quota back: this one is evicted and its Job suspended."""
        with self.lock:
            workload = self.workload(job, ns)
            ts = self.ts()
            message = "Preempted to accommodate a workload (UID: 0f1e2d3c) due to prioritization in the ClusterQueue"
            workload["status"]["conditions"] = [
                _condition("QuotaReserved", "False", "Pending", "Preempted", ts),
                _condition("Admitted", "False", "NoReservation", "The workload has no reservation", ts),
                _condition("Evicted", "True", "Preempted", message, ts),
                _condition("Preempted", "True", "InClusterQueue", message, ts),
            ]
            workload["status"].pop("admission", None)
            job_obj = self.job(job, ns)
            self.event(job_obj, "Stopped", message, component="kueue-admission")
            self.patch("jobs", ns, job, {"spec": {"suspend": True}})
            job_obj = self.job(job, ns)
            job_obj["status"].pop("startTime", None)  # Kueue resets it, so the template may change again


def _amount(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
