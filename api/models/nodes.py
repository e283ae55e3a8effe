"""Per-node liveness: the newest report of each node's agent, overwritten in place."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from pydantic import TypeAdapter
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from api.database.tables import NodeLiveness
from api.models.upsert import ColumnarUpsert, newest_wins
from api.schemas.events import utcnow
from api.schemas.reports import GpuStatus, NodeReport, RankProcessStatus

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
        "ranks": _RANKS.dump_python(status.ranks, exclude_none=True),
        "gpus": _GPUS.dump_python(status.gpus, exclude_none=True),
    }


# A list dumped in one call: a node's 8 ranks and 8 GPUs, in each of 546 reports a second at 16,384 nodes.
_RANKS = TypeAdapter(list[RankProcessStatus])
_GPUS = TypeAdapter(list[GpuStatus])


_NODE_UPSERT = ColumnarUpsert.of(NodeLiveness, ("job_id", "node"), _NODE_COLUMNS, newest_wins)


def write_nodes(session: Session, rows: list[dict[str, Any]]) -> None:
    """Upsert node rows, newest wins: a row of an older attempt, or received earlier, never overwrites a newer one
    (the coalescing writer may write a node's row after a report of its that came later was stored). On PostgreSQL
    the rows are taken in key order, as by every writer: two writers never wait on each other in a circle."""
    _NODE_UPSERT.write(session, rows)


def of_job(session: Session, job_id: str, *, after: str = "", limit: int | None = None) -> list[NodeLiveness]:
    """The job's nodes named after `after`, by name, at most `limit` (all when None)."""
    query = select(NodeLiveness).where(NodeLiveness.job_id == job_id, NodeLiveness.node > after)
    return list(session.scalars(query.order_by(NodeLiveness.node).limit(limit)))


def count(session: Session, job_id: str, attempt: int) -> int:
    query = select(func.count()).where(NodeLiveness.job_id == job_id, NodeLiveness.attempt == attempt)
    return int(session.scalar(query) or 0)


def needing_attention(session: Session, job_id: str, attempt: int, cutoff: datetime, limit: int) -> list[NodeLiveness]:
    """The attempt's nodes whose launcher ended, whose agent says they are unhealthy, or not heard since `cutoff`, by
    name, at most `limit`."""
    query = select(NodeLiveness).where(
        NodeLiveness.job_id == job_id,
        NodeLiveness.attempt == attempt,
        or_(NodeLiveness.launcher_alive.is_(False), NodeLiveness.healthy.is_(False), NodeLiveness.last_seen < cutoff),
    )
    return list(session.scalars(query.order_by(NodeLiveness.node).limit(limit)))


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
