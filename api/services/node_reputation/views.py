"""What the API shows of nodes: a page of summaries, one node in detail."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from api.database.tables import FleetNode, NodeFault
from api.models import fleet_nodes
from api.schemas.fleet_nodes import (
    FaultKind,
    FaultOut,
    HistoryOut,
    LastFault,
    NodeDetail,
    NodePage,
    NodeState,
    NodeSummary,
    RunOut,
)

DETAIL_ROWS = 200


def page(session: Session, *, state: NodeState | None, cursor: str | None, limit: int) -> NodePage:
    """Nodes in name order; `cursor` is the name the previous page ended with."""
    rows = fleet_nodes.page(session, state=state.value if state else None, after=cursor, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return NodePage(nodes=summaries(session, rows), next_cursor=rows[-1].name if more and rows else None)


def summaries(session: Session, rows: Sequence[FleetNode]) -> list[NodeSummary]:
    names = [r.name for r in rows]
    counts = fleet_nodes.fault_counts(session, names)
    last = fleet_nodes.last_faults(session, names)
    jobs = fleet_nodes.job_counts(session, names)
    out = []
    for row in rows:
        newest = last.get(row.name)
        out.append(
            NodeSummary(
                name=row.name,
                state=NodeState(row.state),
                state_since=row.state_since,
                reason=row.reason,
                faults=counts.get(row.name, {}),
                last_fault=_last(newest) if newest else None,
                jobs=jobs.get(row.name, 0),
                quarantined_until=row.quarantined_until if row.state == NodeState.quarantined else None,
            )
        )
    return out


def _last(fault: NodeFault) -> LastFault:
    return LastFault(ts=fault.ts, kind=FaultKind(fault.kind), job_id=fault.job_id, reason=fault.reason)


def detail(session: Session, name: str) -> NodeDetail | None:
    row = fleet_nodes.get(session, name)
    if row is None:
        return None
    (summary,) = summaries(session, [row])
    runs = [
        RunOut(
            job_id=run.job_id,
            job_name=job.name,
            project=job.project,
            attempt=run.attempt,
            first_seen=run.first_seen,
            last_seen=run.last_seen,
        )
        for run, job in fleet_nodes.runs(session, name, DETAIL_ROWS)
    ]
    return NodeDetail(
        **summary.model_dump(),
        recent_faults=[FaultOut.model_validate(f) for f in fleet_nodes.recent_faults(session, name, DETAIL_ROWS)],
        runs=runs,
        history=[HistoryOut.model_validate(h) for h in fleet_nodes.history(session, name, DETAIL_ROWS)],
    )
