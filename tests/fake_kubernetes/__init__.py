"""A small, stateful fake of the Kubernetes API, served over HTTP in-process for the real client.

- `store`: objects (Jobs, Pods, Services, Secrets, Events) per kind, namespace and
  name with a uid, resourceVersion and creationTimestamp; label and field
  selectors; deletes cascade through ownerReferences;
- `jobs`: a tiny Job controller that creates one pod per completion index
  (`<job>-<index>-<random>`) and fails or completes the Job like `backoffLimit: 0`;
- `cluster`: the simulation methods tests drive pod lifecycles with (schedule,
  run, exit, evict, lose_node, ...) and the processes exec can signal;
- `server`: `FakeKube`, all of the above behind an HTTP server, with API errors
  or delays injected on chosen calls; `websocket`: exec into pods over a real WebSocket.
"""

from tests.fake_kubernetes.server import FakeKube, Request, Rule
from tests.fake_kubernetes.store import ApiError

__all__ = ["ApiError", "FakeKube", "Request", "Rule"]
