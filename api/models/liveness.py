"""Per-rank liveness: the newest heartbeat of each rank, overwritten in place."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import Any, Protocol

from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from api.database.tables import RankLiveness
from api.models.upsert import newest_wins, upsert, write_liveness
from api.schemas.events import HeartbeatIn, utcnow


def record_heartbeats(session: Session, job_id: str, attempt: int, beats: Sequence[HeartbeatIn]) -> int:
    """Upsert a batch; the newest beat per rank wins, also against rows already stored."""
    now = utcnow()
    newest: dict[int, HeartbeatIn] = {}
    for beat in beats:
        held = newest.get(beat.rank)
        if held is None or (beat.ts or now) >= (held.ts or now):
            newest[beat.rank] = beat
    write_ranks(session, [rank_row(job_id, attempt, newest[r], now) for r in sorted(newest)])
    return len(beats)


_RANK_COLUMNS = ("attempt", "node", "step", "last_seen", "throughput", "loss", "step_time_s", "compute_s", "perf_score")


def rank_row(job_id: str, attempt: int, beat: Any, now: datetime) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "rank": beat.rank,
        "attempt": attempt,
        "node": beat.node,
        "step": beat.step,
        "last_seen": min(beat.ts or now, now),  # a skewed clock can't make a rank look alive in the future
        "throughput": beat.throughput,
        "loss": beat.loss,
        "step_time_s": beat.step_time_s,
        "compute_s": beat.compute_s,
        "perf_score": beat.perf_score,
    }


@cache
def _rank_upsert(dialect: str) -> Any:
    return upsert(
        dialect,
        RankLiveness.__table__,
        ["job_id", "rank"],
        _RANK_COLUMNS,
        newest_wins,
    )


# PostgreSQL (upsert.write_liveness): the rows travel as one JSON array, whatever their number.
_UPSERT_RANKS_POSTGRESQL = text(
    """
    INSERT INTO rank_liveness (job_id, rank, attempt, node, step, last_seen, throughput, loss, step_time_s,
                               compute_s, perf_score)
    SELECT u.job_id, u.rank, u.attempt, u.node, u.step, u.last_seen, u.throughput, u.loss, u.step_time_s,
           u.compute_s, u.perf_score
    FROM jsonb_to_recordset(CAST(:rows AS jsonb))
        AS u(job_id varchar, rank integer, attempt integer, node varchar, step bigint, last_seen timestamptz,
             throughput float8, loss float8, step_time_s float8, compute_s float8, perf_score float8)
    ORDER BY u.job_id, u.rank
    ON CONFLICT (job_id, rank) DO UPDATE SET
        attempt = excluded.attempt, node = excluded.node, step = excluded.step,
        last_seen = excluded.last_seen, throughput = excluded.throughput, loss = excluded.loss,
        step_time_s = excluded.step_time_s, compute_s = excluded.compute_s, perf_score = excluded.perf_score
    WHERE rank_liveness.attempt < excluded.attempt
       OR (rank_liveness.attempt = excluded.attempt AND rank_liveness.last_seen <= excluded.last_seen)
    """
)


def write_ranks(session: Session, rows: list[dict[str, Any]]) -> None:
    """Upsert rank rows (newest heartbeat wins, also against rows other processes wrote)."""
    write_liveness(session, rows, _UPSERT_RANKS_POSTGRESQL, _rank_upsert("sqlite"))


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


class QuietRank(Protocol):
    """What the silent-rank duty reads of a quiet rank: a row of four columns, not a mapped object (a job-wide hang
    is 131,072 of them)."""

    @property
    def rank(self) -> int: ...
    @property
    def node(self) -> str | None: ...
    @property
    def step(self) -> int: ...
    @property
    def last_seen(self) -> datetime: ...


def stale_ranks(session: Session, job_id: str, attempt: int, older_than: datetime) -> Sequence[QuietRank]:
    rows = session.execute(
        select(RankLiveness.rank, RankLiveness.node, RankLiveness.step, RankLiveness.last_seen).where(
            RankLiveness.job_id == job_id,
            RankLiveness.attempt == attempt,
            RankLiveness.last_seen < older_than,
        )
    )
    return rows.all()


def forget_attempt(session: Session, job_id: str, attempt: int) -> None:
    session.execute(delete(RankLiveness).where(RankLiveness.job_id == job_id, RankLiveness.attempt <= attempt))
