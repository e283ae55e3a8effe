"""The agent's one conversation with the control plane: a batched node report per interval.

Each report is one `POST /v1/jobs/{job}/reports` carrying the node's liveness (agent, launcher,
each rank's process, GPU health), the newest heartbeat of every rank that sent one, and the
events queued since the last report. The training side never waits on it:

- events are kept, in order, until the control plane accepts them; each carries an idempotency
  key made once, so a report resent after a lost reply stores it once. A new event is sent at
  once rather than at the next interval;
- heartbeats and the node's liveness are soft state: only the newest per rank (and the newest
  liveness) is kept, so an outage costs memory for one heartbeat per rank;
- 408/425/429/5xx and connection errors are retried with exponential backoff and jitter
  (capped), honouring Retry-After; other 4xx drop what was sent, with a warning: resending
  would never succeed;
- a reply may carry fault directives for this node, handed to `on_faults`.

`ReportBuffer` holds the state and decides what the next report carries and what a reply
means, with no I/O of its own; `Uplink` drives it from a thread with httpx. The scale benchmark
drives thousands of buffers through the same class. The token is sent in the Authorization
header and never logged.
"""

from __future__ import annotations

import collections
import email.utils
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

log = logging.getLogger(__name__)

MAX_EVENTS_PER_REPORT = 1000
MAX_HEARTBEATS_PER_REPORT = 20000
RETRYABLE_STATUS = frozenset({408, 425, 429})
MAX_RETRY_AFTER_S = 60.0


def utcnow_iso() -> str:
    return datetime.now(UTC).isoformat()


def new_key() -> str:
    return uuid.uuid4().hex


def retry_after_seconds(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = (when - datetime.now(UTC)).total_seconds()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


@dataclass
class Report:
    """One report taken from the buffer: what a POST carries."""

    events: list[dict[str, Any]]
    heartbeats: list[dict[str, Any]]
    status: dict[str, Any] | None

    def body(self, attempt: int, node: str) -> dict[str, Any]:
        return {
            "attempt": attempt,
            "node": node,
            "agent": self.status or {},
            "heartbeats": self.heartbeats,
            "events": self.events,
        }


@dataclass
class Outcome:
    """What became of one POST."""

    ok: bool
    retry: bool = False  # not accepted, worth sending again
    retry_after: float | None = None
    reason: str = ""
    reply: Any = None


def classify(status: int, text: str, retry_after: str | None, path: str) -> Outcome:
    if 200 <= status < 300:
        return Outcome(ok=True)
    reason = f"HTTP {status} from {path}: {text[:200]!r}"
    if status in RETRYABLE_STATUS or status >= 500:
        return Outcome(ok=False, retry=True, retry_after=retry_after_seconds(retry_after), reason=reason)
    return Outcome(ok=False, reason=reason)


@dataclass
class ReportBuffer:
    """What the node has to tell the control plane, and when; no I/O. Not thread-safe by itself: `Uplink`
    holds a lock around every call."""

    interval_s: float = 1.0
    backoff_base_s: float = 0.2
    backoff_cap_s: float = 5.0
    max_events: int = 100_000
    events: collections.deque[dict[str, Any]] = field(default_factory=collections.deque)
    heartbeats: dict[int, dict[str, Any]] = field(default_factory=dict)
    status: dict[str, Any] | None = None
    status_changed: bool = False
    failures: int = 0  # consecutive failed reports: drives the backoff
    retry_at: float = 0.0  # monotonic time before which nothing is sent
    next_report_at: float = 0.0
    dropped_events: int = 0
    sent_events: int = 0
    sent_heartbeats: int = 0
    reports: int = 0

    # ---- what the node adds ----

    def add_event(self, event: dict[str, Any]) -> bool:
        if len(self.events) >= self.max_events:
            self.dropped_events += 1
            return False
        self.events.append(event)
        return True

    def add_heartbeat(self, beat: dict[str, Any]) -> None:
        self.heartbeats[int(beat["rank"])] = beat

    def set_status(self, status: dict[str, Any]) -> None:
        self.status = status
        self.status_changed = True

    # ---- what the next report carries ----

    def due_in(self, now: float, flushing: bool = False) -> float | None:
        """Seconds until a report should be sent (0: now); None when there is nothing to send."""
        if now < self.retry_at and not flushing:
            return self.retry_at - now
        if self.events:
            return 0.0
        if self.heartbeats or self.status_changed:
            return 0.0 if flushing else max(self.next_report_at - now, 0.0)
        return None

    def take(self, now: float) -> Report:
        """The next report: the oldest events (they stay queued until accepted), every newest heartbeat."""
        events = [self.events[i] for i in range(min(len(self.events), MAX_EVENTS_PER_REPORT))]
        beats = list(self.heartbeats.values())[:MAX_HEARTBEATS_PER_REPORT]
        for beat in beats:
            del self.heartbeats[int(beat["rank"])]
        self.status_changed = False
        self.next_report_at = now + self.interval_s
        return Report(events, beats, self.status)

    def settle(self, report: Report, outcome: Outcome, now: float) -> None:
        """Apply what became of `report`: drop what was accepted (or refused for good), keep the rest."""
        if outcome.retry:
            self.failures += 1
            ceiling = min(self.backoff_cap_s, self.backoff_base_s * 2 ** (self.failures - 1))
            delay = ceiling / 2 + random.uniform(0, ceiling / 2)
            if outcome.retry_after is not None:
                delay = max(delay, outcome.retry_after)
            self.retry_at = now + delay
            for beat in report.heartbeats:
                self.heartbeats.setdefault(int(beat["rank"]), beat)  # a newer one wins
            self.status_changed = True
            return
        self.failures = 0
        self.reports += 1
        sent = {e["key"] for e in report.events}
        while self.events and self.events[0]["key"] in sent:
            self.events.popleft()
        if outcome.ok:
            self.sent_events += len(report.events)
            self.sent_heartbeats += len(report.heartbeats)

    def retry_delay(self) -> float:
        return max(self.retry_at - time.monotonic(), 0.0)


class Uplink:
    """Drives a ReportBuffer from a daemon thread: POSTs node reports to the control plane."""

    def __init__(
        self,
        url: str | None,
        job_id: str | None,
        attempt: int,
        token: str | None,
        node: str,
        *,
        interval_s: float = 1.0,
        backoff_base_s: float = 0.2,
        backoff_cap_s: float = 5.0,
        request_timeout_s: float = 5.0,
        max_events: int = 100_000,
        on_faults: Callable[[list[dict[str, Any]]], None] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.enabled = bool(url)
        if self.enabled and not job_id:
            raise ValueError("FTPLANE_JOB_ID is required when FTPLANE_URL is set")
        self.job_id = job_id
        self.attempt = attempt
        self.node = node
        self.on_faults = on_faults
        self.buffer = ReportBuffer(
            interval_s=interval_s, backoff_base_s=backoff_base_s, backoff_cap_s=backoff_cap_s, max_events=max_events
        )
        self._cond = threading.Condition()
        self._in_flight = 0
        self._flushing = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._client: httpx.Client | None = None
        self.path = f"/v1/jobs/{job_id}/reports"
        if self.enabled:
            assert url is not None
            headers = {"User-Agent": "ftplane-agent"}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            self._client = httpx.Client(
                base_url=url.rstrip("/"),
                headers=headers,
                timeout=httpx.Timeout(request_timeout_s, connect=min(2.0, request_timeout_s)),
                transport=transport,
            )
            self._thread = threading.Thread(target=self._run, name="ftplane-uplink", daemon=True)
            self._thread.start()

    # ---- the node's side: O(1), never waits on the network ----

    def event(
        self,
        type: str,
        *,
        rank: int | None = None,
        step: int | None = None,
        details: dict[str, Any] | None = None,
        key: str | None = None,
        ts: str | None = None,
        attempt: int | None = None,
    ) -> str:
        """Queue an event of this node; returns its idempotency key."""
        item = {
            "key": key or new_key(),
            "type": type,
            "ts": ts or utcnow_iso(),
            "attempt": self.attempt if attempt is None else attempt,
            "rank": rank,
            "node": self.node,
            "step": step,
            "details": dict(details or {}),
        }
        self.forward_event(item)
        return str(item["key"])

    def forward_event(self, event: dict[str, Any]) -> None:
        """Queue an event as a rank made it (its key, time and rank kept; the node and attempt filled in)."""
        if not self.enabled:
            return
        event.setdefault("node", self.node)
        if event.get("attempt") is None:
            event["attempt"] = self.attempt
        with self._cond:
            kept = self.buffer.add_event(event)
            self._cond.notify()
        if not kept:
            log.warning(
                "event queue full (%d): dropped %s event %s", self.buffer.max_events, event["type"], event["key"]
            )

    def heartbeat(self, beat: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self._cond:
            self.buffer.add_heartbeat(beat)
            self._cond.notify()

    def status(self, status: dict[str, Any]) -> None:
        """The node's newest liveness; sent with the next report."""
        if not self.enabled:
            return
        with self._cond:
            self.buffer.set_status(status)
            self._cond.notify()

    def pending(self) -> tuple[int, int]:
        """(events, heartbeats) not yet accepted."""
        with self._cond:
            return len(self.buffer.events), len(self.buffer.heartbeats)

    def flush(self, timeout: float) -> bool:
        """Send now, skipping any backoff wait, and wait up to `timeout` s until everything queued is
        accepted (or refused for good); True if so."""
        if not self.enabled:
            return True
        deadline = time.monotonic() + timeout
        with self._cond:
            self._flushing += 1
            self.buffer.retry_at = 0.0
            self._cond.notify_all()
            try:
                while self.buffer.events or self.buffer.heartbeats or self.buffer.status_changed or self._in_flight:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                return True
            finally:
                self._flushing -= 1

    def close(self, timeout: float = 5.0) -> bool:
        """Flush (bounded), then stop the thread. Returns whether everything was delivered."""
        if not self.enabled:
            return True
        delivered = self.flush(timeout)
        if not delivered:
            events, beats = self.pending()
            log.warning("closing with %d event(s) and %d heartbeat(s) undelivered", events, beats)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if self._client is not None and (self._thread is None or not self._thread.is_alive()):
            self._client.close()
        return delivered

    # ---- the thread ----

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return
                    wait = self.buffer.due_in(time.monotonic(), flushing=self._flushing > 0)
                    if wait == 0.0:
                        break
                    self._cond.wait(wait)
                report = self.buffer.take(time.monotonic())
                self._in_flight += 1
            outcome = self._post(report)
            with self._cond:
                self.buffer.settle(report, outcome, time.monotonic())
                self._in_flight -= 1
                failures = self.buffer.failures
                self._cond.notify_all()
            if outcome.retry:
                level = logging.WARNING if failures in (1, 10) or failures % 100 == 0 else logging.DEBUG
                log.log(
                    level,
                    "node report failed (%s); retry %d in %.1f s",
                    outcome.reason,
                    failures,
                    self.buffer.retry_delay(),
                )
            elif not outcome.ok:
                log.warning("control plane refused a node report (dropped): %s", outcome.reason)
            faults = outcome.reply.get("faults") if isinstance(outcome.reply, dict) else None
            if faults and self.on_faults is not None:
                try:
                    self.on_faults(list(faults))
                except Exception:
                    log.exception("handling fault directives failed")

    def _post(self, report: Report) -> Outcome:
        assert self._client is not None
        try:
            response = self._client.post(self.path, json=report.body(self.attempt, self.node))
        except httpx.TransportError as exc:
            return Outcome(ok=False, retry=True, reason=f"{type(exc).__name__}: {exc}")
        outcome = classify(response.status_code, response.text, response.headers.get("Retry-After"), self.path)
        if outcome.ok:
            try:
                outcome.reply = response.json()
            except ValueError:
                outcome.reply = None
        return outcome
