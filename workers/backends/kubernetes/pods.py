"""An attempt's pods as the backend reads them: listed once, a page at a time, then kept by a watch.

A full list of a 2,048-pod attempt is 20-30 MB of JSON (10-15 KB a pod); read every pass, it was most of
a worker's CPU and of the API server's work. `PodWatches` keeps, per attempt (namespace and label
selector), the pods as a watch reports them (https://kubernetes.io/docs/reference/using-api/api-concepts/
#efficient-detection-of-changes): a paged list (`limit` PAGE, `continue`) gives the pods and a
resourceVersion; a thread then watches from there (`allowWatchBookmarks`, so the resourceVersion stays
recent while nothing changes; each watch ends after WATCH_S and the next starts where it left off), and
lists again when the API answers 410 Gone (the resourceVersion was compacted away). A pass costs only the
changes since the last one, and reads no pod at all while nothing changes.

A deleted pod's last state (the watch's DELETED event carries it) is kept for the attempt: a pod the Job
controller removed once it had ended (its exit code, NVRx's verdict among them) or that an eviction took
away is still read. `managedFields` are dropped from what is kept. A watch nobody has read for `idle_s`
stops (and a later read lists again); `forget` stops one at once (the attempt is over). Reads are
eventually consistent, as every informer is: a pass sees the changes the watch has delivered.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from workers.backends.kubernetes.client import KubernetesApi, api_message

log = logging.getLogger(__name__)

PAGE = 500
WATCH_S = 240
DELETED_ANNOTATION = "ftplane.io/deleted"  # on a kept pod that is no longer in the API
MAX_DELETED = 8192  # last states of deleted pods kept per attempt
MAX_FAILURES = 4  # watches failing in a row: the thread ends, and the next read lists again


class Gone(Exception):
    """The resourceVersion to watch from is too old (410): list again."""


class PodWatch:
    """One attempt's pods (namespace, label selector), kept up to date by a watch thread."""

    def __init__(self, api: KubernetesApi, ns: str, selector: str, *, idle_s: float, clock: Callable[[], float]):
        self.api, self.ns, self.selector = api, ns, selector
        self.idle_s = idle_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pods: dict[str, dict[str, Any]] = {}
        self._deleted: dict[str, dict[str, Any]] = {}
        self.resource_version: str | None = None
        self.read_at = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None

    # --- reading

    def pods(self) -> list[dict[str, Any]]:
        """The pods as last seen (listed now if never listed), the deleted ones' last states among them."""
        self.read_at = self._clock()
        if self.resource_version is None:
            self.relist()
            self._start()
        with self._lock:
            return [*self._pods.values(), *self._deleted.values()]

    @property
    def applied(self) -> int:
        """The resourceVersion the kept pods are up to date with (0 before the first list)."""
        try:
            return int(self.resource_version or 0)
        except ValueError:
            return 0

    def relist(self) -> None:
        """Read every pod of the attempt, a page at a time; the watch goes on from the list's resourceVersion."""
        pods: dict[str, dict[str, Any]] = {}
        token: str | None = None
        while True:
            page = self.api.read(
                "list pods",
                self.api.core.list_namespaced_pod,
                self.ns,
                label_selector=self.selector,
                limit=PAGE,
                _continue=token,
            )
            for pod in page.get("items", []):
                pods[pod["metadata"]["name"]] = _kept(pod)
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                break
        with self._lock:
            for name in list(self._pods):  # gone between two lists: what was last seen of them is kept
                if name not in pods:
                    self._mark_deleted(self._pods[name])
            self._pods = pods
            self.resource_version = (page.get("metadata") or {}).get("resourceVersion")

    # --- watching

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"pod-watch-{self.selector}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        sock = getattr(getattr(self._response, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked reading the stream

    @property
    def idle(self) -> bool:
        return self._clock() - self.read_at > self.idle_s

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set() and not self.idle:
            try:
                self._watch_once()
                failures = 0
            except Gone:
                try:
                    self.relist()
                except Exception as exc:
                    failures += 1
                    log.warning("listing pods %s/%s again failed: %s", self.ns, self.selector, api_message(exc))
            except Exception as exc:
                if self._stop.is_set():
                    break
                failures += 1
                log.warning("watching pods %s/%s failed: %s; retrying", self.ns, self.selector, api_message(exc))
            if failures >= MAX_FAILURES:
                break
            if failures:
                self._stop.wait(min(30.0, 0.5 * 2 ** min(failures, 6)))
        self.resource_version = None  # a later read lists again (and watches anew)

    def _watch_once(self) -> None:
        response = self.api.core.list_namespaced_pod(
            self.ns,
            label_selector=self.selector,
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_S,
            _preload_content=False,
            _request_timeout=(self.api.request_timeout[0], WATCH_S + 30),
        )
        self._response = response
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    return
                if line:
                    self._apply(json.loads(line))
        finally:
            self._response = None
            response.release_conn()

    def _apply(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(obj.get("message"))
            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
        meta = obj.get("metadata") or {}
        with self._lock:
            if kind in ("ADDED", "MODIFIED"):
                self._pods[meta["name"]] = _kept(obj)
            elif kind == "DELETED":
                self._pods.pop(meta["name"], None)
                self._mark_deleted(_kept(obj))
            if meta.get("resourceVersion"):
                self.resource_version = meta["resourceVersion"]

    def _mark_deleted(self, pod: dict[str, Any]) -> None:
        gone = copy.deepcopy(pod)
        gone["metadata"].setdefault("annotations", {})[DELETED_ANNOTATION] = "true"
        gone["metadata"].setdefault("deletionTimestamp", gone["metadata"].get("creationTimestamp"))
        self._deleted[gone["metadata"]["name"]] = gone
        while len(self._deleted) > MAX_DELETED:
            self._deleted.pop(next(iter(self._deleted)))


def _kept(pod: dict[str, Any]) -> dict[str, Any]:
    pod.get("metadata", {}).pop("managedFields", None)
    return pod


class PodWatches:
    """The watches of the attempts whose status is read, by (namespace, label selector)."""

    def __init__(self, api: KubernetesApi, *, idle_s: float = 600.0, clock: Callable[[], float] = time.monotonic):
        self.api = api
        self.idle_s = idle_s
        self._clock = clock
        self._lock = threading.Lock()
        self._watches: dict[tuple[str, str], PodWatch] = {}
        self.closed = False

    def pods(self, ns: str, selector: str) -> list[dict[str, Any]]:
        with self._lock:
            if self.closed:
                raise RuntimeError("the backend was closed")
            for key, old in list(self._watches.items()):  # the idle ones have stopped: let them go
                if old.idle:
                    old.stop()
                    del self._watches[key]
            found = self._watches.get((ns, selector))
            if found is None:
                found = self._watches[(ns, selector)] = PodWatch(
                    self.api, ns, selector, idle_s=self.idle_s, clock=self._clock
                )
        return found.pods()

    def get(self, ns: str, selector: str) -> PodWatch | None:
        with self._lock:
            return self._watches.get((ns, selector))

    def forget(self, ns: str, selector: str) -> None:
        with self._lock:
            watch = self._watches.pop((ns, selector), None)
        if watch is not None:
            watch.stop()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            watches, self._watches = list(self._watches.values()), {}
        for watch in watches:
            watch.stop()
