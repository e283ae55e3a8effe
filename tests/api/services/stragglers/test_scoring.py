"""Scoring one pass (pure): each rank against the median of the others, on its own work where ranks time it."""

from __future__ import annotations

import pytest

from api.services.stragglers.episodes import end_of, lost_fraction, onset_of
from api.services.stragglers.scoring import COMPUTE, STEP_TIME, RankRow, median_without, score_ranks


def test_two_ranks_each_against_the_other() -> None:
    scores = score_ranks([RankRow(0, "a", 5, compute_s=0.2), RankRow(1, "b", 5, compute_s=0.3)])
    by_rank = {r.rank: r for r in scores.ranks}
    assert by_rank[1].score == pytest.approx(0.2 / 0.3) and by_rank[1].reference_s == 0.2
    assert by_rank[0].score == pytest.approx(1.5)  # faster than the job: above 1
    assert scores.nodes == {"a": pytest.approx(1.5), "b": pytest.approx(0.2 / 0.3)}


def test_own_work_wins_over_step_times_which_in_lockstep_are_all_the_same() -> None:
    rows = [RankRow(r, "n", 9, step_time_s=1.0, compute_s=0.5 if r != 3 else 0.8) for r in range(8)]
    scores = score_ranks(rows)
    assert scores.signal == COMPUTE and scores.step_time_s == 1.0
    assert min(scores.ranks, key=lambda r: r.score).rank == 3
    assert score_ranks([RankRow(r, "n", 9, step_time_s=1.0) for r in range(8)]).signal == STEP_TIME


def test_nvrx_scores_count_where_lower_and_alone() -> None:
    rows = [RankRow(0, "a", 1, compute_s=1.0), RankRow(1, "a", 1, compute_s=1.0, perf_score=0.6), RankRow(2, "b", 1)]
    scores = {r.rank: r.score for r in score_ranks(rows).ranks}
    assert scores == {0: 1.0, 1: 0.6}
    alone = score_ranks([RankRow(0, "a", 1, perf_score=0.7), RankRow(1, "b", 1, perf_score=1.0)])
    assert {r.rank: r.score for r in alone.ranks} == {0: 0.7, 1: 1.0}


def test_one_rank_or_none_scores_nothing() -> None:
    assert score_ranks([RankRow(0, "a", 1, compute_s=1.0)]).ranks == []
    assert score_ranks([]).ranks == [] and score_ranks([]).lowest is None


@pytest.mark.parametrize("values", [[1.0, 2.0], [1.0, 2.0, 3.0], [1.0, 1.0, 2.0, 5.0], [3.0, 3.0, 3.0]])
def test_the_median_without_one_value(values: list[float]) -> None:
    import statistics

    for i, v in enumerate(values):
        assert median_without(values, v) == statistics.median(values[:i] + values[i + 1 :])


def test_onset_and_end_skip_a_lone_hiccup() -> None:
    passes = [float(t) for t in range(20)]
    slow = [3.0, *(float(t) for t in range(10, 16)), 18.0]  # a hiccup at 3, slow 10..15, a hiccup at 18
    assert onset_of(passes, slow) == 10.0
    assert end_of(passes[8:], [t for t in slow if t >= 8]) == 15.0


def test_lost_fraction_is_the_extra_time_per_step_of_the_job() -> None:
    lockstep = score_ranks([RankRow(r, "n", 1, step_time_s=1.5, compute_s=1.0) for r in range(4)])
    assert lost_fraction(lockstep, 0.5, 0.5, 1.5) == pytest.approx(1 / 3)  # 0.5 of each 1.5 s step
    own_pace = score_ranks([RankRow(r, "n", 1, step_time_s=1.0) for r in range(4)])
    assert lost_fraction(own_pace, 0.8, 0.25, 1.25) == pytest.approx(0.2)
    assert lost_fraction(own_pace, 0.6, None, None) == pytest.approx(0.4)  # NVRx's score alone
