"""The agent's one conversation with the control plane: a batched node report per interval, sent over HTTP.

What a report carries, when it goes and what a reply means is `ReportBuffer`'s to decide
(`trainer/agent/report_buffer.py`, no I/O); the training side never waits on it. `Uplink` drives it
from a thread with httpx (the node agent), and `AsyncUplink` from an asyncio task with httpx's async
client (the scale benchmark drives thousands of them in one process). Both take every decision
through `ReportBuffer`, `classify` and `Report.body`. A reply may carry fault directives for this
node, handed to `on_faults`; a refused report is dropped with a warning. The token is sent in the
Authorization header and never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import httpx

from ftplane.contract import EventType, new_event
from ftplane.trainer.agent.report_buffer import Outcome, Reply, Report, ReportBuffer, fill_event, outcome_of

log = logging.getLogger(__name__)


def log_outcome(outcome: Outcome, failures: int, retry_in: float) -> None:
    if outcome.retry:
        level = logging.WARNING if failures in (1, 10) or failures % 100 == 0 else logging.DEBUG
        log.log(level, "node report failed (%s); retry %d in %.1f s", outcome.reason, failures, retry_in)
    elif not outcome.ok:
        log.warning("control plane refused a node report (dropped): %s", outcome.reason)


def hand_over_faults(outcome: Outcome, on_faults: Callable[[list[dict[str, Any]]], None] | None) -> None:
    """The reply's fault directives for this node, to `on_faults` (a failure there is logged, not raised)."""
    faults = outcome.reply.get("faults") if isinstance(outcome.reply, dict) else None
    if faults and on_faults is not None:
        try:
            on_faults(list(faults))
        except Exception:
            log.exception("handling fault directives failed")


# A report every interval (up to 30 s) keeps its connection: a new TCP connection per report costs the API
# more than the report itself. The API keeps idle connections longer than this (ftplane serve: 75 s).
KEEPALIVE_S = 60.0


def client_options(url: str, token: str | None, request_timeout_s: float) -> dict[str, Any]:
    """The HTTP client both drivers use: the control plane's URL, the token in the Authorization header, timeouts,
    one connection kept open between reports."""
    headers = {"User-Agent": "ftplane-agent"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    timeout = httpx.Timeout(request_timeout_s, connect=min(2.0, request_timeout_s))
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=1, keepalive_expiry=KEEPALIVE_S)
    return {"base_url": url.rstrip("/"), "headers": headers, "timeout": timeout, "limits": limits}


class ReportClient(Protocol):
    """What AsyncUplink sends its reports with: an httpx.AsyncClient made from `client_options` unless told."""

    async def post(self, url: str, *, json: Any) -> Reply: ...
    async def aclose(self) -> None: ...


class NodeEvents:
    """What both drivers offer the node besides heartbeats and liveness: `event()` makes one of this node's
    events and queues it through the driver's `forward_event`."""

    attempt: int
    node: str

    def forward_event(self, event: dict[str, Any]) -> None:
        raise NotImplementedError

    def event(
        self,
        type: EventType,
        *,
        rank: int | None = None,
        step: int | None = None,
        details: dict[str, Any] | None = None,
        key: str | None = None,
        ts: str | None = None,
        attempt: int | None = None,
    ) -> str:
        """Queue an event of this node; returns its idempotency key."""
        attempt = self.attempt if attempt is None else attempt
        item = new_event(type, node=self.node, attempt=attempt, rank=rank, step=step, details=details, key=key, ts=ts)
        self.forward_event(item)
        return str(item["key"])


class Uplink(NodeEvents):
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
            self._client = httpx.Client(**client_options(url, token, request_timeout_s), transport=transport)
            self._thread = threading.Thread(target=self._run, name="ftplane-uplink", daemon=True)
            self._thread.start()

    # ---- the node's side: O(1), never waits on the network ----

    def forward_event(self, event: dict[str, Any]) -> None:
        """Queue an event as a rank made it (its key, time and rank kept; the node and attempt filled in)."""
        if not self.enabled:
            return
        fill_event(event, self.node, self.attempt)
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

    def liveness(self, liveness: dict[str, Any]) -> None:
        """The node's newest liveness, sent at once (after any backoff wait) with the heartbeats waiting."""
        if not self.enabled:
            return
        with self._cond:
            self.buffer.set_liveness(liveness)
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
                while not self.buffer.settled_all() or self._in_flight:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                return True
            finally:
                self._flushing -= 1

    def close(self, timeout: float = 5.0, *, hold: bool = False) -> bool:
        """Flush (with `hold`, after holding what is left: `ReportBuffer.hold_last_flush`), then stop the thread; all
        within `timeout`. Returns whether everything was delivered."""
        if not self.enabled:
            return True
        deadline = time.monotonic() + timeout
        if hold:
            with self._cond:
                held = self.buffer.hold_last_flush(time.monotonic(), timeout)
            time.sleep(held)
        delivered = self.flush(deadline - time.monotonic())
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
                failures, retry_in = self.buffer.failures, self.buffer.retry_delay()
            log_outcome(outcome, failures, retry_in)  # before a flush waiting on this report returns
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()
            hand_over_faults(outcome, self.on_faults)

    def _post(self, report: Report) -> Outcome:
        assert self._client is not None
        try:
            response = self._client.post(self.path, json=report.body(self.attempt, self.node))
        except httpx.TransportError as exc:
            return Outcome(ok=False, retry=True, reason=f"{type(exc).__name__}: {exc}")
        return outcome_of(response, self.path)


class AsyncUplink(NodeEvents):
    """Drives a ReportBuffer from an asyncio task: the same reports, batching, retries and backoff as `Uplink`, for
    code that lives in an event loop. The scale benchmark runs thousands of them in one process.

    Call `start()` inside the running loop; the node's side (`event`, `heartbeat`, `liveness`) never awaits.
    `on_settled(report, outcome, seconds)` sees each POST's outcome and duration once the buffer has settled it.
    `client`, given `client_options`' options (URL, headers, timeouts), makes what sends the reports instead of
    httpx.AsyncClient (with `transport` under it): the scale benchmark's nodes share one process, and httpx's own
    client costs most of their CPU.
    """

    def __init__(
        self,
        url: str,
        job_id: str,
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
        on_settled: Callable[[Report, Outcome, float], None] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        client: Callable[[dict[str, Any]], ReportClient] | None = None,
    ) -> None:
        if not job_id:
            raise ValueError("a job id is required")
        self.job_id = job_id
        self.attempt = attempt
        self.node = node
        self.on_faults = on_faults
        self.on_settled = on_settled
        self.buffer = ReportBuffer(
            interval_s=interval_s, backoff_base_s=backoff_base_s, backoff_cap_s=backoff_cap_s, max_events=max_events
        )
        self.path = f"/v1/jobs/{job_id}/reports"
        options = client_options(url, token, request_timeout_s)
        self._client: ReportClient = (
            client(options) if client is not None else httpx.AsyncClient(**options, transport=transport)
        )
        self._wake = asyncio.Event()  # something was added, or a flush began
        self._settled = asyncio.Event()  # a POST was settled
        self._in_flight = False
        self._flushing = 0
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"ftplane-uplink-{self.node}")

    # ---- the node's side: O(1), never awaits ----

    def forward_event(self, event: dict[str, Any]) -> None:
        """Queue an event as a rank made it (its key, time and rank kept; the node and attempt filled in)."""
        fill_event(event, self.node, self.attempt)
        if not self.buffer.add_event(event):
            log.warning(
                "event queue full (%d): dropped %s event %s", self.buffer.max_events, event["type"], event["key"]
            )
        self._wake.set()

    def heartbeat(self, beat: dict[str, Any]) -> None:
        self.buffer.add_heartbeat(beat)
        self._wake.set()

    def liveness(self, liveness: dict[str, Any]) -> None:
        """The node's newest liveness, sent at once (after any backoff wait) with the heartbeats waiting."""
        self.buffer.set_liveness(liveness)
        self._wake.set()

    def pending(self) -> tuple[int, int]:
        """(events, heartbeats) not yet accepted."""
        return len(self.buffer.events), len(self.buffer.heartbeats)

    async def flush(self, timeout: float) -> bool:
        """Send now, skipping any backoff wait, and wait up to `timeout` s until everything queued is accepted
        (or refused for good); True if so."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._flushing += 1
        self.buffer.retry_at = 0.0
        self._wake.set()
        try:
            while not self.buffer.settled_all() or self._in_flight:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                self._settled.clear()
                try:
                    async with asyncio.timeout(remaining):
                        await self._settled.wait()
                except TimeoutError:
                    return False
            return True
        finally:
            self._flushing -= 1

    async def close(self, timeout: float = 5.0, *, hold: bool = False) -> bool:
        """Flush (with `hold`, after holding what is left: `ReportBuffer.hold_last_flush`), then stop the task and
        close the client; all within `timeout`. Returns whether everything was delivered."""
        running = self._task is not None and not self._task.done()
        if running:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            if hold:
                await asyncio.sleep(self.buffer.hold_last_flush(time.monotonic(), timeout))
            delivered = await self.flush(deadline - loop.time())
        else:
            delivered = self.buffer.settled_all()
        if not delivered:
            events, beats = self.pending()
            log.warning("closing with %d event(s) and %d heartbeat(s) undelivered", events, beats)
        await self.stop()
        return delivered

    async def stop(self) -> None:
        """Stop at once: a POST in flight is abandoned, nothing more is sent (a node that is gone)."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._client.aclose()

    # ---- the task ----

    async def _run(self) -> None:
        while not self._stopping:
            wait = self.buffer.due_in(time.monotonic(), flushing=self._flushing > 0)
            if wait != 0.0:
                self._wake.clear()
                try:
                    async with asyncio.timeout(wait):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            report = self.buffer.take(time.monotonic())
            self._in_flight = True
            started = time.monotonic()
            try:
                outcome = await self._post(report)
            finally:
                self._in_flight = False
            self.buffer.settle(report, outcome, time.monotonic())
            self._settled.set()
            log_outcome(outcome, self.buffer.failures, self.buffer.retry_delay())
            if self.on_settled is not None:
                self.on_settled(report, outcome, time.monotonic() - started)
            hand_over_faults(outcome, self.on_faults)
            await asyncio.sleep(0)  # between two reports, let the loop's other tasks run (many uplinks share it)

    async def _post(self, report: Report) -> Outcome:
        try:
            response = await self._client.post(self.path, json=report.body(self.attempt, self.node))
        except httpx.TransportError as exc:
            return Outcome(ok=False, retry=True, reason=f"{type(exc).__name__}: {exc}")
        return outcome_of(response, self.path)
