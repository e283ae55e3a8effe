"""Per-rank liveness: the newest heartbeat of each rank, overwritten in place."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from sqlalchemy import (
    ColumnElement,
    String,
    Subquery,
    and_,
    case,
    cast,
    delete,
    func,
    literal,
    null,
    or_,
    select,
)
from sqlalchemy.orm import Session

from api.database.tables import RankLiveness
from api.models.upsert import ColumnarUpsert, newest_wins
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


_RANK_UPSERT = ColumnarUpsert.of(RankLiveness, ("job_id", "rank"), _RANK_COLUMNS, newest_wins)


def write_ranks(session: Session, rows: list[dict[str, Any]]) -> None:
    """Upsert rank rows (newest heartbeat wins, also against rows other processes wrote)."""
    _RANK_UPSERT.write(session, rows)


def ranks(session: Session, job_id: str, *, after: int = -1, limit: int | None = None) -> list[RankLiveness]:
    """The job's ranks above `after`, by rank, at most `limit` (all when None)."""
    query = select(RankLiveness).where(RankLiveness.job_id == job_id, RankLiveness.rank > after)
    return list(session.scalars(query.order_by(RankLiveness.rank).limit(limit)))


@dataclass(frozen=True)
class RankCounts:
    highest: int  # the highest rank that reported (any attempt), -1 for none
    seen_in_world: int  # ranks below the spec's world size that reported (any attempt)
    reporting: int  # the attempt's ranks heard since the cutoff
    stale: int  # the attempt's ranks not heard since the cutoff


def rank_counts(session: Session, job_id: str, attempt: int, cutoff: datetime, world_size: int) -> RankCounts:
    """A job's ranks counted by the database, in one query (a job may have 131,072)."""
    current = RankLiveness.attempt == attempt
    query = select(
        func.coalesce(func.max(RankLiveness.rank), -1),
        func.count().filter(RankLiveness.rank < world_size),
        func.count().filter(current & (RankLiveness.last_seen >= cutoff)),
        func.count().filter(current & (RankLiveness.last_seen < cutoff)),
    ).where(RankLiveness.job_id == job_id)
    highest, seen, reporting, stale = session.execute(query).one()
    return RankCounts(highest, seen, reporting, stale)


def ranks_named(session: Session, job_id: str, ranks: Sequence[int]) -> list[RankLiveness]:
    if not ranks:
        return []
    query = select(RankLiveness).where(RankLiveness.job_id == job_id, RankLiveness.rank.in_(list(ranks)))
    return list(session.scalars(query))


def stalest(session: Session, job_id: str, attempt: int, cutoff: datetime, limit: int) -> list[RankLiveness]:
    """The attempt's ranks not heard since `cutoff`, the longest silent first, at most `limit`."""
    if limit <= 0:
        return []
    query = select(RankLiveness).where(
        RankLiveness.job_id == job_id, RankLiveness.attempt == attempt, RankLiveness.last_seen < cutoff
    )
    return list(session.scalars(query.order_by(RankLiveness.last_seen, RankLiveness.rank).limit(limit)))


def ranks_below(session: Session, job_id: str, world_size: int) -> list[int]:
    """The ranks below `world_size` that reported (any attempt)."""
    query = select(RankLiveness.rank).where(RankLiveness.job_id == job_id, RankLiveness.rank < world_size)
    return list(session.scalars(query))


def has_attempt(session: Session, job_id: str, attempt: int) -> bool:
    """Whether any rank of this attempt has beaten yet."""
    query = select(RankLiveness.rank).where(RankLiveness.job_id == job_id, RankLiveness.attempt == attempt).limit(1)
    return session.scalar(query) is not None


def max_step(session: Session, job_id: str, attempt: int) -> int | None:
    return session.scalar(
        select(func.max(RankLiveness.step)).where(RankLiveness.job_id == job_id, RankLiveness.attempt == attempt)
    )


def median_step_time(session: Session, job_id: str, attempt: int) -> float | None:
    """The median of an attempt's ranks' measured step times (those above 0): computed by PostgreSQL, where a job
    of 131,072 ranks would otherwise send every one of them for each look at its progress."""
    current = (RankLiveness.job_id == job_id) & (RankLiveness.attempt == attempt) & (RankLiveness.step_time_s > 0)
    if session.get_bind().dialect.name == "postgresql":
        median = func.percentile_cont(0.5).within_group(RankLiveness.step_time_s)
        return session.scalar(select(median).where(current))
    times = [t for t in session.scalars(select(RankLiveness.step_time_s).where(current)) if t is not None]
    return statistics.median(times) if times else None


class QuietKind(StrEnum):
    """Which timeout holds a quiet rank to: the heartbeat timeout, or the initial one where it is expected to be
    quiet a while."""

    running = "running"
    finishing = "finishing"  # it reported the run's last step
    restarting = "restarting"  # quiet since before a restart of the attempt began


class Verdict(StrEnum):
    silent = "silent"
    recovering = "recovering"  # silent for the timeout when a restart began: hung, and the launcher has it


@dataclass(frozen=True)
class Judgement:
    """The cut-offs the silent-rank duty judges quiet ranks by, in SQL (a job-wide hang is 131,072 ranks): a rank of
    a kind is silent when its last beat is older than that kind's `silent_before` (None: none is); a restarting rank
    not silent yet whose last beat is at or before `hung_by` was hung when the restart began."""

    restarting_since: datetime | None
    finishing_step: int | None
    silent_before: Mapping[QuietKind, datetime | None]
    hung_by: datetime | None

    def quiet_before(self) -> datetime | None:
        """The latest last beat any verdict may fall on: the rows not newer are the only ones read."""
        return max((at for at in (*self.silent_before.values(), self.hung_by) if at is not None), default=None)


class SilentGroup(Protocol):
    """The silent ranks of one node (a rank without a node is its own group) of one kind and verdict: how many, and
    the oldest last beat among them. A row, not a mapped object (a job-wide hang is 16,384 of them)."""

    @property
    def node(self) -> str | None: ...
    @property
    def rank(self) -> int | None: ...  # of a group without a node
    @property
    def kind(self) -> str: ...  # a QuietKind
    @property
    def verdict(self) -> str: ...  # a Verdict
    @property
    def ranks(self) -> int: ...
    @property
    def earliest(self) -> datetime: ...


class SilentLead(Protocol):
    """The longest-silent rank of a node's silent ranks of one verdict (the lowest rank among equals), with every
    silent rank of the group: a row of the columns the silent-rank duty reads."""

    @property
    def node(self) -> str | None: ...
    @property
    def rank(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def last_seen(self) -> datetime: ...
    @property
    def kind(self) -> str: ...
    @property
    def verdict(self) -> str: ...
    @property
    def listed(self) -> str: ...  # the group's ranks, comma-separated, in no order


@dataclass(frozen=True)
class Groups:
    """Some groups of silent ranks: their nodes, and the ranks without a node (each its own group)."""

    nodes: frozenset[str]
    nodeless_ranks: frozenset[int]

    @classmethod
    def of(cls, groups: Iterable[tuple[str | None, int | None]]) -> Groups:
        """From (node, rank) pairs, as a group is named: its node, or its rank where it has none."""
        pairs = list(groups)
        nodes = frozenset(node for node, _ in pairs if node is not None)
        return cls(nodes, frozenset(rank for node, rank in pairs if node is None and rank is not None))

    def condition(self) -> ColumnElement[bool]:
        nodeless = and_(RankLiveness.node.is_(None), RankLiveness.rank.in_(sorted(self.nodeless_ranks)))
        return or_(RankLiveness.node.in_(sorted(self.nodes)), nodeless)


def _judged(job_id: str, attempt: int, judgement: Judgement, among: Groups | None = None) -> Subquery | None:
    """The attempt's silent ranks (only rows up to `quiet_before` are read; of `among`'s groups where given), each
    with its kind and verdict; None where no rank can be silent."""
    quiet_before = judgement.quiet_before()
    if quiet_before is None:
        return None
    kinds: list[tuple[ColumnElement[bool], str]] = []
    if judgement.restarting_since is not None:
        kinds.append((RankLiveness.last_seen < judgement.restarting_since, QuietKind.restarting.value))
    if judgement.finishing_step is not None:
        kinds.append((RankLiveness.step >= judgement.finishing_step, QuietKind.finishing.value))
    kind = case(*kinds, else_=literal(QuietKind.running.value)) if kinds else literal(QuietKind.running.value)
    rows = select(RankLiveness.node, RankLiveness.rank, RankLiveness.step, RankLiveness.last_seen, kind.label("kind"))
    rows = rows.where(
        RankLiveness.job_id == job_id, RankLiveness.attempt == attempt, RankLiveness.last_seen <= quiet_before
    )
    quiet = (rows.where(among.condition()) if among is not None else rows).subquery()
    verdicts: list[tuple[ColumnElement[bool], str]] = [
        (and_(quiet.c.kind == k.value, quiet.c.last_seen < before), Verdict.silent.value)
        for k, before in judgement.silent_before.items()
        if before is not None
    ]
    if judgement.hung_by is not None:
        hung = and_(quiet.c.kind == QuietKind.restarting.value, quiet.c.last_seen <= judgement.hung_by)
        verdicts.append((hung, Verdict.recovering.value))
    if not verdicts:
        return None
    judged = select(quiet, case(*verdicts, else_=null()).label("verdict")).subquery()
    return select(judged).where(judged.c.verdict.is_not(None)).subquery()


def silent_groups(session: Session, job_id: str, attempt: int, judgement: Judgement) -> Sequence[SilentGroup]:
    """The silent ranks counted per node, kind and verdict in the database: a job-wide hang is 16,384 rows, not
    131,072."""
    judged = _judged(job_id, attempt, judgement)
    if judged is None:
        return []
    nodeless_rank = case((judged.c.node.is_(None), judged.c.rank))
    query = select(
        judged.c.node,
        nodeless_rank.label("rank"),
        judged.c.kind,
        judged.c.verdict,
        func.count().label("ranks"),
        func.min(judged.c.last_seen).label("earliest"),
    ).group_by(judged.c.node, nodeless_rank, judged.c.kind, judged.c.verdict)
    return session.execute(query).all()


def silent_leads(
    session: Session, job_id: str, attempt: int, judgement: Judgement, among: Groups | None = None
) -> Sequence[SilentLead]:
    """The lead of each group of a node's silent ranks, and each silent rank without a node (its own lead); of
    `among`'s groups only, where given."""
    judged = _judged(job_id, attempt, judgement, among)
    if judged is None:
        return []
    group = (judged.c.node, case((judged.c.node.is_(None), judged.c.rank)), judged.c.verdict)
    leads = (
        select(
            judged,
            func.row_number().over(partition_by=group, order_by=(judged.c.last_seen, judged.c.rank)).label("place"),
            func.aggregate_strings(cast(judged.c.rank, String), ",").over(partition_by=group).label("listed"),
        )
    ).subquery()
    columns = (leads.c[name] for name in ("node", "rank", "step", "last_seen", "kind", "verdict", "listed"))
    return session.execute(select(*columns).where(leads.c.place == 1)).all()


def forget_attempt(session: Session, job_id: str, attempt: int) -> None:
    session.execute(delete(RankLiveness).where(RankLiveness.job_id == job_id, RankLiveness.attempt <= attempt))
