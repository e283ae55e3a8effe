"""The Events an attempt's reading needs, read sparingly: kube-apiserver keeps no watch cache for Events
(its default `--watch-cache-sizes` leaves events out), so every list of Events is served from etcd, and a
field-selected list (`involvedObject.name=...`) makes the API server read every Event of the namespace to
filter them. A few pods' Events a pass, not a list per troubled pod every pass.

`EventReader` reads, for a view that asks for Events (`AttemptView.needs_events`): the Job's own, and those
of the pods that need explaining (`AttemptView.event_pods`: pods whose own status does not say why, never
the healthy ones), at most LISTS_PER_PASS lists a pass (the Job's counted), the pods never read first, then
the longest unread; each list is kept and reused for REFRESH_S. What a pass reads thus stays bounded however
many of a 2,048-pod attempt's pods are in trouble; the rest are read on the next passes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from workers.backends.kubernetes.client import KubernetesApi

if TYPE_CHECKING:
    from workers.backends.kubernetes.status import AttemptView

LISTS_PER_PASS = 3
REFRESH_S = 15.0
FORGET_S = 600.0


class EventReader:
    """Events by involved object, listed by field selector within a budget per pass, kept for REFRESH_S."""

    def __init__(
        self,
        api: KubernetesApi,
        *,
        clock: Callable[[], float] = time.time,
        lists_per_pass: int = LISTS_PER_PASS,
        refresh_s: float = REFRESH_S,
    ) -> None:
        self.api = api
        self._clock = clock
        self.lists_per_pass = lists_per_pass
        self.refresh_s = refresh_s
        self._kept: dict[tuple[str, str], tuple[float, list[dict[str, Any]]]] = {}
        self._lock = threading.Lock()

    def _list(self, ns: str, selector: str) -> list[dict[str, Any]]:
        page = self.api.read("list events", self.api.core.list_namespaced_event, ns, field_selector=selector)
        return list(page.get("items", []))

    def _due(self, key: tuple[str, str], now: float) -> bool:
        kept = self._kept.get(key)
        return kept is None or now - kept[0] >= self.refresh_s

    def read(self, view: AttemptView, job: dict[str, Any], ns: str) -> list[dict[str, Any]]:
        """The Job's and the troubled pods' Events, as kept or listed now within this pass's budget."""
        now = self._clock()
        budget = self.lists_per_pass
        job_key = (ns, f"involvedObject.kind=Job,involvedObject.uid={job['metadata']['uid']}")
        with self._lock:
            due = self._due(job_key, now)
        if due:
            events = self._list(*job_key)
            budget -= 1
            with self._lock:
                self._kept[job_key] = (now, events)
        with self._lock:
            job_events = list(self._kept.get(job_key, (now, []))[1])
            keys = [(ns, f"involvedObject.kind=Pod,involvedObject.name={pod}") for pod in view.event_pods(job_events)]
            stale = sorted((k for k in keys if self._due(k, now)), key=lambda k: self._kept.get(k, (float("-inf"),))[0])
        for key in stale[: max(budget, 0)]:
            events = self._list(*key)
            with self._lock:
                self._kept[key] = (now, events)
        with self._lock:
            out = job_events + [ev for k in keys for ev in self._kept.get(k, (now, []))[1]]
            self._kept = {k: v for k, v in self._kept.items() if now - v[0] < FORGET_S}
        return out
