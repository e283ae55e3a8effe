"""Per-rank liveness: the newest heartbeat of each rank, overwritten in place."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from api.database.tables import RankLiveness
from api.models.upsert import insert_for, max_rows_per_statement
from api.schemas.events import HeartbeatIn, utcnow


def record_heartbeats(session: Session, job_id: str, attempt: int, beats: Sequence[HeartbeatIn]) -> int:
    """Upsert a batch; the newest beat per rank wins, also against rows already stored."""
    now = utcnow()
    newest: dict[int, HeartbeatIn] = {}
    for beat in beats:
        held = newest.get(beat.rank)
        if held is None or (beat.ts or now) >= (held.ts or now):
            newest[beat.rank] = beat
    rows = [
        {
            "job_id": job_id,
            "rank": b.rank,
            "attempt": attempt,
            "node": b.node,
            "step": b.step,
            "last_seen": min(b.ts or now, now),  # a skewed clock can't make a rank look alive in the future
            "throughput": b.throughput,
            "loss": b.loss,
        }
        for b in newest.values()
    ]
    chunk = max_rows_per_statement(session, 8)
    for start in range(0, len(rows), chunk):
        stmt = insert_for(session, RankLiveness).values(rows[start : start + chunk])
        stmt = stmt.on_conflict_do_update(
            index_elements=["job_id", "rank"],
            set_={c: stmt.excluded[c] for c in ("attempt", "node", "step", "last_seen", "throughput", "loss")},
            where=(RankLiveness.attempt < stmt.excluded.attempt)
            | ((RankLiveness.attempt == stmt.excluded.attempt) & (RankLiveness.last_seen <= stmt.excluded.last_seen)),
        )
        session.execute(stmt)
    return len(beats)


def ranks(session: Session, job_id: str) -> list[RankLiveness]:
    return list(session.scalars(select(RankLiveness).where(RankLiveness.job_id == job_id).order_by(RankLiveness.rank)))


def max_step(session: Session, job_id: str, attempt: int) -> int | None:
    return session.scalar(
        select(func.max(RankLiveness.step)).where(RankLiveness.job_id == job_id, RankLiveness.attempt == attempt)
    )


def stale_ranks(session: Session, job_id: str, attempt: int, older_than: datetime) -> list[RankLiveness]:
    return list(
        session.scalars(
            select(RankLiveness).where(
                RankLiveness.job_id == job_id,
                RankLiveness.attempt == attempt,
                RankLiveness.last_seen < older_than,
            )
        )
    )


def forget_attempt(session: Session, job_id: str, attempt: int) -> None:
    session.execute(delete(RankLiveness).where(RankLiveness.job_id == job_id, RankLiveness.attempt <= attempt))
