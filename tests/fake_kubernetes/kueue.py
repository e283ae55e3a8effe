"""The fake's Kueue: a Workload per queued Job, admission and preemption by suspending and resuming the Job.

A Job created suspended with the `kueue.x-k8s.io/queue-name` label gets a Workload (`job-<name>-<hash>`,
labelled with the Job's uid, owned by it) that has no quota reserved yet. `kueue_admit` reserves quota,
admits the Workload and unsuspends the Job (the Job controller creates its pods); `kueue_preempt` evicts
the Workload and suspends the Job again (its pods are removed), as Kueue does for a higher-priority
Workload. Kueue's Events on the Job (CreatedWorkload, Started, Stopped) come with them.
"""

from __future__ import annotations

import hashlib
from typing import Any

from tests.fake_kubernetes.cluster import Cluster

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
PENDING_MESSAGE = (
    "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor p5, 16 more needed"
)


def _condition(kind: str, status: str, reason: str, message: str, ts: str) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": ts}


class Kueue(Cluster):
    """The cluster, with Kueue's job integration for batch/v1 Jobs."""

    kueue_installed = True

    def _created(self, plural: str, obj: dict[str, Any]) -> None:
        super()._created(plural, obj)
        queue = (obj["metadata"].get("labels") or {}).get(QUEUE_LABEL)
        if plural == "jobs" and queue and obj["spec"].get("suspend") and self.kueue_installed:
            self._create_workload(obj, queue)

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
