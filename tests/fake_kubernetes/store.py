"""The fake API server's object store: Jobs, Pods, Services, Secrets and Events by kind, namespace and name.

Objects get a uid, a resourceVersion and a creationTimestamp; lists honour label
selectors (and field selectors, applied by the server); deletes cascade through
ownerReferences. Subclasses react to what happens here through two hooks,
`_created` and `_deleted` (the Job controller does).
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
from datetime import UTC, datetime
from typing import Any

KINDS = {
    "pods": ("Pod", "v1"),
    "services": ("Service", "v1"),
    "secrets": ("Secret", "v1"),
    "events": ("Event", "v1"),
    "jobs": ("Job", "batch/v1"),
}


def now_iso() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


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
        actual = "" if cur is None else str(cur)
        if (actual == value.strip()) == negate:
            return False
    return True


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def labels_of(obj: dict[str, Any]) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


def suffix() -> str:
    """The random tail of a generated name."""
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=5))


class Store:
    """The objects of the fake cluster, with the API's create/replace/patch/delete semantics."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.lock = threading.RLock()
        self.rv = itertools.count(1000)

    # --- hooks for what builds on the store

    def _created(self, plural: str, obj: dict[str, Any]) -> None:
        """Called, under the lock, after an object was stored."""

    def _deleted(self, plural: str, obj: dict[str, Any], by_user: bool) -> None:
        """Called, under the lock, after an object and its dependents were removed."""

    # --- the API's verbs

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

    def create(self, plural: str, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        kind, api_version = KINDS[plural]
        obj = copy.deepcopy(body)
        obj.setdefault("kind", kind)
        obj.setdefault("apiVersion", api_version)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + suffix()
        meta["namespace"] = ns
        meta.update(uid=str(uuid.uuid4()), resourceVersion=str(next(self.rv)), creationTimestamp=now_iso())
        if plural == "secrets" and "stringData" in obj:
            data = obj.setdefault("data", {})
            for key, value in obj.pop("stringData").items():
                data[key] = base64.b64encode(value.encode()).decode()
        if plural == "jobs":
            meta["generation"] = 1
            obj["status"] = {"active": 0, "startTime": now_iso(), "uncountedTerminatedPods": {}, "ready": 0}
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

    def replace(self, plural: str, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            old = self._stored(plural, ns, name)
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            for key in ("uid", "creationTimestamp", "namespace"):
                meta[key] = old["metadata"][key]
            meta["resourceVersion"] = str(next(self.rv))
            if plural == "secrets" and "stringData" in obj:
                plain = obj.pop("stringData")
                obj["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in plain.items()}
            self.objects[(plural, ns, name)] = obj
            return copy.deepcopy(obj)

    def patch(self, plural: str, ns: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            obj = merge_patch(self._stored(plural, ns, name), patch)
            obj["metadata"]["resourceVersion"] = str(next(self.rv))
            self.objects[(plural, ns, name)] = obj
            return copy.deepcopy(obj)

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
            obj = self.objects.pop((plural, ns, name), None)
            if obj is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            uid = obj["metadata"]["uid"]
            if policy != "Orphan":
                for (p, n, nm), dep in list(self.objects.items()):
                    owners = dep["metadata"].get("ownerReferences") or []
                    if n == ns and any(o.get("uid") == uid for o in owners):
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
    ) -> None:
        """Record an Event about `obj`, as a controller (or, with `host`, a node's kubelet) would."""
        meta = obj["metadata"]
        ts = now_iso()
        source = {"component": "kubelet", "host": host} if host else {"component": "fake-controller"}
        ev = {
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}"},
            "involvedObject": {
                "kind": obj.get("kind") or ("Pod" if "hostname" in obj.get("spec", {}) else "Job"),
                "name": meta["name"],
                "namespace": meta["namespace"],
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
        self.create("events", meta["namespace"], ev)
