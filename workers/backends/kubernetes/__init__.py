"""The Kubernetes execution backend, one module per concept.

- `backend`: `KubernetesBackend`, the `Backend` protocol (launch, status, cancel, cleanup), and what it reads;
- `client`: the API client loaded on first use, bounded retries, `KubernetesBackendError`;
- `manifests`: what an attempt is on Kubernetes (Job, Service, token Secret), as plain dicts and YAML;
- `placement`: where the pods may run (tolerations, node selector, affinity, exclusions, who they run as);
- `policy`: what a pod's failure means to the Job (podFailurePolicy, exit codes, hot spares) and Kueue's fields;
- `efa`: what a pod asking for EFA needs besides the devices (NCCL/EFA environment, IPC_LOCK, the EFA check);
- `objects`: facts read from the API's objects (times, completion index, conditions, container states);
- `status`: what a reading of an attempt means (`AttemptView`), with structured causes;
- `failures`: what one pod's failure means (its cause, whether its node is blamed, whether a spare replaces it);
- `pending`: why an attempt is not running yet;
- `nodes`: node health (Node conditions, read a page at a time) and the optional cordon or taint;
- `kueue`: a queued attempt's state (waiting, admitted, preempted).
"""

from workers.backends.kubernetes.backend import KubernetesBackend
from workers.backends.kubernetes.client import KubernetesBackendError, RetryPolicy

__all__ = ["KubernetesBackend", "KubernetesBackendError", "RetryPolicy"]
