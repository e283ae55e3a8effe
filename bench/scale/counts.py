"""What a job's simulated agents offered the control plane and what became of it: the node beats and reports
(`Tally`, counted while measuring) and every event key (`Ledger`). fleet.py says what each count means."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

TIMELINE_S = 10  # the timeline's step (seconds of wall clock)


@dataclass
class Tally:
    """What a job's simulated agents offered and what the control plane accepted, while `measuring`."""

    measuring: bool = False
    ticks: int = 0  # node beats offered
    delivered: int = 0  # (counted until the agents stop, past the window: a beat offered in it may arrive after)
    delivered_by_shed: int = 0  # of those, by a 503 that said the liveness was taken (its events shed, resent)
    superseded: int = 0
    posts: int = 0
    accepted: int = 0
    retried: int = 0
    refused: int = 0
    rank_beats: int = 0  # heartbeats in accepted reports
    post_s: list[float] = field(default_factory=list)  # reports with heartbeats and liveness only
    post_events_s: list[float] = field(default_factory=list)  # reports that carried events
    beat_age_s: list[float] = field(default_factory=list)
    lag_s: list[float] = field(default_factory=list)  # how late the agents' interval timers fired
    reasons: collections.Counter[str] = field(default_factory=collections.Counter)
    # every POST's outcome, measuring or not (the agents' last flush too), by (TIMELINE_S step of wall clock, what)
    timeline: collections.Counter[tuple[int, str]] = field(default_factory=collections.Counter)

    def add(self, other: Tally) -> None:
        """Count `other`'s figures in too (another group's, or another job's)."""
        counts = ("ticks", "delivered", "delivered_by_shed", "superseded", "posts", "accepted", "retried", "refused")
        for name in (*counts, "rank_beats"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("post_s", "post_events_s", "beat_age_s", "lag_s"):
            getattr(self, name).extend(getattr(other, name))
        self.reasons.update(other.reasons)
        self.timeline.update(other.timeline)

    def settled(self, at: float, what: str) -> None:
        """A POST settled at `at` (wall clock): `what` became of it."""
        self.timeline[(int(at) // TIMELINE_S * TIMELINE_S, what)] += 1


def keys_carried(event: dict[str, Any]) -> list[str]:
    """The simulator's event keys one stored or sent event stands for: its own, or, for the ranks' `running` of a run
    that a node's agent folded into one (`details.ranks`), every rank's (`sim:run:<run>:<rank>`)."""
    ranks = (event.get("details") or {}).get("ranks")
    if not ranks:
        return [event["key"]]
    run = event["key"].rsplit(":", 1)[0]
    return [f"{run}:{rank}" for rank in ranks]


@dataclass
class Ledger:
    """Every event key handed to an agent (with the ts it carried), and what became of it."""

    offered: dict[str, str] = field(default_factory=dict)
    accepted: set[str] = field(default_factory=set)
    refused: set[str] = field(default_factory=set)
    died: set[str] = field(default_factory=set)  # queued on a node that froze before sending them

    def add(self, other: Ledger) -> None:
        self.offered.update(other.offered)
        self.accepted |= other.accepted
        self.refused |= other.refused
        self.died |= other.died
