"""A small, stateful fake of the Kubernetes API (1.33), served over HTTP in-process for the real client.

- `store`: objects (Jobs, Pods, Services, Secrets, Events, Nodes, Kueue Workloads) per kind, namespace
  and name with a uid, resourceVersion and creationTimestamp; label and field selectors; deletes cascade
  through ownerReferences; a clock tests can move (`advance`);
- `validation`: what a real API server refuses through the API, with the same `Status` (schema of the
  1.33 OpenAPI, names, labels, immutable fields, on create, PUT and PATCH);
- `jobs`: the Job controller: pods per completion index, suspension, `podFailurePolicy`, per-index
  backoff and `maxFailedIndexes`, and the Job's end as they decide it;
- `scheduler`: Node objects, and binding pods to nodes that fit their requests, tolerate their taints
  and match their node selector and affinity (else Pending with the scheduler's message);
- `cluster`: kubelets and the node lifecycle (run, exit, evictions, image and mount failures, nodes
  NotReady then their pods terminating after their toleration, the Eviction API, drains);
- `kueue`: Workloads, admission and preemption of suspended Jobs;
- `pod_logs`: the `pods/log` subresource: containers' logs with tailLines, sinceSeconds/sinceTime,
  timestamps, limitBytes and follow, as the API server checks them and the kubelet serves them;
- `server`: `FakeKube`, all of the above behind an HTTP server, with API errors or delays injected on
  chosen calls.
"""

from tests.fake_kubernetes.errors import ApiError
from tests.fake_kubernetes.server import FakeKube, Request, Rule

__all__ = ["ApiError", "FakeKube", "Request", "Rule"]
