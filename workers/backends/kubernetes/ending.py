"""Which of an ended attempt's pod failures is its cause.

In order:
1. NVRx's verdict: a node agent's exit 93 on any node (NVRx decided not to restart; the nodes that missed its
   stop key exit otherwise, maybe earlier);
2. failures that say why (a lost or evicting node, a crash, an exit code), before the pods deleted with no word
   of why (`Deleted`), before the pods the failing Job itself terminated (SIGTERM or SIGKILL at or after its
   FailureTarget: consequences, never causes);
3. a node-level failure before the others (a lost node explains the ranks elsewhere that failed after it);
4. the earliest, then the lowest completion index.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from api.schemas.causes import CauseClass
from workers.backends.kubernetes.failures import PodFailure
from workers.backends.kubernetes.objects import parse_ts

TERMINATION_SIGNALS = ("SIGTERM", "SIGKILL")


def is_collateral(failure: PodFailure, failing: dict[str, Any] | None) -> bool:
    """A pod the failing Job terminated: stopped by a signal at or after `failing`, the Job's FailureTarget (or
    its Failed where it has none; never Failed's time when it has both: the pods stop before it)."""
    ended = parse_ts((failing or {}).get("lastTransitionTime"))
    stopped = failure.cause.cause_class == CauseClass.crash and failure.cause.facts.get("signal") in TERMINATION_SIGNALS
    return stopped and ended is not None and failure.at is not None and failure.at >= ended


def rank_failures(failures: list[PodFailure], failing: dict[str, Any] | None) -> list[PodFailure]:
    """The failures, the attempt's cause first (see the module's docstring)."""
    far = datetime.max.replace(tzinfo=UTC)

    def tier(f: PodFailure) -> int:
        if is_collateral(f, failing):
            return 2
        return 1 if f.reason == "Deleted" else 0

    return sorted(
        failures,
        key=lambda f: (
            f.cause.cause_class != CauseClass.verdict,
            tier(f),
            not f.node_level,
            f.at or far,
            f.index or 0,
        ),
    )
