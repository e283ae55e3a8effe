"""What a node's report carries, when it goes, and what a reply means: the decisions of the node agent's
reporting, with no I/O of their own (`trainer/agent/uplink.py` drives them over HTTP).

Each report is one `POST /v1/jobs/{job}/reports` carrying the node's liveness (agent, launcher,
each rank's process, GPU health), the newest heartbeat of every rank that sent one, and the
events queued since the last report:

- events are kept, in order, until the control plane accepts them; each carries an idempotency
  key made once, so a report resent after a lost reply stores it once. A new event is sent
  rather than kept for the next interval: at once where nodes report every second, within a
  random part of `event_spread_s` where the job's size made the interval longer. Except the kinds
  every node of a job sends at once (`WITH_THE_LIVENESS`: its ranks' `running` at a start or a
  restart, its launcher's `injob_restart`): past the 1 s interval they go with the node's next
  liveness (`LIVENESS_WAIT_INTERVALS` intervals at most, for a sender given none). At a restart of a
  16,384-node job that is no report more than the interval's 546 a second, where even spread over
  half the interval they were 1,100 more a second, twice the control plane's budget (bench/RESULTS.md,
  scale, 2026-12-07 morning); the nodes' reports being spread evenly over the interval, the first
  of them comes about an interval ÷ nodes after the restart (2 ms at 16,384 nodes);
- the node's ranks' `running` of one run (a start or a restart) is one event: a rank's `running` that
  finds another rank's of the same run still waiting is folded into it (`details.ranks` lists them,
  its time is the latest rank's, its step the lowest; `details.processes` keeps each rank's pid), so
  a restart of a 131,072-rank job is 16,384 events, not 131,072. A folded rank's `running` goes where
  its run's first one waits (before that rank's own events queued since: their times say their order).
  An event once taken for a report is never changed: a rank's `running` after that is an event of its
  own;
- heartbeats and the node's liveness are soft state: only the newest per rank (and the newest
  liveness) is kept, so an outage costs memory for one heartbeat per rank;
- the agent hands over the node's liveness once an interval, and it is sent at once, with every
  heartbeat waiting: the agent's clock sets the reports' pace. Had the sender kept a clock of its
  own, the two would drift into phase, and a liveness handed over just after a report would wait
  a whole interval, to be replaced by the next one before it went. Heartbeats alone (a sender
  given no liveness) go two intervals after the last report;
- when the agent exits on its own (its launcher ended), what is left is held for a random part of
  `contract.last_flush_hold_max_s` (one interval past the 1 s interval), then flushed: every node of a job exits
  at once at its end, and a 16,384-node job's last reports sent in the same second are 30 s of its report budget
  (in the scale benchmark's story they lost 10,312 events; held, none: bench/RESULTS.md, scale, 2026-12-07 noon).
  An agent told to stop sends at once: a job restart waits for it;
- 408/425/429/5xx and connection errors are retried with exponential backoff and jitter,
  capped at the larger of `backoff_cap_s` and the interval (a job's size lengthens its interval
  so that its nodes stay within a report budget; a retry must not break it), honouring
  Retry-After; after a 503 that says the liveness was taken (a busy server
  shed the report's events) only the events go again; other 4xx drop what was sent: resending
  would never succeed.
"""

from __future__ import annotations

import collections
import email.utils
import json
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from ftplane.contract import MAX_EVENTS_PER_REPORT, MAX_HEARTBEATS_PER_REPORT, EventType, last_flush_hold_max_s

RETRYABLE_STATUS = frozenset({408, 425, 429})
MAX_RETRY_AFTER_S = 60.0
# Events of the kinds every node of a job sends at once go with the node's next liveness (past the 1 s interval); a
# sender that hands over none sends them after this many intervals.
WITH_THE_LIVENESS = frozenset({EventType.running, EventType.injob_restart})
LIVENESS_WAIT_INTERVALS = 1.5
# Heartbeats wait for the liveness the agent hands over every interval; alone, they go this many intervals after the
# last report (more than one, so that they never go just before the liveness and double the reports).
HEARTBEATS_ALONE_AFTER_INTERVALS = 2


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
    liveness: dict[str, Any] | None

    def body(self, attempt: int, node: str) -> dict[str, Any]:
        return {
            "attempt": attempt,
            "node": node,
            "agent": self.liveness or {},
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
    liveness_taken: bool = False  # not accepted, but its liveness and heartbeats were: only its events go again


def classify(status: int, text: str, retry_after: str | None, path: str) -> Outcome:
    if 200 <= status < 300:
        return Outcome(ok=True)
    reason = f"HTTP {status} from {path}: {text[:200]!r}"
    if status in RETRYABLE_STATUS or status >= 500:
        return Outcome(
            ok=False,
            retry=True,
            retry_after=retry_after_seconds(retry_after),
            reason=reason,
            liveness_taken=status == 503 and liveness_taken(text),
        )
    return Outcome(ok=False, reason=reason)


def liveness_taken(text: str) -> bool:
    """Whether a 503's body says the control plane took the report's liveness and heartbeats (a server busy
    storing other reports' events sheds this one's, and takes the soft state anyway)."""
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(error, dict) and error.get("liveness_taken") is True


class Reply(Protocol):
    """What is read of a POST's response: an httpx.Response is one."""

    @property
    def status_code(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...  # looked up by lowercase name
    def json(self) -> Any: ...


def outcome_of(response: Reply, path: str) -> Outcome:
    """What a POST's (read) response means, with the reply's JSON when it was accepted."""
    outcome = classify(response.status_code, response.text, response.headers.get("retry-after"), path)
    if outcome.ok:
        try:
            outcome.reply = response.json()
        except ValueError:
            outcome.reply = None
    return outcome


def run_of(event: dict[str, Any]) -> tuple[Any, ...] | None:
    """Which run a rank's `running` announces (None for any other event, and for the agent's own): the ranks' of one
    run fold into one event."""
    if event.get("type") != EventType.running or event.get("rank") is None or not event.get("ts"):
        return None
    details = event.get("details") or {}
    return (event.get("attempt"), details.get("restart_count"), details.get("iteration"), details.get("source"))


# What a rank's `running` says of its own process: kept per rank when ranks' events fold (`details.processes`).
PROCESS_FIELDS = ("pid", "local_rank")


def fold_running(into: dict[str, Any], event: dict[str, Any]) -> None:
    """`event`, another rank's `running` of the same run, folded into `into` (still waiting to be sent)."""
    details = into.setdefault("details", {})
    if "ranks" not in details:
        details["ranks"] = [into["rank"]]
        if any(field in details for field in PROCESS_FIELDS):
            details["processes"] = [_process(into["rank"], details)]
    details["ranks"].append(event["rank"])
    details["ranks"].sort()
    if "processes" in details:
        details["processes"].append(_process(event["rank"], event.get("details") or {}))
        details["processes"].sort(key=lambda p: p["rank"])
    if datetime.fromisoformat(event["ts"]) > datetime.fromisoformat(into["ts"]):
        into["ts"] = event["ts"]
    if event.get("step") is not None:
        into["step"] = event["step"] if into.get("step") is None else min(into["step"], event["step"])


def _process(rank: int, details: dict[str, Any]) -> dict[str, Any]:
    return {"rank": rank, **{field: details.get(field) for field in PROCESS_FIELDS}}


def fill_event(event: dict[str, Any], node: str, attempt: int) -> None:
    """An event a rank made keeps its key, time and rank; the node and attempt are filled in."""
    event.setdefault("node", node)
    if event.get("attempt") is None:
        event["attempt"] = attempt


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
    liveness: dict[str, Any] | None = None
    liveness_changed: bool = False
    failures: int = 0  # consecutive failed reports: drives the backoff
    retry_at: float = 0.0  # monotonic time before which nothing is sent
    next_report_at: float = 0.0
    events_due_at: float = 0.0  # monotonic time the events waiting go (spread: `event_spread_s`)
    # each run's `running` still waiting (not yet taken for a report), that its other ranks' fold into
    foldable: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    dropped_events: int = 0
    sent_events: int = 0
    sent_heartbeats: int = 0
    reports: int = 0

    # ---- what the node adds ----

    def add_event(self, event: dict[str, Any], now: float | None = None) -> bool:
        if len(self.events) >= self.max_events:
            self.dropped_events += 1
            return False
        run = run_of(event)
        if run is not None and run in self.foldable:
            fold_running(self.foldable[run], event)
            return True
        due = (time.monotonic() if now is None else now) + self.event_wait_s(event)
        self.events_due_at = min(self.events_due_at, due) if self.events else due
        self.events.append(event)
        if run is not None:
            self.foldable[run] = event
        return True

    def event_wait_s(self, event: dict[str, Any]) -> float:
        """How long a new event may wait for a report (the module's rule)."""
        if event.get("type") in WITH_THE_LIVENESS and self.interval_s > 1.0:
            return LIVENESS_WAIT_INTERVALS * self.interval_s
        return random.uniform(0, self.event_spread_s)

    @property
    def event_spread_s(self) -> float:
        """How long a new event (not one of `WITH_THE_LIVENESS`) may wait so that nodes that have one at the same time
        do not all report it in the same second: none at the 1 s interval of jobs up to 256 nodes, half of the
        interval less that second past it (14.5 s at the 30 s of a 16,384-node job)."""
        return max(self.interval_s - 1.0, 0.0) / 2

    @property
    def backoff_ceiling_s(self) -> float:
        return max(self.backoff_cap_s, self.interval_s)

    def add_heartbeat(self, beat: dict[str, Any]) -> None:
        self.heartbeats[int(beat["rank"])] = beat

    def set_liveness(self, liveness: dict[str, Any]) -> None:
        self.liveness = liveness
        self.liveness_changed = True

    def hold_last_flush(self, now: float, timeout: float) -> float:
        """At the agent's exit: hold what is left (nothing is sent) for a random part of the hold the interval
        allows, at most half of `timeout`, the exit's whole bound (the module's rule). Returns the hold (0: nothing
        left)."""
        if self.settled_all():
            return 0.0
        hold = random.uniform(0, min(last_flush_hold_max_s(self.interval_s), timeout / 2))
        self.retry_at = max(self.retry_at, now + hold)
        return hold

    # ---- what the next report carries ----

    def due_in(self, now: float, flushing: bool = False) -> float | None:
        """Seconds until a report should be sent (0: now); None when there is nothing to send."""
        if now < self.retry_at:  # a flush skips the wait once (it clears retry_at), not after every failed try
            return self.retry_at - now
        if self.liveness_changed or flushing and (self.events or self.heartbeats):
            return 0.0
        waits = [self.events_due_at - now] if self.events else []
        if self.heartbeats:
            waits.append(self.next_report_at - now)
        return max(min(waits), 0.0) if waits else None

    def take(self, now: float) -> Report:
        """The next report: the oldest events (they stay queued until accepted), every newest heartbeat."""
        events = [self.events[i] for i in range(min(len(self.events), MAX_EVENTS_PER_REPORT))]
        if self.foldable:
            taken = {id(e) for e in events}
            self.foldable = {run: e for run, e in self.foldable.items() if id(e) not in taken}
        beats = list(self.heartbeats.values())[:MAX_HEARTBEATS_PER_REPORT]
        for beat in beats:
            del self.heartbeats[int(beat["rank"])]
        self.liveness_changed = False
        self.next_report_at = now + HEARTBEATS_ALONE_AFTER_INTERVALS * self.interval_s
        return Report(events, beats, self.liveness)

    def settle(self, report: Report, outcome: Outcome, now: float) -> None:
        """Apply what became of `report`: drop what was accepted (or refused for good), keep the rest."""
        if outcome.retry:
            self.failures += 1
            # the exponent is bounded: 2 ** 1024 is past a float, and a long outage must not kill the sender
            ceiling = min(self.backoff_ceiling_s, self.backoff_base_s * 2 ** min(self.failures - 1, 64))
            delay = ceiling / 2 + random.uniform(0, ceiling / 2)
            if outcome.retry_after is not None:
                delay = max(delay, outcome.retry_after)
            self.retry_at = now + delay
            if not outcome.liveness_taken:
                for beat in report.heartbeats:
                    self.heartbeats.setdefault(int(beat["rank"]), beat)  # a newer one wins
                self.liveness_changed = True
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

    def settled_all(self) -> bool:
        """Nothing left to send: every event accepted (or refused for good), no heartbeat or liveness waiting."""
        return not (self.events or self.heartbeats or self.liveness_changed)
