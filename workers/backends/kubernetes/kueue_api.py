"""Reading a queued attempt's Kueue Workload in the version of the Workload API the cluster serves.

Kueue served its API as v1beta1, and from 0.15 also as v1beta2 (https://kueue.sigs.k8s.io/docs/reference/); a
cluster may serve either or both. Which is served is discovered (`GET /apis`, the APIGroupList; any
authenticated caller may read it, the system:discovery role) and kept DISCOVERY_S; v1beta2 is used where it
is served. Only a cluster whose discovery lists no kueue.x-k8s.io group has no Kueue: a 404 on the Workloads
themselves (a namespace, a version gone since discovery) is an error to retry, not "Kueue is not installed".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from workers.backends.kubernetes.client import KubernetesApi
from workers.backends.kubernetes.kueue import JOB_UID_LABEL, WORKLOAD_GROUP, WORKLOAD_PLURAL

PREFERRED_VERSIONS = ("v1beta2", "v1beta1")
DISCOVERY_S = 300.0


class Workloads:
    """The Workload of a queued Job, read in a served version of Kueue's API."""

    def __init__(self, api: KubernetesApi, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self._clock = clock
        self._lock = threading.Lock()
        self._version: str | None = None
        self._discovered_at = float("-inf")

    def version(self) -> str | None:
        """The Workload API version to read (None: this cluster serves no Kueue API), discovered at most every
        DISCOVERY_S."""
        with self._lock:
            if self._clock() - self._discovered_at < DISCOVERY_S:
                return self._version
        groups = self.api.read("discover API groups", k8s_client.ApisApi(self.api.api_client).get_api_versions)
        served = [
            v["version"]
            for g in groups.get("groups") or []
            if g.get("name") == WORKLOAD_GROUP
            for v in g.get("versions") or []
        ]
        version = next((v for v in PREFERRED_VERSIONS if v in served), served[0] if served else None)
        with self._lock:
            self._version, self._discovered_at = version, self._clock()
        return version

    def of_job(self, job: dict[str, Any], ns: str) -> tuple[dict[str, Any] | None, bool]:
        """(the Job's Workload or None when Kueue has not made it yet, whether Kueue is missing from the cluster)."""
        version = self.version()
        if version is None:
            return None, True
        try:
            found = self.api.read(
                "list workloads",
                self.api.custom.list_namespaced_custom_object,
                WORKLOAD_GROUP,
                version,
                ns,
                WORKLOAD_PLURAL,
                label_selector=f"{JOB_UID_LABEL}={job['metadata']['uid']}",
            ).get("items", [])
        except ApiException as exc:
            if exc.status == 404:
                with self._lock:
                    self._discovered_at = float("-inf")  # discover again: the served versions may have changed
            raise
        return (found[0] if found else None), False
