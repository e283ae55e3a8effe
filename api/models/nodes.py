"""Per-node liveness: the newest report of each node's agent, overwritten in place."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import Any, Protocol

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from api.database.tables import NodeLiveness
from api.models.upsert import newest_wins, upsert, write_liveness
from api.schemas.events import utcnow
from api.schemas.reports import NodeReport

_NODE_COLUMNS = ("attempt", "last_seen", "launcher_alive", "progress", "healthy", "unhealthy_reason", "ranks", "gpus")


def record(session: Session, job_id: str, report: NodeReport) -> None:
    """Upsert a node's liveness, newest wins (see write_nodes)."""
    write_nodes(session, [node_row(job_id, report, utcnow())])


def node_row(job_id: str, report: NodeReport, now: datetime) -> dict[str, Any]:
    status = report.agent
    return {
        "job_id": job_id,
        "node": report.node,
        "attempt": report.attempt,
        "last_seen": now,
        "launcher_alive": status.launcher.alive if status.launcher else True,
        "progress": status.progress,
        "healthy": status.healthy,
        "unhealthy_reason": status.unhealthy_reason,
        "ranks": [r.model_dump(exclude_none=True) for r in status.ranks],
        "gpus": [g.model_dump(exclude_none=True) for g in status.gpus],
    }


@cache
def _node_upsert(dialect: str) -> Any:
    return upsert(
        dialect,
        NodeLiveness.__table__,
        ["job_id", "node"],
        _NODE_COLUMNS,
        newest_wins,
    )


# PostgreSQL (upsert.write_liveness): no JSON document serialized per row for `ranks` and `gpus` (json, not jsonb:
# kept as sent).
_UPSERT_NODES_POSTGRESQL = text(
    """
    INSERT INTO node_liveness (job_id, node, attempt, last_seen, launcher_alive, progress, healthy, unhealthy_reason,
                               ranks, gpus)
    SELECT u.job_id, u.node, u.attempt, u.last_seen, u.launcher_alive, u.progress, u.healthy, u.unhealthy_reason,
           u.ranks, u.gpus
    FROM json_to_recordset(CAST(:rows AS json))
        AS u(job_id varchar, node varchar, attempt integer, last_seen timestamptz, launcher_alive boolean,
             progress varchar, healthy boolean, unhealthy_reason text, ranks json, gpus json)
    ORDER BY u.job_id, u.node
    ON CONFLICT (job_id, node) DO UPDATE SET
        attempt = excluded.attempt, last_seen = excluded.last_seen, launcher_alive = excluded.launcher_alive,
        progress = excluded.progress, healthy = excluded.healthy, unhealthy_reason = excluded.unhealthy_reason,
        ranks = excluded.ranks, gpus = excluded.gpus
    WHERE node_liveness.attempt < excluded.attempt
       OR (node_liveness.attempt = excluded.attempt AND node_liveness.last_seen <= excluded.last_seen)
    """
)


def write_nodes(session: Session, rows: list[dict[str, Any]]) -> None:
    """Upsert node rows, newest wins: a row of an older attempt, or received earlier, never overwrites a newer one
    (the coalescing writer may write a node's row after a report of its that came later was stored). On PostgreSQL
    the rows are taken in key order, as by every writer: two writers never wait on each other in a circle."""
    write_liveness(session, rows, _UPSERT_NODES_POSTGRESQL, _node_upsert("sqlite"))


def of_job(session: Session, job_id: str) -> list[NodeLiveness]:
    return list(session.scalars(select(NodeLiveness).where(NodeLiveness.job_id == job_id).order_by(NodeLiveness.node)))


class NodeSeen(Protocol):
    """When a node's agent last reported: a row of two columns, not a mapped object (a job has 16,384 nodes)."""

    @property
    def node(self) -> str: ...
    @property
    def last_seen(self) -> datetime: ...


def last_seen_of_attempt(session: Session, job_id: str, attempt: int) -> Sequence[NodeSeen]:
    query = select(NodeLiveness.node, NodeLiveness.last_seen).where(
        NodeLiveness.job_id == job_id, NodeLiveness.attempt == attempt
    )
    return session.execute(query.order_by(NodeLiveness.node)).all()


def any_with_progress(session: Session, job_id: str, attempt: int, progress: str) -> bool:
    """Whether an agent of the attempt says its ranks' progress comes from `progress` (e.g. "sdk")."""
    query = select(NodeLiveness.node).where(
        NodeLiveness.job_id == job_id, NodeLiveness.attempt == attempt, NodeLiveness.progress == progress
    )
    return session.scalar(query.limit(1)) is not None
