"""Faults the Kubernetes backend delivers itself, into a running attempt.

- node_loss: the pod of the node hosting the rank is deleted with no grace, as if
  its node vanished; the Job is annotated first, so `status()` blames that node.
- crash / hang: SIGKILL / SIGSTOP to the rank's worker process, found through exec
  in its pod.
Exceptions are raised by the trainer itself (`FaultNotSupported` here).
"""

from __future__ import annotations

import json
import logging
import shlex
from typing import Any

from api.schemas.spec import JobSpec
from workers.backends.base import FaultNotSupported, FaultRequest
from workers.backends.kubernetes import manifests as m
from workers.backends.kubernetes.client import KubernetesApi, KubernetesBackendError, failure_of
from workers.backends.kubernetes.objects import completion_index, injected_node_loss, phase

log = logging.getLogger(__name__)

# Signals one rank inside a pod: the oldest process whose environment has RANK=<rank>
# (torchrun/ft_launcher give each worker its global rank; children inherit it, so the
# lowest pid is the worker itself). Prints a marker the backend parses.
SIGNAL_RANK_SCRIPT = r"""
sig="$1"; want="RANK=$2"
for pid in $(ls /proc | grep -E '^[0-9]+$' | sort -n); do
  [ "$pid" = "$$" ] && continue
  if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "$want"; then
    kill -s "$sig" "$pid" && echo "ftplane-fault: signalled $pid" && exit 0
    echo "ftplane-fault: kill failed for $pid"; exit 4
  fi
done
echo "ftplane-fault: no process with $want"; exit 3
""".strip()
FAULT_SIGNALS = {"crash": "KILL", "hang": "STOP"}


class FaultInjector:
    """Delivers node_loss, crash and hang faults to an attempt's pods through the API."""

    def __init__(self, api: KubernetesApi, *, exec_timeout_s: float = 30.0) -> None:
        self.api = api
        self.exec_timeout_s = exec_timeout_s

    def inject(self, job_id: str, attempt: int, spec: JobSpec, fault: FaultRequest) -> None:
        if fault.kind == "node_loss":
            self._lose_node(job_id, attempt, spec, fault.rank)
        elif fault.kind in FAULT_SIGNALS:
            self._signal_rank(job_id, attempt, spec, fault.rank, FAULT_SIGNALS[fault.kind])
        else:
            raise FaultNotSupported(f"{fault.kind} faults are injected by the trainer, not by Kubernetes")

    def _attempt_pods(self, job_id: str, attempt: int, spec: JobSpec) -> list[dict[str, Any]]:
        """The attempt's pods that are not being deleted, by completion index."""
        with failure_of("list pods"):
            pods = self.api.read(
                "list pods",
                self.api.core.list_namespaced_pod,
                spec.namespace,
                label_selector=m.attempt_selector(job_id, attempt),
            ).get("items", [])
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return sorted(live, key=lambda p: (completion_index(p) is None, completion_index(p) or 0))

    def _lose_node(self, job_id: str, attempt: int, spec: JobSpec, rank: int) -> None:
        """Delete, with no grace, the pod of the node hosting `rank` (as if its node vanished)."""
        index = m.pod_index_for_rank(spec, rank)
        pods = [p for p in self._attempt_pods(job_id, attempt, spec) if completion_index(p) == index]
        if not pods:
            raise KubernetesBackendError(
                f"node_loss: no live pod for rank {rank} (node rank {index}); is the attempt running?",
                retryable=True,
            )
        pod = pods[0]
        pod_name = pod["metadata"]["name"]
        node = pod.get("spec", {}).get("nodeName") or ""
        job_name = m.attempt_name(job_id, spec.name, attempt)
        # Remember which node this fault took down: status() blames it (and the supervisor excludes it).
        with failure_of("annotate job"):
            batch = self.api.batch
            job = self.api.read("read job", batch.read_namespaced_job, job_name, spec.namespace)
            lost = injected_node_loss(job)
            lost[pod_name] = node
            patch = {"metadata": {"annotations": {m.ANNOTATION_INJECTED_NODE_LOSS: json.dumps(lost)}}}
            self.api.call("annotate job", batch.patch_namespaced_job, job_name, spec.namespace, patch)
        ns = spec.namespace
        self.api.delete("pod", self.api.core.delete_namespaced_pod, pod_name, ns, grace_period_seconds=0)
        log.info("injected node_loss: deleted pod %s on node %s (rank %d)", pod_name, node or "?", rank)

    def _signal_rank(self, job_id: str, attempt: int, spec: JobSpec, rank: int, signal: str) -> None:
        """Send SIGKILL/SIGSTOP to the worker process of `rank`, found through exec in its pod.

        The pod expected to host the rank is asked first; should the rendezvous have
        placed ranks otherwise, the other pods are asked after it.
        """
        preferred = m.pod_index_for_rank(spec, rank)
        pods = [p for p in self._attempt_pods(job_id, attempt, spec) if phase(p) == "Running"]
        pods.sort(key=lambda p: completion_index(p) != preferred)
        if not pods:
            raise KubernetesBackendError(f"no running pod to signal rank {rank} in", retryable=True)
        outputs = []
        for pod in pods:
            name = pod["metadata"]["name"]
            command = ["sh", "-c", SIGNAL_RANK_SCRIPT, "ftplane-fault", signal, str(rank)]
            with failure_of(f"exec in pod {name}"):
                output = self._exec(name, spec.namespace, command)
            if "ftplane-fault: signalled" in output:
                log.info("injected SIG%s into rank %d in pod %s: %s", signal, rank, name, output.strip())
                return
            outputs.append(f"{name}: {output.strip() or 'no output'}")
        raise KubernetesBackendError(f"could not signal rank {rank}: " + "; ".join(outputs), retryable=True)

    def _exec(self, pod: str, namespace: str, command: list[str]) -> str:
        """Run `command` in the trainer container and return its output (stdout and stderr)."""
        from kubernetes.stream import stream

        log.debug("exec in %s/%s: %s", namespace, pod, shlex.join(command[:2]))
        output = stream(
            self.api.core.connect_get_namespaced_pod_exec,
            pod,
            namespace,
            command=command,
            container=m.CONTAINER_NAME,
            stderr=True,
            stdin=False,
            stdout=True,
            tty=False,
            _request_timeout=self.exec_timeout_s,
        )
        return output if isinstance(output, str) else str(output)
