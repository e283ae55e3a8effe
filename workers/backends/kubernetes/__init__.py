"""The Kubernetes execution backend, one module per concept.

- `backend`: `KubernetesBackend`, the `Backend` protocol (launch, status, faults, cancel, cleanup);
- `client`: the API client loaded on first use, bounded retries, `KubernetesBackendError`;
- `manifests`: what an attempt is on Kubernetes (Job, Service, Secret), as plain dicts and YAML;
- `objects`: facts read from the API's objects (times, completion index, conditions);
- `status`: what a reading of an attempt means (`AttemptView`), with structured causes;
- `faults`: node_loss, crash and hang faults delivered through the API.
"""

from workers.backends.kubernetes.backend import KubernetesBackend
from workers.backends.kubernetes.client import KubernetesBackendError, RetryPolicy

__all__ = ["KubernetesBackend", "KubernetesBackendError", "RetryPolicy"]
