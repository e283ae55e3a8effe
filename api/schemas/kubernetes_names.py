"""How a job's objects are found on Kubernetes: the labels the backend puts on them, the trainer container's
name, and which pod hosts a rank. Written by the backend (workers/backends/kubernetes/manifests.py), read
by the API's log reader (api/services/logs/pods.py), stated once here."""

from __future__ import annotations

import hashlib
import re

LABEL_JOB_ID = "ftplane.io/job-id"
LABEL_JOB_NAME = "ftplane.io/job-name"
LABEL_ATTEMPT = "ftplane.io/attempt"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
CONTAINER_NAME = "trainer"

_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def job_id_label(job_id: str) -> str:
    """The job id as a label value (valid values are kept; others get a readable prefix and a hash)."""
    if len(job_id) <= 63 and _LABEL_VALUE.match(job_id):
        return job_id
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", job_id)[:50].strip("-_.")
    return f"{stem}-{digest(job_id, 12)}" if stem else digest(job_id, 12)


def job_selector(job_id: str) -> str:
    return f"{LABEL_JOB_ID}={job_id_label(job_id)}"


def attempt_selector(job_id: str, attempt: int) -> str:
    return f"{job_selector(job_id)},{LABEL_ATTEMPT}={attempt}"


def pod_index_for_rank(nodes: int, procs_per_node: int, rank: int) -> int:
    """Completion index of the pod that hosts global `rank`.

    ft_launcher's c10d rendezvous numbers nodes by sorting their host names, so node
    rank k is the k-th completion index in text order ("0" < "1" < "10" < "11" < "2");
    for fewer than 11 nodes that is simply rank // procs_per_node.
    """
    order = sorted(range(nodes), key=lambda i: f"{i}.")
    return order[min(rank // procs_per_node, nodes - 1)]
