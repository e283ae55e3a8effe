"""Shapes of the fleet's nodes (`/v1/nodes`): a node's state, the faults blamed on it by kind, where it ran, its
history; the rule that sets the state is api/services/node_reputation/rule.py."""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ftplane import contract

# A DNS-1123 subdomain (what every Kubernetes node name is): lowercase letters, digits, '-' and '.', each label
# starting and ending with a letter or digit, at most 253 characters.
NODE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_NODE_NAME = re.compile(NODE_NAME_PATTERN)
NODE_NAME_DESCRIPTION = (
    "A node's name as ftplane records it: a DNS-1123 subdomain (lowercase letters, digits, '-' and '.'), at most "
    f"{contract.MAX_NODE_NAME} characters. Kubernetes node names are recorded as they are; other names in lowercase."
)


@lru_cache(maxsize=65_536)  # the ledger names each of a job's 16,384 nodes in every batch of events
def fleet_name(reported: str | None) -> str | None:
    """The name the fleet records a reported node under (lowercase), or None when it cannot be one."""
    if not reported:
        return None
    name = reported.strip().lower()
    if len(name) > contract.MAX_NODE_NAME or not _NODE_NAME.match(name):
        return None
    return name


class NodeState(StrEnum):
    healthy = "healthy"
    suspect = "suspect"
    quarantined = "quarantined"


class FaultKind(StrEnum):
    """What a fault blamed on a node was (api/services/node_reputation/blame.py says which event is which)."""

    lost = "lost"  # node_failed: the node went away or stopped responding
    unhealthy = "unhealthy"  # node_unhealthy: its agent or the cluster found it broken (the reason says how)
    xid = "xid"  # node_unhealthy from a GPU's critical Xid error
    ecc = "ecc"  # node_unhealthy from new uncorrected ECC errors
    straggler = "straggler"  # a straggler episode of a rank on it
    preempted = "preempted"  # taken away on purpose (a drain, a spot interruption): not the node's fault
    injected = "injected"  # a fault ftplane injected on purpose (node_loss, slowdown): not the node's fault


# The kinds that are the node's doing: only these count towards its state.
COUNTED_KINDS = frozenset({FaultKind.lost, FaultKind.unhealthy, FaultKind.xid, FaultKind.ecc, FaultKind.straggler})


class LastFault(BaseModel):
    ts: datetime
    kind: FaultKind
    job_id: str
    reason: str | None


class NodeSummary(BaseModel):
    name: str
    state: NodeState
    state_since: datetime = Field(description="When the node entered its state.")
    reason: str | None = Field(description="Why it is in its state (the rule's words), or who released it.")
    faults: dict[str, int] = Field(description="Faults blamed on it over its whole history, by kind.")
    last_fault: LastFault | None = Field(description="Its newest fault of a kind that counts (not a preemption).")
    jobs: int = Field(description="Jobs that ran on it.")
    quarantined_until: datetime | None = Field(description="When its quarantine ends, while it is quarantined.")


class NodePage(BaseModel):
    nodes: list[NodeSummary]
    next_cursor: str | None = Field(description="Give it as `cursor` for the next page; null on the last.")


class FaultOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    ts: datetime
    kind: FaultKind
    counted: bool = Field(description="Whether it counts towards the node's state (preemptions and injections not).")
    job_id: str
    attempt: int
    reason: str | None
    details: dict[str, Any]


class RunOut(BaseModel):
    job_id: str
    job_name: str
    project: str
    attempt: int
    first_seen: datetime
    last_seen: datetime


class HistoryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    ts: datetime
    state: NodeState = Field(description="The state it entered.")
    action: str = Field(description="suspect, quarantined, released or healthy.")
    reason: str | None
    actor: str = Field(description="Who: `ftplane` (the rule) or the caller who released it.")


class NodeDetail(NodeSummary):
    recent_faults: list[FaultOut] = Field(description="Its newest faults, newest first (at most 200).")
    runs: list[RunOut] = Field(description="The jobs and attempts that ran on it, newest first (at most 200).")
    history: list[HistoryOut] = Field(description="Its changes of state, newest first (at most 200).")


class ReleaseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(
        min_length=1,
        max_length=1000,
        pattern=r"\S",
        description="Why the node may be used again (kept in its history and the audit log), e.g. 'GPU 3 replaced'.",
    )
