"""Node reports that waited too long for their turn are refused at once, before the API reads them.

When more reports come at once than an API process answers within the agents' read timeout (5 s), as when the
16,384 agents of a 131,072-GPU job flush together at its end, the process worked through reports whose agents had
given up, while their resends overflowed its listen queue: nothing was answered for ~20 s (bench/RESULTS.md, scale,
2026-12-07 morning). So a report whose request waited on the event loop longer than `FTPLANE_REPORT_MAX_WAIT_S`
(from when its first bytes were parsed, api/core/arrival.py) is answered 503 with Retry-After before its body is
read: that costs microseconds instead of the report's work. Its agent keeps everything and sends it again after that
wait. Measured in that story (bench/RESULTS.md, scale, 2026-12-07 late morning): ~10,700 of the last flush's 16,384
reports refused at once, but time spent in the kernel before the loop reads a request is not counted, ~7,700 still
timed out, and the events lost there did not fall.

Retry-After is drawn at random between 1 s and 1 + (reports refused late in the last second) / (reports taken up
in the last second): the refused come back spread over the time this process needs to take them up at its present
pace. At most `contract.retry_after_max_s` (two of the job's report intervals, as the busy-server 503 of
admission.py): the node's liveness, not taken from a report that was not read, is then still well inside its
heartbeat timeout.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from typing import Any

from api.core.arrival import waited_s
from api.core.config import get_settings
from api.services.ingest import caches
from ftplane import contract

_REPORT_PATH = re.compile(r"^/v1/jobs/([^/]+)/reports$")


class Pace:
    """Reports refused late and reports taken up, counted in whole seconds: this one and the one before."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._second = 0
        self._now = [0, 0]  # refused, taken up, in the current second
        self._last = [0, 0]  # in the second before it

    def count(self, refused: bool) -> None:
        with self._lock:
            self._roll()
            self._now[0 if refused else 1] += 1

    def retry_after(self, interval_s: float) -> int:
        """Seconds a refused report's agent should wait (the module's rule)."""
        with self._lock:
            self._roll()
            refused, taken = max(self._now[0], self._last[0]), max(self._now[1], self._last[1])
        ceiling = min(contract.retry_after_max_s(interval_s), 1 + refused / max(1, taken))
        return max(1, round(random.uniform(1, max(1.0, ceiling))))

    def _roll(self) -> None:
        second = int(time.monotonic())
        if second != self._second:
            self._last = self._now if second == self._second + 1 else [0, 0]
            self._now = [0, 0]
            self._second = second


_pace = Pace()


class RefuseLateReports:
    """Pure ASGI middleware, outermost: a node report that waited longer than the bound is refused unread."""

    def __init__(self, app: Any, max_wait_s: float | None = None) -> None:
        self.app = app
        self.max_wait_s = get_settings().report_max_wait_s if max_wait_s is None else max_wait_s

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            waited = waited_s(scope)
            report = _REPORT_PATH.match(scope.get("path", "")) if waited is not None else None
            if report is not None and waited is not None:
                late = waited > self.max_wait_s
                _pace.count(refused=late)
                if late:
                    await _refuse(send, waited, _pace.retry_after(_interval_of(report.group(1))))
                    return
        await self.app(scope, receive, send)


def _interval_of(job_id: str) -> float:
    """The job's report interval where its state is cached (never a database read here), else 1 s."""
    found, state = caches.cached_job(job_id)
    return state.report_interval_s if found and state is not None else 1.0


async def _refuse(send: Any, waited: float, retry_after: int) -> None:
    message = f"this server is busy: the report waited {waited:.1f} s for its turn; send it again after Retry-After"
    body = json.dumps({"error": {"status": 503, "message": message}}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(retry_after).encode()),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})
