"""The rule that gives a node its state from the faults blamed on it. Stated here once (the README repeats it):

1. A fault *counts* when it is the node's doing: `lost` (node_failed), `unhealthy` (node_unhealthy), `xid` and
   `ecc` (node_unhealthy from a GPU's health) and `straggler` (a straggler episode of a rank on it). Preemptions
   (`preempted`) and the faults ftplane injected on purpose (`injected`) are recorded and shown, never counted.
2. The faults that count now are those within the window before now (FTPLANE_NODE_FAULT_WINDOW_S, a day) and
   after the node's last release: a release forgives every fault before it.
3. **quarantined** when those faults come from at least FTPLANE_NODE_QUARANTINE_JOBS (2) different jobs; 0
   turns quarantine off. A quarantine lasts FTPLANE_NODE_QUARANTINE_S (a day) unless a cluster admin releases
   the node sooner (`POST /v1/nodes/{name}/release`, with a reason). When it ends by itself the faults up to its
   start are forgiven, so only what happened since decides the node's state again.
   **suspect** when some fault counts, short of that; **healthy** when none does.

Why different jobs: a job whose own code or data breaks its ranks blames the node it runs on again and again,
while a broken node fails whatever runs on it; one job's faults never quarantine a node (by default).

Pure: `judge` reads a node's standing, its faults and the time, and says what its standing becomes and which
changes that makes (standing.py carries them out).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from api.core.config import Settings
from api.schemas.fleet_nodes import COUNTED_KINDS, FaultKind, NodeState

Change = Literal["suspect", "quarantined", "released", "healthy"]


@dataclass(frozen=True)
class Rule:
    quarantine_jobs: int = 2
    window: timedelta = timedelta(days=1)
    quarantine: timedelta = timedelta(days=1)

    @classmethod
    def of(cls, settings: Settings) -> Rule:
        return cls(
            quarantine_jobs=settings.node_quarantine_jobs,
            window=timedelta(seconds=settings.node_fault_window_s),
            quarantine=timedelta(seconds=settings.node_quarantine_s),
        )


@dataclass(frozen=True)
class Fault:
    """What the rule reads of a fault blamed on the node."""

    job_id: str
    kind: FaultKind
    ts: datetime
    attempt: int = 0


@dataclass(frozen=True)
class Standing:
    state: NodeState = NodeState.healthy
    since: datetime | None = None
    quarantined_until: datetime | None = None
    forgiven_before: datetime | None = None  # faults at or before this do not count
    reason: str | None = None


@dataclass(frozen=True)
class Judgement:
    standing: Standing
    changes: tuple[Change, ...]  # in order; empty when the state stays
    counted: tuple[Fault, ...]  # the faults that count now, oldest first


def counted(faults: Iterable[Fault], now: datetime, rule: Rule, forgiven_before: datetime | None) -> list[Fault]:
    """Rules 1 and 2: the faults that count at `now`, oldest first."""
    start = now - rule.window
    return sorted(
        (
            f
            for f in faults
            if f.kind in COUNTED_KINDS and f.ts > start and (forgiven_before is None or f.ts > forgiven_before)
        ),
        key=lambda f: f.ts,
    )


def judge(standing: Standing, faults: Sequence[Fault], now: datetime, rule: Rule) -> Judgement:
    """What the node's standing becomes at `now` (rule 3)."""
    changes: list[Change] = []
    if standing.state == NodeState.quarantined:
        until = standing.quarantined_until
        if until is not None and now < until:
            return Judgement(standing, (), tuple(counted(faults, now, rule, standing.forgiven_before)))
        end = until or now
        reason = "its quarantine ended"
        standing = Standing(NodeState.healthy, end, None, standing.since or end, reason)
        changes.append("released")
    now_counted = counted(faults, now, rule, standing.forgiven_before)
    jobs = {f.job_id for f in now_counted}
    if rule.quarantine_jobs and len(jobs) >= rule.quarantine_jobs:
        until = now + rule.quarantine
        reason = f"quarantined: {describe(now_counted, rule)}"
        standing = replace(standing, state=NodeState.quarantined, since=now, quarantined_until=until, reason=reason)
        changes.append("quarantined")
    elif now_counted:
        if standing.state != NodeState.suspect:
            standing = replace(standing, state=NodeState.suspect, since=now)
            changes.append("suspect")
        standing = replace(standing, reason=f"suspect: {describe(now_counted, rule)}")
    elif standing.state != NodeState.healthy:
        standing = replace(standing, state=NodeState.healthy, since=now, reason="no fault counts any more")
        changes.append("healthy")
    return Judgement(standing, tuple(changes), tuple(now_counted))


def describe(faults: Sequence[Fault], rule: Rule) -> str:
    """The rule's words for the faults that count, e.g. '3 fault(s) from 2 job(s) within 24 h: lost, xid'."""
    jobs = {f.job_id for f in faults}
    kinds = ", ".join(sorted({f.kind.value for f in faults}))
    threshold = f" (quarantined at {rule.quarantine_jobs})" if rule.quarantine_jobs else ""
    return f"{len(faults)} fault(s) from {len(jobs)} job(s){threshold} within {_hours(rule.window)}: {kinds}"


def _hours(span: timedelta) -> str:
    hours = span.total_seconds() / 3600
    return f"{hours:g} h" if hours >= 1 else f"{span.total_seconds():g} s"
