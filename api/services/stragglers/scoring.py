"""Scoring one pass: each rank's pace against the job's, from the ranks' newest heartbeats (pure).

The signal is the ranks' own work per step (`compute_s`) where they time it, else their step time
(`step_time_s`: in synchronous training every rank's is the job's, so only ranks that run at their own
pace tell apart by it). A rank's score is the job's pace over its own: the median of the other ranks'
seconds per step, divided by the rank's (1 keeps up, 0.5 takes twice as long, above 1 is faster). The
median of the others, not of all, so that in a job of two ranks the slow one is measured against the
fast one. Where a rank sends NVRx's score too (trainer/sdk/stragglers.py), the lower of the two counts.
A node's score is its slowest rank's.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

COMPUTE = "compute_s"
STEP_TIME = "step_time_s"


class RankRow(NamedTuple):
    """What scoring reads of a rank's newest heartbeat (a tuple: a 16k-rank job makes 16k of them a pass)."""

    rank: int
    node: str | None
    step: int
    step_time_s: float | None = None
    compute_s: float | None = None
    perf_score: float | None = None


class RankScore(NamedTuple):
    rank: int
    node: str | None
    step: int
    score: float  # the job's pace over the rank's: 1 keeps up, lower is slower
    pace_s: float | None  # the rank's seconds per step, of the signal (None: NVRx's score alone)
    reference_s: float | None  # the other ranks' median


@dataclass(frozen=True)
class Scores:
    signal: str  # COMPUTE or STEP_TIME
    ranks: list[RankScore]
    nodes: dict[str, float]  # node -> its slowest rank's score
    step_time_s: float | None  # the job's median seconds per step (wall)

    @property
    def lowest(self) -> float | None:
        return min((r.score for r in self.ranks), default=None)


def signal_of(rows: Sequence[RankRow]) -> str:
    """compute_s when any rank times its own work, else step_time_s."""
    return COMPUTE if any(r.compute_s for r in rows) else STEP_TIME


def score_ranks(rows: Sequence[RankRow]) -> Scores:
    """Every rank with a pace (or an NVRx score) scored against the others; fewer than two ranks: none scored."""
    signal = signal_of(rows)
    paces = [row.compute_s for row in rows] if signal == COMPUTE else [row.step_time_s for row in rows]
    paced = [(row, pace) for row, pace in zip(rows, paces, strict=True) if pace is not None and pace > 0]
    values = sorted(pace for _, pace in paced)
    scored: list[RankScore] = []
    if len(values) >= 2:
        for row, pace in paced:
            reference = median_without(values, pace)
            score = reference / pace
            if row.perf_score is not None and row.perf_score < score:
                score = row.perf_score
            scored.append(RankScore(row.rank, row.node, row.step, score, pace, reference))
    seen = {r.rank for r in scored}
    scored += [
        RankScore(row.rank, row.node, row.step, row.perf_score, None, None)
        for row in rows
        if row.perf_score is not None and row.rank not in seen
    ]
    nodes: dict[str, float] = {}
    for r in scored:
        if r.node is not None and r.score < nodes.get(r.node, 2.0**30):
            nodes[r.node] = r.score
    times = [r.step_time_s for r in rows if r.step_time_s is not None and r.step_time_s > 0]
    return Scores(signal, scored, nodes, statistics.median(times) if times else None)


def median_without(values: Sequence[float], value: float) -> float:
    """The median of sorted `values` with one occurrence of `value` left out (len(values) >= 2)."""
    i = bisect.bisect_left(values, value)
    m = len(values) - 1  # the j-th of the values without index i is values[j] below i, values[j + 1] from it
    j = m // 2
    upper = values[j] if j < i else values[j + 1]
    if m % 2:
        return upper
    lower = values[j - 1] if j - 1 < i else values[j]
    return (lower + upper) / 2
