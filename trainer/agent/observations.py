"""What the node agent has seen of its ranks and launcher rounds, kept between its reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ftplane.trainer.agent.processes import RankProcess


@dataclass
class RankProgress:
    """Steps read from one rank's own output lines (log-pattern progress)."""

    step: int
    at: float
    step_time_s: float | None = None


@dataclass
class NodeObservations:
    """What the node agent has seen of its ranks and launcher rounds (the launcher's output, the ranks'
    processes and messages), read when it reports the node's liveness and events."""

    ranks: dict[int, RankProcess] = field(default_factory=dict)  # by global rank, the newest process
    exits: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its last exit, from the launcher
    sdk_ranks: set[int] = field(default_factory=set)
    sdk_heard_at: float = 0.0  # monotonic time of the newest message from an SDK rank
    round_ranks: dict[int, set[int]] = field(default_factory=dict)  # restart count -> its local ranks seen so far
    rounds_seen: dict[int, tuple[float, str]] = field(default_factory=dict)  # restart count -> all up (mono, iso)
    injected: dict[int, tuple[int, int]] = field(default_factory=dict)  # round -> (rank, pid) this agent crashed
    unhealthy: str | None = None
    verdict: str | None = None  # NVRx said it will not restart (its launcher's output)
