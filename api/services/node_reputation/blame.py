"""Which events blame which node, as which kind of fault: read from the facts the events carry, never their text.

    node_failed                                          lost
    node_unhealthy with `xid` (a GPU's critical Xids)    xid
    node_unhealthy with `ecc_new` (new uncorrected ECC)  ecc
    node_unhealthy otherwise (the agent's or the cluster's reason)
                                                         unhealthy
    node_excluded whose cause is that very node's (`cause_class` node, its `node`)
                                                         lost (a loss no other event named: a local agent killed)
    preempted                                            preempted (not counted)
    straggler_detected                                   straggler, one per episode

One failure of a node in one attempt of a job is one fault, whoever reported it (the node agent's
node_unhealthy and the backend's node_failed of the pod it then left): the most telling kind wins
(`PRIORITY`). A fault of an attempt where ftplane injected a node loss on that node (or a slowdown of that
rank, for a straggler) is `injected`: shown, never counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from api.database.tables import Event
from api.schemas.causes import CauseClass
from api.schemas.events import EventType
from api.schemas.fleet_nodes import COUNTED_KINDS, FaultKind, fleet_name

# Events that name a node without having run there: they make no run of theirs on it.
NOT_RUNS = frozenset({EventType.node_excluded, EventType.node_quarantined, EventType.node_released})
BLAMING_TYPES = (
    EventType.node_failed,
    EventType.node_unhealthy,
    EventType.node_excluded,
    EventType.preempted,
    EventType.straggler_detected,
)
# Of a node's failures in one attempt, the kind kept (higher wins); an exclusion alone is the least telling.
PRIORITY = {
    FaultKind.xid: 6,
    FaultKind.ecc: 6,
    FaultKind.unhealthy: 5,
    FaultKind.lost: 4,
    FaultKind.preempted: 3,
}
EXCLUSION_PRIORITY = 2
# The injected faults that stand for a node's failure and for a rank's slowness.
INJECTED_LOSS = "node_loss"
INJECTED_SLOWDOWN = "slowdown"
MAX_REASON = 1000


@dataclass(frozen=True)
class Blame:
    """A fault one event blames on a node."""

    node: str
    job_id: str
    attempt: int
    kind: FaultKind
    priority: int
    family: str  # "failure", or "straggler:<episode>"
    reason: str | None
    event: Event
    details: dict[str, Any] = field(default_factory=dict)
    rank: int | None = None

    @property
    def key(self) -> str:
        return f"{self.job_id}:a{self.attempt}:{self.family}"

    @property
    def injection_kind(self) -> str:
        return INJECTED_SLOWDOWN if self.kind == FaultKind.straggler else INJECTED_LOSS

    @property
    def counted(self) -> bool:
        return self.kind in COUNTED_KINDS

    def injected(self) -> Blame:
        """The same fault, injected by ftplane on purpose (kept as `injected`, what it stood for in `as`)."""
        details = {**self.details, "as": self.kind.value}
        return Blame(
            self.node,
            self.job_id,
            self.attempt,
            FaultKind.injected,
            self.priority,
            self.family,
            self.reason,
            self.event,
            details,
            self.rank,
        )


def blame(event: Event) -> Blame | None:
    """The fault `event` blames on its node, or None (no node, a name the fleet cannot record, no blame)."""
    node = fleet_name(event.node)
    if node is None:
        return None
    details = event.details or {}
    reason = _text(details.get("cause"))
    kind, priority, facts = _kind(event.type, details, node)
    if kind is None:
        return None
    family = "failure"
    if kind == FaultKind.straggler:
        family = f"straggler:{_text(details.get('episode')) or event.key}"
    attempt = event.attempt
    if event.type == EventType.node_excluded:  # stored under the attempt it leads to, about the one that failed
        before = details.get("from_attempt")
        attempt = before if isinstance(before, int) and not isinstance(before, bool) else max(0, attempt - 1)
    return Blame(node, event.job_id, attempt, kind, priority, family, reason, event, facts, event.rank)


def _kind(type_: str, details: dict[str, Any], node: str) -> tuple[FaultKind | None, int, dict[str, Any]]:
    facts: dict[str, Any] = {"event": type_}
    for key in ("reason", "source", "gpu", "pod", "exit_code"):
        if isinstance(details.get(key), str | int) and not isinstance(details.get(key), bool):
            facts[key] = details[key]
    if type_ == EventType.node_failed:
        return FaultKind.lost, PRIORITY[FaultKind.lost], facts
    if type_ == EventType.node_unhealthy:
        xids = details.get("xid")
        if isinstance(xids, list) and xids and all(isinstance(x, int) for x in xids):
            return FaultKind.xid, PRIORITY[FaultKind.xid], {**facts, "xid": xids}
        ecc = details.get("ecc_new")
        if isinstance(ecc, int) and not isinstance(ecc, bool) and ecc > 0:
            return FaultKind.ecc, PRIORITY[FaultKind.ecc], {**facts, "ecc_new": ecc}
        return FaultKind.unhealthy, PRIORITY[FaultKind.unhealthy], facts
    if type_ == EventType.preempted:
        return FaultKind.preempted, PRIORITY[FaultKind.preempted], facts
    if type_ == EventType.straggler_detected:
        for key in ("score", "lost_fraction", "slowdown_s"):
            if isinstance(details.get(key), int | float) and not isinstance(details.get(key), bool):
                facts[key] = details[key]
        return FaultKind.straggler, 0, facts
    if type_ == EventType.node_excluded:
        own = details.get("cause_class") == CauseClass.node.value and fleet_name(_text(details.get("node"))) == node
        if own:
            return FaultKind.lost, EXCLUSION_PRIORITY, facts
    return None, 0, facts


def _text(value: object) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    return value[:MAX_REASON]
