"""A job page's ranks and nodes, bounded: every rank and node of a job up to RANK_CELLS_MAX ranks and NODE_ROWS_MAX
nodes; past that, only those that need attention, with counts of the rest.

The page's live part is drawn again every 2 s for each viewer. At 16,384 ranks one cell per rank made it 4.5 MB and
over a second of the API's CPU each time (bench/RESULTS.md); at 131,072 ranks a single viewer would take more of
the API than every node's reports. Past the bounds the database counts and picks the ranks and nodes to draw.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from api import models
from api.database.tables import Job, JobWatch, NodeLiveness, RankLiveness
from api.services import lifecycle
from api.services.stragglers import RankRow, score_ranks

RANK_CELLS_MAX = 2_048  # one cell per rank up to this many ranks; past it, the ranks that need attention
NODE_ROWS_MAX = 256  # one row per node up to this many nodes; past it, the nodes that need attention


@dataclass(frozen=True)
class RankCell:
    rank: int
    seen: bool
    stale: bool
    step: int | None = None
    node: str | None = None
    age_s: float | None = None
    throughput: float | None = None
    score: float | None = None  # the job's pace over the rank's (1 keeps up), from its newest heartbeat
    straggler: bool = False  # in an open straggler episode
    threshold: float = 0.85  # the spec's resiliency.stragglers.threshold

    @property
    def band(self) -> str:
        """The colour of the cell: a straggler; else below the threshold now, a little slow, or keeping up."""
        if self.straggler:
            return "straggler"
        if self.score is None:
            return ""
        if self.score < self.threshold:
            return "pace-low"
        return "pace-fair" if self.score < (1 + self.threshold) / 2 else "pace-ok"


@dataclass(frozen=True)
class RanksView:
    cells: list[RankCell]
    world: int  # the spec's ranks, or more where more reported
    every_rank: bool  # a cell for every rank; else only those that need attention, and the counts below
    reporting: int  # the current attempt's ranks heard within the timeout
    stale: int  # the current attempt's ranks not heard within it (none once the job has ended)
    unseen: int  # ranks of the spec never heard
    stragglers: int  # ranks in an open straggler episode


@dataclass(frozen=True)
class NodesView:
    rows: list[NodeLiveness]  # the current attempt's
    total: int
    every_node: bool  # a row for every node; else only those that need attention (`rows`)


def is_stale(job: Job, row: RankLiveness | NodeLiveness, cutoff: datetime) -> bool:
    """A liveness row is stale while the job runs: its current attempt's, not heard since `cutoff` (the heartbeat
    timeout ago). GET /ranks and /nodes and the job page say so by this rule."""
    return job.status not in lifecycle.TERMINAL and row.attempt == job.attempt and row.last_seen < cutoff


def ranks_view(
    session: Session, job: Job, world_size: int, timeout_s: float, now: datetime, threshold: float = 0.85
) -> RanksView:
    cutoff = now - timedelta(seconds=timeout_s)
    stragglers = straggling_ranks(session, job)
    counts = models.liveness.rank_counts(session, job.id, job.attempt, cutoff, world_size)
    world = max(world_size, counts.highest + 1)
    stale = counts.stale if job.status not in lifecycle.TERMINAL else 0
    unseen = world_size - counts.seen_in_world
    view = RanksView([], world, world <= RANK_CELLS_MAX, counts.reporting, stale, unseen, len(stragglers))
    if view.every_rank:
        rows = models.liveness.ranks(session, job.id)
        return replace(view, cells=rank_cells(job, rows, world_size, cutoff, now, stragglers, threshold))
    # past the bound: stragglers, then stale ranks (the longest silent first), then ranks never heard, up to the bound
    rows = list(models.liveness.ranks_named(session, job.id, sorted(stragglers)[:RANK_CELLS_MAX]))
    if stale:
        rows += models.liveness.stalest(session, job.id, job.attempt, cutoff, RANK_CELLS_MAX - len(rows))
    cells = rank_cells(job, rows, 0, cutoff, now, stragglers, threshold, score=False)
    if unseen and len(cells) < RANK_CELLS_MAX:
        seen = set(models.liveness.ranks_below(session, job.id, world_size))
        missing = itertools.islice((r for r in range(world_size) if r not in seen), RANK_CELLS_MAX - len(cells))
        cells += [RankCell(rank=r, seen=False, stale=False) for r in missing]
    return replace(view, cells=sorted(cells, key=lambda c: c.rank))


def rank_cells(
    job: Job,
    rows: Sequence[RankLiveness],
    world_size: int,
    cutoff: datetime,
    now: datetime,
    stragglers: frozenset[int] = frozenset(),
    threshold: float = 0.85,
    *,
    score: bool = True,
) -> list[RankCell]:
    """One cell per rank of the spec (and any extra rank of `rows`); stale as in GET /ranks; scored as the straggler
    duty scores (the current attempt's ranks that are not stale) where `score`, `stragglers` in an open episode."""
    by_rank = {r.rank: r for r in rows}
    live = [r for r in rows if r.attempt == job.attempt and r.last_seen >= cutoff] if score else []
    scores = {
        s.rank: s.score
        for s in score_ranks(
            [RankRow(r.rank, r.node, r.step, r.step_time_s, r.compute_s, r.perf_score) for r in live]
        ).ranks
    }
    cells = []
    for rank in sorted(set(range(world_size)) | set(by_rank)):
        row = by_rank.get(rank)
        if row is None:
            cells.append(RankCell(rank=rank, seen=False, stale=False))
            continue
        stale = is_stale(job, row, cutoff)
        cells.append(
            RankCell(
                rank=rank,
                seen=True,
                stale=stale,
                step=row.step,
                node=row.node,
                age_s=max(0.0, (now - row.last_seen).total_seconds()),
                throughput=row.throughput,
                score=scores.get(rank),
                straggler=rank in stragglers and row.attempt == job.attempt,
                threshold=threshold,
            )
        )
    return cells


def nodes_view(session: Session, job: Job, timeout_s: float, now: datetime) -> NodesView:
    cutoff = now - timedelta(seconds=timeout_s)
    total = models.nodes.count(session, job.id, job.attempt)
    if total <= NODE_ROWS_MAX:
        return NodesView([n for n in models.nodes.of_job(session, job.id) if n.attempt == job.attempt], total, True)
    return NodesView(models.nodes.needing_attention(session, job.id, job.attempt, cutoff, NODE_ROWS_MAX), total, False)


def straggling_ranks(session: Session, job: Job) -> frozenset[int]:
    """The ranks of the job's open straggler episodes."""
    watch = session.get(JobWatch, job.id)
    if watch is None or not watch.open_stragglers:
        return frozenset()
    return frozenset(int(rank) for rank in (watch.stragglers or {}).get("open", {}))
