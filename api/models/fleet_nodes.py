"""The fleet's nodes: their rows, history, and what is read of their faults and runs."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from api.database.tables import FleetNode, Job, NodeFault, NodeHistory, NodeRun
from api.schemas.fleet_nodes import COUNTED_KINDS

_COUNTED = sorted(k.value for k in COUNTED_KINDS)


def get(session: Session, name: str, *, for_update: bool = False) -> FleetNode | None:
    query = select(FleetNode).where(FleetNode.name == name)
    return session.scalar(query.with_for_update() if for_update else query)


def page(session: Session, *, state: str | None, after: str | None, limit: int) -> list[FleetNode]:
    """Nodes in name order, after the name `after`."""
    query = select(FleetNode).order_by(FleetNode.name).limit(limit)
    if state is not None:
        query = query.where(FleetNode.state == state)
    if after is not None:
        query = query.where(FleetNode.name > after)
    return list(session.scalars(query))


def not_healthy(session: Session) -> list[str]:
    """Names of the nodes whose state may change with time alone (suspect, quarantined)."""
    return list(session.scalars(select(FleetNode.name).where(FleetNode.state != "healthy").order_by(FleetNode.name)))


def quarantined(session: Session, limit: int) -> list[str]:
    """The quarantined nodes, most recently quarantined first."""
    query = (
        select(FleetNode.name)
        .where(FleetNode.state == "quarantined")
        .order_by(FleetNode.state_since.desc(), FleetNode.name)
        .limit(limit)
    )
    return list(session.scalars(query))


def count_by_state(session: Session) -> dict[str, int]:
    return {str(s): int(n) for s, n in session.execute(select(FleetNode.state, func.count()).group_by(FleetNode.state))}


def faults_since(session: Session, name: str, since: datetime) -> list[NodeFault]:
    """The node's faults of counted kinds after `since`."""
    query = select(NodeFault).where(NodeFault.node == name, NodeFault.ts > since, NodeFault.kind.in_(_COUNTED))
    return list(session.scalars(query.order_by(NodeFault.ts)))


def fault_counts(session: Session, names: Sequence[str]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {name: {} for name in names}
    if names:
        query = (
            select(NodeFault.node, NodeFault.kind, func.count())
            .where(NodeFault.node.in_(names))
            .group_by(NodeFault.node, NodeFault.kind)
        )
        for node, kind, n in session.execute(query):
            counts[node][kind] = int(n)
    return counts


def last_faults(session: Session, names: Sequence[str]) -> dict[str, NodeFault]:
    """Each node's newest fault of a counted kind."""
    if not names:
        return {}
    newest = (
        select(NodeFault.node, func.max(NodeFault.ts).label("ts"))
        .where(NodeFault.node.in_(names), NodeFault.kind.in_(_COUNTED))
        .group_by(NodeFault.node)
        .subquery()
    )
    query = (
        select(NodeFault)
        .join(newest, (NodeFault.node == newest.c.node) & (NodeFault.ts == newest.c.ts))
        .where(NodeFault.kind.in_(_COUNTED))
        .order_by(NodeFault.id)
    )
    return {f.node: f for f in session.scalars(query)}


def job_counts(session: Session, names: Sequence[str]) -> dict[str, int]:
    if not names:
        return {}
    query = (
        select(NodeRun.node, func.count(distinct(NodeRun.job_id))).where(NodeRun.node.in_(names)).group_by(NodeRun.node)
    )
    return {node: int(n) for node, n in session.execute(query)}


def recent_faults(session: Session, name: str, limit: int) -> list[NodeFault]:
    query = select(NodeFault).where(NodeFault.node == name).order_by(NodeFault.ts.desc(), NodeFault.id.desc())
    return list(session.scalars(query.limit(limit)))


def runs(session: Session, name: str, limit: int) -> list[tuple[NodeRun, Job]]:
    query = (
        select(NodeRun, Job)
        .join(Job, Job.id == NodeRun.job_id)
        .where(NodeRun.node == name)
        .order_by(NodeRun.last_seen.desc(), NodeRun.job_id, NodeRun.attempt.desc())
        .limit(limit)
    )
    return [(run, job) for run, job in session.execute(query).tuples()]


def history(session: Session, name: str, limit: int) -> list[NodeHistory]:
    query = select(NodeHistory).where(NodeHistory.node == name).order_by(NodeHistory.id.desc()).limit(limit)
    return list(session.scalars(query))


def add_history(
    session: Session,
    name: str,
    *,
    ts: datetime,
    state: str,
    action: str,
    reason: str | None,
    actor: str,
    details: dict[str, Any] | None = None,
) -> None:
    session.add(
        NodeHistory(
            node=name, ts=ts, state=state, action=action, reason=reason, actor=actor[:300], details=details or {}
        )
    )
