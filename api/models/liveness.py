"""Per-rank liveness: the newest heartbeat of each rank, overwritten in place."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, func, select, text
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
    if session.get_bind().dialect.name == "postgresql":
        _upsert_postgresql(session, job_id, attempt, [newest[r] for r in sorted(newest)], now)
        return len(beats)
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
            "step_time_s": b.step_time_s,
            "compute_s": b.compute_s,
            "perf_score": b.perf_score,
        }
        for b in newest.values()
    ]
    chunk = max_rows_per_statement(session, 11)
    for start in range(0, len(rows), chunk):
        stmt = insert_for(session, RankLiveness).values(rows[start : start + chunk])
        stmt = stmt.on_conflict_do_update(
            index_elements=["job_id", "rank"],
            set_={
                c: stmt.excluded[c]
                for c in ("attempt", "node", "step", "last_seen", "throughput", "loss", "step_time_s")
                + ("compute_s", "perf_score")
            },
            where=(RankLiveness.attempt < stmt.excluded.attempt)
            | ((RankLiveness.attempt == stmt.excluded.attempt) & (RankLiveness.last_seen <= stmt.excluded.last_seen)),
        )
        session.execute(stmt)
    return len(beats)


# One statement whatever the batch size: the beats travel as one JSON array that PostgreSQL unpacks, where a
# multi-VALUES insert cost a SQL compilation and ~8 bound parameters per beat on every request.
_UPSERT_POSTGRESQL = text(
    """
    INSERT INTO rank_liveness (job_id, rank, attempt, node, step, last_seen, throughput, loss, step_time_s,
                               compute_s, perf_score)
    SELECT :job_id, u.rank, :attempt, u.node, u.step, u.last_seen, u.throughput, u.loss, u.step_time_s,
           u.compute_s, u.perf_score
    FROM jsonb_to_recordset(CAST(:beats AS jsonb))
        AS u(rank integer, node varchar, step bigint, last_seen timestamptz, throughput float8, loss float8,
             step_time_s float8, compute_s float8, perf_score float8)
    ON CONFLICT (job_id, rank) DO UPDATE SET
        attempt = excluded.attempt, node = excluded.node, step = excluded.step,
        last_seen = excluded.last_seen, throughput = excluded.throughput, loss = excluded.loss,
        step_time_s = excluded.step_time_s, compute_s = excluded.compute_s, perf_score = excluded.perf_score
    WHERE rank_liveness.attempt < excluded.attempt
       OR (rank_liveness.attempt = excluded.attempt AND rank_liveness.last_seen <= excluded.last_seen)
    """
)


def _upsert_postgresql(
    session: Session, job_id: str, attempt: int, beats: Sequence[HeartbeatIn], now: datetime
) -> None:
    """Beats in rank order, so concurrent batches lock rows in the same order (no deadlock)."""
    rows = [
        {
            "rank": b.rank,
            "node": b.node,
            "step": b.step,
            "last_seen": min(b.ts or now, now).isoformat(),
            "throughput": b.throughput,
            "loss": b.loss,
            "step_time_s": b.step_time_s,
            "compute_s": b.compute_s,
            "perf_score": b.perf_score,
        }
        for b in beats
    ]
    session.execute(_UPSERT_POSTGRESQL, {"job_id": job_id, "attempt": attempt, "beats": json.dumps(rows)})


def ranks(session: Session, job_id: str) -> list[RankLiveness]:
    return list(session.scalars(select(RankLiveness).where(RankLiveness.job_id == job_id).order_by(RankLiveness.rank)))


def has_attempt(session: Session, job_id: str, attempt: int) -> bool:
    """Whether any rank of this attempt has beaten yet."""
    query = select(RankLiveness.rank).where(RankLiveness.job_id == job_id, RankLiveness.attempt == attempt).limit(1)
    return session.scalar(query) is not None


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
