"""Reports heartbeats and events to the control plane from a background thread.

The training loop only ever enqueues (O(1), under a lock held for a few
instructions, never across the network). A daemon thread batches what is
queued and POSTs it:

- events (`/v1/jobs/{job}/events`) are kept, in order, until the control plane
  accepts them; each carries an idempotency key generated once, so a retry
  after a lost reply is stored once;
- heartbeats (`/v1/jobs/{job}/heartbeats`) are coalesced: only the newest per
  rank is kept, so an outage costs memory for one heartbeat per rank;
- 408/429/5xx and connection errors are retried with exponential backoff and
  jitter (capped), honouring Retry-After; 401/403/404/422 (and other 4xx) drop
  the batch with a warning: retrying would never succeed;
- heartbeat replies may carry fault directives, handed to `on_faults`.

Without a URL the reporter is a no-op, so the trainer runs standalone.
The token is sent in the Authorization header and never logged.
"""

from __future__ import annotations

import collections
import email.utils
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx

log = logging.getLogger(__name__)

MAX_EVENTS_PER_REQUEST = 1000
MAX_HEARTBEATS_PER_REQUEST = 20000
MAX_DETAILS_KEYS = 64
RETRYABLE_STATUS = frozenset({408, 425, 429})
MAX_RETRY_AFTER_S = 60.0


def utcnow_iso() -> str:
    return datetime.now(UTC).isoformat()


def new_key() -> str:
    return uuid.uuid4().hex


class _Retry(Exception):
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class _Drop(Exception):
    pass


def _retry_after_seconds(value: str | None) -> float | None:
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


class Reporter:
    """Heartbeats and events for one trainer process (it may report for several ranks)."""

    def __init__(
        self,
        url: str | None,
        job_id: str | None,
        attempt: int,
        token: str | None,
        *,
        node: str | None = None,
        report_interval_s: float = 1.0,
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
        # On Kubernetes the backend passes the node name (what it blames and excludes), not the pod name.
        self.node = node or os.environ.get("FTPLANE_NODE_NAME") or socket.gethostname()
        self.report_interval_s = report_interval_s
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.max_events = max_events
        self.on_faults = on_faults

        self._cond = threading.Condition()
        self._events: collections.deque[dict[str, Any]] = collections.deque()
        self._heartbeats: dict[int, dict[str, Any]] = {}
        self._in_flight = 0
        self._failures = 0  # consecutive failed requests, drives the backoff
        self._retry_at = 0.0  # monotonic time before which nothing is sent
        self._next_heartbeat_at = 0.0
        self._flushing = 0
        self._stopping = False
        self.dropped_events = 0
        self.sent_events = 0
        self.sent_heartbeats = 0
        self._thread: threading.Thread | None = None
        self._client: httpx.Client | None = None
        if self.enabled:
            assert url is not None
            base = url.rstrip("/")
            headers = {"User-Agent": "ftplane-trainer"}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            self._client = httpx.Client(
                base_url=base,
                headers=headers,
                timeout=httpx.Timeout(request_timeout_s, connect=min(2.0, request_timeout_s)),
                transport=transport,
            )
            self._events_path = f"/v1/jobs/{job_id}/events"
            self._heartbeats_path = f"/v1/jobs/{job_id}/heartbeats"
            self._thread = threading.Thread(target=self._run, name="ftplane-reporter", daemon=True)
            self._thread.start()

    # --- the training loop's side: O(1), never waits on the network -------------------------------

    def heartbeat(self, rank: int, step: int, *, throughput: float | None = None, loss: float | None = None) -> None:
        if not self.enabled:
            return
        beat = {
            "rank": rank,
            "step": step,
            "ts": utcnow_iso(),
            "node": self.node,
            "throughput": throughput,
            "loss": loss if loss is None or loss == loss else None,  # NaN is not JSON
        }
        with self._cond:
            self._heartbeats[rank] = beat
            self._cond.notify()

    def event(
        self,
        type: str,
        *,
        rank: int | None,
        step: int | None = None,
        details: dict[str, Any] | None = None,
        key: str | None = None,
    ) -> str:
        """Queue an event; returns its idempotency key (generated once, reused on every retry)."""
        key = key or new_key()
        if not self.enabled:
            return key
        details = dict(details or {})
        if len(details) > MAX_DETAILS_KEYS:
            raise ValueError(f"event details have {len(details)} keys; at most {MAX_DETAILS_KEYS} allowed")
        item = {
            "key": key,
            "type": type,
            "ts": utcnow_iso(),
            "attempt": self.attempt,
            "rank": rank,
            "node": self.node,
            "step": step,
            "details": details,
        }
        with self._cond:
            if len(self._events) >= self.max_events:
                self.dropped_events += 1
                dropped = True
            else:
                self._events.append(item)
                dropped = False
                self._cond.notify()
        if dropped:
            log.warning("event queue full (%d): dropped %s event %s", self.max_events, type, key)
        return key

    def pending(self) -> tuple[int, int]:
        """(events, heartbeats) not yet accepted by the control plane."""
        with self._cond:
            return len(self._events), len(self._heartbeats)

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` s until everything queued is delivered (or dropped); True if so.

        A flush skips the current backoff wait: it tries once more right away.
        """
        if not self.enabled:
            return True
        deadline = time.monotonic() + timeout
        with self._cond:
            self._flushing += 1
            self._retry_at = 0.0
            self._cond.notify_all()
            try:
                while self._events or self._heartbeats or self._in_flight:
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
            log.warning("reporter closing with %d event(s) and %d heartbeat(s) undelivered", events, beats)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if self._client is not None and (self._thread is None or not self._thread.is_alive()):
            self._client.close()
        return delivered

    # --- the background thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return
                    now = time.monotonic()
                    if now < self._retry_at:
                        self._cond.wait(self._retry_at - now)
                        continue
                    beats_due = bool(self._heartbeats) and (now >= self._next_heartbeat_at or self._flushing > 0)
                    if self._events or beats_due:
                        break
                    wait = None
                    if self._heartbeats:
                        wait = max(self._next_heartbeat_at - now, 0.0)
                    self._cond.wait(wait)
                events = [self._events[i] for i in range(min(len(self._events), MAX_EVENTS_PER_REQUEST))]
                beats: list[dict[str, Any]] = []
                if beats_due:
                    beats = list(self._heartbeats.values())[:MAX_HEARTBEATS_PER_REQUEST]
                    for beat in beats:
                        del self._heartbeats[beat["rank"]]
                    self._next_heartbeat_at = now + self.report_interval_s
                self._in_flight += 1
            try:
                self._deliver(events, beats)
            finally:
                with self._cond:
                    self._in_flight -= 1
                    self._cond.notify_all()

    def _deliver(self, events: list[dict[str, Any]], beats: list[dict[str, Any]]) -> None:
        if events:
            try:
                self._post(self._events_path, {"events": events})
            except _Retry as exc:
                self._schedule_retry(exc, f"{len(events)} event(s)")
                self._requeue_heartbeats(beats)
                return
            except _Drop as exc:
                log.warning("control plane refused %d event(s) (dropped): %s", len(events), exc)
            else:
                self.sent_events += len(events)
            with self._cond:
                sent_keys = {e["key"] for e in events}
                while self._events and self._events[0]["key"] in sent_keys:
                    self._events.popleft()
        if beats:
            try:
                reply = self._post(self._heartbeats_path, {"attempt": self.attempt, "heartbeats": beats})
            except _Retry as exc:
                self._schedule_retry(exc, f"{len(beats)} heartbeat(s)")
                self._requeue_heartbeats(beats)
                return
            except _Drop as exc:
                log.warning("control plane refused %d heartbeat(s) (dropped): %s", len(beats), exc)
                reply = None
            else:
                self.sent_heartbeats += len(beats)
            faults = (reply or {}).get("faults") if isinstance(reply, dict) else None
            if faults and self.on_faults is not None:
                try:
                    self.on_faults(list(faults))
                except Exception:
                    log.exception("handling fault directives failed")
        with self._cond:
            self._failures = 0

    def _requeue_heartbeats(self, beats: list[dict[str, Any]]) -> None:
        with self._cond:
            for beat in beats:
                self._heartbeats.setdefault(beat["rank"], beat)  # a newer one wins

    def _schedule_retry(self, exc: _Retry, what: str) -> None:
        with self._cond:
            self._failures += 1
            ceiling = min(self.backoff_cap_s, self.backoff_base_s * 2 ** (self._failures - 1))
            delay = ceiling / 2 + random.uniform(0, ceiling / 2)
            if exc.retry_after is not None:
                delay = max(delay, exc.retry_after)
            self._retry_at = time.monotonic() + delay
            failures = self._failures
        level = logging.WARNING if failures in (1, 10) or failures % 100 == 0 else logging.DEBUG
        log.log(level, "reporting %s failed (%s); retry %d in %.1f s", what, exc, failures, delay)

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        assert self._client is not None
        try:
            response = self._client.post(path, json=body)
        except httpx.TransportError as exc:
            raise _Retry(f"{type(exc).__name__}: {exc}") from exc
        status = response.status_code
        if 200 <= status < 300:
            try:
                return response.json()
            except ValueError:
                return None
        reason = f"HTTP {status} from {path}: {response.text[:200]!r}"
        if status in RETRYABLE_STATUS or status >= 500:
            raise _Retry(reason, _retry_after_seconds(response.headers.get("Retry-After")))
        raise _Drop(reason)
