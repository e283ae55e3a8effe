"""Per-node liveness: the newest report of each node's agent, overwritten in place."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.database.tables import NodeLiveness
from api.models.upsert import insert_for
from api.schemas.events import utcnow
from api.schemas.reports import NodeStatus

_COLUMNS = ("attempt", "last_seen", "launcher_alive", "progress", "healthy", "unhealthy_reason", "ranks", "gpus")


def record(session: Session, job_id: str, node: str, attempt: int, status: NodeStatus) -> None:
    """Upsert a node's liveness; a report of an older attempt never overwrites a newer one."""
    row = {
        "job_id": job_id,
        "node": node,
        "attempt": attempt,
        "last_seen": utcnow(),
        "launcher_alive": status.launcher.alive if status.launcher else True,
        "progress": status.progress,
        "healthy": status.healthy,
        "unhealthy_reason": status.unhealthy_reason,
        "ranks": [r.model_dump(exclude_none=True) for r in status.ranks],
        "gpus": [g.model_dump(exclude_none=True) for g in status.gpus],
    }
    stmt = insert_for(session, NodeLiveness).values(row)
    stmt = stmt.on_conflict_do_update(
        index_elements=["job_id", "node"],
        set_={c: stmt.excluded[c] for c in _COLUMNS},
        where=NodeLiveness.attempt <= stmt.excluded.attempt,
    )
    session.execute(stmt)


def of_attempt(session: Session, job_id: str, attempt: int) -> list[NodeLiveness]:
    query = select(NodeLiveness).where(NodeLiveness.job_id == job_id, NodeLiveness.attempt == attempt)
    return list(session.scalars(query.order_by(NodeLiveness.node)))


def of_job(session: Session, job_id: str) -> list[NodeLiveness]:
    return list(session.scalars(select(NodeLiveness).where(NodeLiveness.job_id == job_id).order_by(NodeLiveness.node)))


def ranks_on(row: NodeLiveness) -> set[int]:
    return {int(r["rank"]) for r in row.ranks if isinstance(r, dict) and isinstance(r.get("rank"), int)}


def silent_since(session: Session, job_id: str, attempt: int, older_than: datetime) -> list[NodeLiveness]:
    return [n for n in of_attempt(session, job_id, attempt) if n.last_seen < older_than]
