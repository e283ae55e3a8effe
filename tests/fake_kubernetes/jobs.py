"""The fake's Job controller: one pod per completion index, and the Job's end as `backoffLimit` decides it.

Pods are named `<job>-<index>-<random>`, labelled and annotated with their
completion index, owned by the Job. Any failure beyond the backoff limit (a
failed pod, or an active pod deleted) fails the Job and removes its active pods;
all indexes succeeded completes it.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.fake_kubernetes.store import Store, now_iso, suffix

INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


class JobController(Store):
    """The store, with the Job controller reacting to Jobs created and pods deleted."""

    def _created(self, plural: str, obj: dict[str, Any]) -> None:
        super()._created(plural, obj)
        if plural == "jobs":
            self._job_created(obj)

    def _deleted(self, plural: str, obj: dict[str, Any], by_user: bool) -> None:
        super()._deleted(plural, obj, by_user)
        if plural == "pods" and by_user:
            self._pod_deleted(obj)

    def _job_created(self, job: dict[str, Any]) -> None:
        template = job["spec"]["template"]
        name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
        for index in range(job["spec"].get("completions") or 1):
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
        self._sync(job)

    def _pods_of(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        uid = job["metadata"]["uid"]
        return sorted(
            (
                o
                for (p, _, _), o in self.objects.items()
                if p == "pods" and uid in {r.get("uid") for r in o["metadata"].get("ownerReferences") or []}
            ),
            key=lambda o: int(o["metadata"]["labels"][INDEX_LABEL]),
        )

    def _sync(self, job: dict[str, Any]) -> None:
        """Job controller, backoffLimit semantics: any failure beyond the limit fails the Job."""
        status = job["status"]
        if any(c["type"] in ("Complete", "Failed") for c in status.get("conditions") or []):
            return
        pods = self._pods_of(job)
        phases = [p["status"]["phase"] for p in pods]
        failed = phases.count("Failed") + status.get("deletedActive", 0)
        status.update(
            active=sum(ph in ("Pending", "Running") for ph in phases),
            succeeded=phases.count("Succeeded"),
            failed=failed,
            ready=phases.count("Running"),
        )
        if failed > job["spec"].get("backoffLimit", 6):
            ts = now_iso()
            message = "Job has reached the specified backoff limit"
            status["conditions"] = [
                {
                    "type": "FailureTarget",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": message,
                },
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": message},
            ]
            for c in status["conditions"]:
                c["lastTransitionTime"] = c["lastProbeTime"] = ts
            self.event(job, "BackoffLimitExceeded", message, "Warning")
            for pod in pods:  # the controller removes what is still active
                if pod["status"]["phase"] in ("Pending", "Running"):
                    self.event(pod, "Killing", "Stopping container trainer", host=pod["spec"].get("nodeName"))
                    self.delete("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], by_user=False)
            status["active"] = 0
        elif len(pods) == job["spec"]["completions"] and all(ph == "Succeeded" for ph in phases):
            ts = now_iso()
            status["conditions"] = [
                {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": ts},
                {"type": "Complete", "status": "True", "lastTransitionTime": ts},
            ]
            status["completionTime"] = ts
            status["completedIndexes"] = f"0-{len(pods) - 1}" if len(pods) > 1 else "0"
            self.event(job, "Completed", "Job completed")

    def _pod_deleted(self, pod: dict[str, Any]) -> None:
        if pod.get("status", {}).get("phase") not in ("Pending", "Running"):
            return
        for ref in pod["metadata"].get("ownerReferences") or []:
            job = self.objects.get(("jobs", pod["metadata"]["namespace"], ref["name"]))
            if job and job["metadata"]["uid"] == ref["uid"]:
                job["status"]["deletedActive"] = job["status"].get("deletedActive", 0) + 1
                self._sync(job)

    # --- reading what the controller made

    def job(self, name: str, ns: str) -> dict[str, Any]:
        obj = self.objects[("jobs", ns, name)]
        return obj

    def pods(self, job: str, ns: str) -> list[dict[str, Any]]:
        with self.lock:
            return self._pods_of(self.job(job, ns))

    def pod(self, job: str, ns: str, index: int) -> dict[str, Any]:
        return next(p for p in self.pods(job, ns) if p["metadata"]["labels"][INDEX_LABEL] == str(index))
