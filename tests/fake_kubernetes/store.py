"""The fake API server's object store: objects by kind, namespace ("" for cluster-scoped Nodes) and name.

Objects get a uid, a resourceVersion and a creationTimestamp; lists honour label selectors (and field
selectors, applied by the server); deletes cascade through ownerReferences. What comes through the API
(`validate=True`) is checked as a 1.33 API server checks it (`validation`): schema, names, labels,
immutable fields, and a stale resourceVersion on an update is 409 Conflict.

Time is the store's clock: real time plus `offset` seconds (`advance` moves it), so tests can let a
node stay NotReady past a toleration without waiting. Subclasses react to what happens here through two
hooks, `_created` and `_deleted` (the Job controller does).

What a watch needs is kept too: every change of an object gives it a new resourceVersion from one counter,
a deleted object's last state is kept (a tombstone, at the resourceVersion of its deletion) until `compact`
drops it, as etcd's compaction does; a watch from a resourceVersion older than the last compaction is
answered 410 Gone (server.py).
"""

from __future__ import annotations

import base64
import copy
import itertools
import random
import re
import string
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.fake_kubernetes import validation
from tests.fake_kubernetes.errors import ApiError

KINDS = {
    "pods": ("Pod", "v1"),
    "services": ("Service", "v1"),
    "secrets": ("Secret", "v1"),
    "events": ("Event", "v1"),
    "nodes": ("Node", "v1"),
    "jobs": ("Job", "batch/v1"),
    "workloads": ("Workload", "kueue.x-k8s.io/v1beta1"),
    "localqueues": ("LocalQueue", "kueue.x-k8s.io/v1beta1"),
    "clusterqueues": ("ClusterQueue", "kueue.x-k8s.io/v1beta1"),
    "resourceflavors": ("ResourceFlavor", "kueue.x-k8s.io/v1beta1"),
}
CLUSTER_SCOPED = frozenset({"nodes", "clusterqueues", "resourceflavors"})


def iso(ts: datetime) -> str:
    return ts.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (good enough for strategic merge of maps, too)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def match_labels(selector: str | None, labels: dict[str, str]) -> bool:
    """Kubernetes label selector syntax: k=v, k==v, k!=v, k, !k, k in (a,b), k notin (a,b)."""
    if not selector:
        return True
    for term in _split_selector(selector):
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if (op == "in") != (labels.get(key) in values):
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = re.split(r"==?", term, maxsplit=1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def match_fields(selector: str | None, obj: dict[str, Any]) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        negate = "!=" in term
        path, value = re.split(r"!=|==?", term, maxsplit=1)
        cur: Any = obj
        for part in path.strip().split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        actual = "" if cur is None else str(cur).lower() if isinstance(cur, bool) else str(cur)
        if (actual == value.strip()) == negate:
            return False
    return True


def labels_of(obj: dict[str, Any]) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


def suffix() -> str:
    """The random tail of a generated name."""
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=5))


class _Counter:
    """resourceVersions: one counter for every change, whose newest value can be read without taking one."""

    def __init__(self, start: int) -> None:
        self._next = itertools.count(start)
        self.last = start - 1

    def __iter__(self) -> _Counter:
        return self

    def __next__(self) -> int:
        self.last = next(self._next)
        return self.last


class Store:
    """The objects of the fake cluster, with the API's create/replace/patch/delete semantics."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.lock = threading.RLock()
        self.rv = _Counter(1000)
        self.offset = 0.0  # seconds the fake clock is ahead of real time
        self.created_rv: dict[str, int] = {}  # uid -> the resourceVersion it was created at
        self.tombstones: list[tuple[int, str, str, dict[str, Any]]] = []  # (rv, plural, namespace, last state)
        self.compacted = 0  # resourceVersions before this one can no longer be watched from

    def current_rv(self) -> int:
        """The newest resourceVersion given so far."""
        return self.rv.last

    def compact(self) -> None:
        """etcd's compaction: what happened before now can no longer be watched from (410 Gone)."""
        with self.lock:
            self.compacted = next(self.rv)
            self.tombstones = [t for t in self.tombstones if t[0] >= self.compacted]

    # --- the clock

    def now(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.offset)

    def ts(self) -> str:
        return iso(self.now())

    def advance(self, seconds: float) -> None:
        """Move the clock; what is due by then happens (`_tick`)."""
        with self.lock:
            self.offset += seconds
            self._tick()

    def _tick(self) -> None:
        """Called, under the lock, after the clock moved."""

    # --- hooks for what builds on the store

    def _created(self, plural: str, obj: dict[str, Any]) -> None:
        """Called, under the lock, after an object was stored."""

    def _deleted(self, plural: str, obj: dict[str, Any], by_user: bool) -> None:
        """Called, under the lock, after an object and its dependents were removed."""

    def _updated(self, plural: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        """Called, under the lock, after an object was replaced or patched."""

    # --- the API's verbs

    def changes_since(
        self, plural: str, ns: str, sent: int, since: int, selected: Callable[[dict[str, Any]], bool]
    ) -> list[tuple[int, dict[str, Any]]]:
        """A watch's lines for what changed in `plural` of `ns` after resourceVersion `sent` (the caller holds the
        lock), in order: ADDED for an object created after the watch's `since`, else MODIFIED; DELETED."""
        lines = [
            (rv, "ADDED" if self.created_rv.get(o["metadata"]["uid"], 0) > since else "MODIFIED", o)
            for (p, n, _), o in self.objects.items()
            if p == plural and n == ns and (rv := int(o["metadata"]["resourceVersion"])) > sent and selected(o)
        ]
        lines += [
            (rv, "DELETED", o)
            for rv, p, n, o in self.tombstones
            if p == plural and n == ns and rv > sent and selected(o)
        ]
        return [(rv, {"type": kind, "object": copy.deepcopy(o)}) for rv, kind, o in sorted(lines, key=lambda x: x[0])]

    def get(self, plural: str, ns: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            obj = self.objects.get((plural, ns, name))
            return copy.deepcopy(obj) if obj else None

    def list(self, plural: str, ns: str | None = None, selector: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            out = [
                copy.deepcopy(o)
                for (p, n, _), o in sorted(self.objects.items())
                if p == plural and ns in (None, n) and match_labels(selector, labels_of(o))
            ]
        return out

    def create(self, plural: str, ns: str, body: dict[str, Any], *, validate: bool = False) -> dict[str, Any]:
        kind, api_version = KINDS[plural]
        obj = copy.deepcopy(body)
        obj.setdefault("kind", kind)
        obj.setdefault("apiVersion", api_version)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + suffix()
        if validate:
            if meta.get("namespace") not in (None, ns):
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            validation.check(obj)
        if plural in CLUSTER_SCOPED:
            ns = ""
        else:
            meta["namespace"] = ns
        meta.update(uid=str(uuid.uuid4()), resourceVersion=str(next(self.rv)), creationTimestamp=self.ts())
        self.created_rv[meta["uid"]] = int(meta["resourceVersion"])
        if plural == "secrets" and "stringData" in obj:
            data = obj.setdefault("data", {})
            for key, value in obj.pop("stringData").items():
                data[key] = base64.b64encode(value.encode()).decode()
        if plural == "jobs":
            meta["generation"] = 1
            obj["status"] = {"active": 0, "uncountedTerminatedPods": {}, "ready": 0}
        with self.lock:
            key = (plural, ns, meta["name"])
            if key in self.objects:
                raise ApiError(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists')
            self.objects[key] = obj
            self._created(plural, obj)
            return copy.deepcopy(obj)

    def _stored(self, plural: str, ns: str, name: str) -> dict[str, Any]:
        old = self.objects.get((plural, ns, name))
        if old is None:
            raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
        return old

    def _store_update(
        self, plural: str, ns: str, name: str, old: dict[str, Any], obj: dict[str, Any], validate: bool
    ) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        if validate:
            if meta.get("name") not in (None, name):
                raise ApiError(
                    400,
                    "BadRequest",
                    f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})",
                )
            sent = meta.get("resourceVersion")
            if sent and sent != old["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {plural} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again",
                )
        for key in ("uid", "creationTimestamp", "namespace", "name", "generation"):
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
        obj.setdefault("kind", old.get("kind"))
        obj.setdefault("apiVersion", old.get("apiVersion"))
        if "status" in old and "status" not in obj:
            obj["status"] = copy.deepcopy(old["status"])  # status is written through its subresource
        if validate:
            validation.check(obj)
            validation.check_update(plural, old, obj)
        meta["resourceVersion"] = str(next(self.rv))
        self.objects[(plural, ns, name)] = obj
        self._updated(plural, old, obj)
        return copy.deepcopy(obj)

    def replace(
        self, plural: str, ns: str, name: str, body: dict[str, Any], *, validate: bool = False
    ) -> dict[str, Any]:
        with self.lock:
            ns = "" if plural in CLUSTER_SCOPED else ns
            old = self._stored(plural, ns, name)
            obj = copy.deepcopy(body)
            if plural == "secrets" and "stringData" in obj:
                plain = obj.pop("stringData")
                obj["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in plain.items()}
            return self._store_update(plural, ns, name, old, obj, validate)

    def patch(
        self, plural: str, ns: str, name: str, patch: dict[str, Any], *, validate: bool = False
    ) -> dict[str, Any]:
        with self.lock:
            ns = "" if plural in CLUSTER_SCOPED else ns
            old = self._stored(plural, ns, name)
            obj = merge_patch(copy.deepcopy(old), patch)
            obj.setdefault("metadata", {}).pop("resourceVersion", None)
            if validate and (patch.get("metadata") or {}).get("resourceVersion"):
                obj["metadata"]["resourceVersion"] = patch["metadata"]["resourceVersion"]
            return self._store_update(plural, ns, name, old, obj, validate)

    def delete(
        self,
        plural: str,
        ns: str,
        name: str,
        policy: str | None = None,
        *,
        by_user: bool = True,
    ) -> dict[str, Any]:
        with self.lock:
            ns = "" if plural in CLUSTER_SCOPED else ns
            obj = self.objects.pop((plural, ns, name), None)
            if obj is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            uid = obj["metadata"]["uid"]
            gone = copy.deepcopy(obj)
            gone["metadata"]["resourceVersion"] = str(next(self.rv))
            self.tombstones.append((int(gone["metadata"]["resourceVersion"]), plural, ns, gone))
            if policy != "Orphan":
                for (p, n, nm), dep in list(self.objects.items()):
                    owners = dep["metadata"].get("ownerReferences") or []
                    if n == ns and any(o.get("uid") == uid for o in owners) and (p, n, nm) in self.objects:
                        self.delete(p, n, nm, policy, by_user=False)
            self._deleted(plural, obj, by_user)
            return obj

    def event(
        self,
        obj: dict[str, Any],
        reason: str,
        message: str,
        type_: str = "Normal",
        *,
        host: str | None = None,
        component: str = "fake-controller",
    ) -> None:
        """Record an Event about `obj`, as a controller (or, with `host`, a node's kubelet) would."""
        meta = obj["metadata"]
        ts = self.ts()
        source = {"component": "kubelet", "host": host} if host else {"component": component}
        namespace = meta.get("namespace") or "default"
        ev = {
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}"},
            "involvedObject": {
                "kind": obj.get("kind") or ("Pod" if "hostname" in obj.get("spec", {}) else "Job"),
                "name": meta["name"],
                "namespace": namespace,
                "uid": meta["uid"],
                "apiVersion": obj.get("apiVersion", "v1"),
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": source,
            "firstTimestamp": ts,
            "lastTimestamp": ts,
            "count": 1,
            "reportingComponent": source["component"],
        }
        self.create("events", namespace, ev)
