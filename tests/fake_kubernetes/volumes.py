"""The fake's volumes: files on PersistentVolumeClaims, seen by pods through their containers' `volumeMounts`.

A claim is a file tree shared by every pod that mounts it (ReadWriteMany, as FSx for Lustre is). A container
sees, at a mount's `mountPath`, the claim's root or, with `subPath`, that directory of the claim (the kubelet
creates it when it is missing: https://kubernetes.io/docs/concepts/storage/volumes/#using-subpath); a mount with
`readOnly: true` refuses writes (EROFS). A path under no mount is the container's own writable layer, gone with
the pod. Tests write and list files as a pod's trainer would (`pod_write`, `pod_list`) and read a claim as a
whole (`claim_files`): two jobs that share a claim collide here as they would on the file system.
"""

from __future__ import annotations

import errno
import posixpath
from typing import Any

from tests.fake_kubernetes.store import Store


class Volumes(Store):
    """Claims with files, and pods' views of them."""

    def __init__(self) -> None:
        super().__init__()
        self._claims: dict[tuple[str, str], dict[str, bytes]] = {}  # (namespace, claim) -> path -> content
        self._layers: dict[str, dict[str, bytes]] = {}  # pod uid -> its container's own files

    def claim_files(self, ns: str, claim: str) -> dict[str, bytes]:
        with self.lock:
            return dict(self._claims.get((ns, claim), {}))

    def _resolve(self, pod: dict[str, Any], path: str) -> tuple[dict[str, bytes], str, bool]:
        """(the file tree, the path in it, read-only) of `path` as the pod's trainer container sees it."""
        path = posixpath.normpath(path)
        container = pod["spec"]["containers"][0]
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        best: dict[str, Any] | None = None
        for mount in container.get("volumeMounts") or []:
            root = posixpath.normpath(mount["mountPath"])
            if (path == root or path.startswith(root + "/")) and (best is None or len(root) > len(best["mountPath"])):
                best = {**mount, "mountPath": root}
        claim = (volumes.get(best["name"], {}).get("persistentVolumeClaim") if best else None) or None
        if best is None or claim is None:
            return self._layers.setdefault(pod["metadata"]["uid"], {}), path, False
        rest = posixpath.relpath(path, best["mountPath"])
        inside = posixpath.normpath(posixpath.join(best.get("subPath") or ".", rest))
        if inside.startswith(".."):
            raise PermissionError(errno.EACCES, "outside the volume", path)
        tree = self._claims.setdefault((pod["metadata"]["namespace"], claim["claimName"]), {})
        return tree, inside, bool(best.get("readOnly"))

    def _pod_by_name(self, ns: str, name: str) -> dict[str, Any]:
        return self.objects[("pods", ns, name)]

    def pod_write(self, ns: str, pod_name: str, path: str, data: bytes = b"") -> None:
        """The pod's trainer writes a file."""
        with self.lock:
            tree, inside, read_only = self._resolve(self._pod_by_name(ns, pod_name), path)
            if read_only:
                raise OSError(errno.EROFS, "Read-only file system", path)
            tree[inside] = data

    def pod_list(self, ns: str, pod_name: str, path: str) -> list[str]:
        """The names in a directory, as the pod's trainer sees it."""
        with self.lock:
            tree, inside, _ = self._resolve(self._pod_by_name(ns, pod_name), path)
            prefix = "" if inside == "." else inside + "/"
            return sorted({p[len(prefix) :].split("/")[0] for p in tree if p.startswith(prefix)})

    def _deleted(self, plural: str, obj: dict[str, Any], by_user: bool) -> None:
        super()._deleted(plural, obj, by_user)
        if plural == "pods":
            self._layers.pop(obj["metadata"]["uid"], None)
