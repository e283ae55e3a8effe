"""Goodput's straggler bucket and the rolling ETTR, on hand-built histories (figures worked out here): an episode
costs its lost_fraction of the productive time between its onset and its end; a slowdown's fault_injected stops
nothing; the buckets still partition wall time."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.services.goodput.test_accounting import ev, lost, run, running


def detected(t: float, *, onset_s: float, fraction: float, key: str = "straggler:a0:r1:t1") -> Any:
    return ev("straggler_detected", t, step=50, episode=key, onset_s=onset_s, lost_fraction=fraction)


def cleared(t: float, *, recovered_s: float, key: str = "straggler:a0:r1:t1") -> Any:
    return ev("straggler_cleared", t, episode=key, recovered_s=recovered_s, reason="recovered")


def test_an_episode_costs_its_fraction_of_the_time_between_onset_and_end() -> None:
    # a run from 10 s to the job's end at 110 s; rank 1 slow from 30 (found at 40) to 60 (cleared at 75)
    history = [
        ev("submitted", 0),
        *running(10),
        ev("fault_injected", 30, step=100, kind="slowdown", fraction=0.5, duration_steps=100),
        detected(40, onset_s=10, fraction=1 / 3),
        cleared(75, recovered_s=15),
        ev("succeeded", 110),
    ]
    g = run(history, interval_steps=None)
    assert lost(g) == {"initialization": 10, "straggler": 10}  # a third of 30..60
    assert g.productive_s == pytest.approx(90) and g.failures == 0  # the slowdown stopped nothing
    assert g.advice.straggler_s == pytest.approx(10)


def test_an_episode_open_at_the_end_lasts_to_it_and_overlapping_ones_cost_the_largest_fraction() -> None:
    history = [
        ev("submitted", 0),
        *running(0),
        detected(20, onset_s=10, fraction=0.5, key="a"),  # 10..end
        detected(30, onset_s=0, fraction=0.25, key="b"),  # 30..40, inside a
        cleared(40, recovered_s=0, key="b"),
    ]
    g = run(history, now=50)
    assert lost(g) == {"straggler": 20}  # half of 10..50; b adds nothing: the job waits for its slowest
    assert g.productive_s + sum(g.lost_s.values()) == pytest.approx(g.wall_s)


def test_straggler_time_is_taken_from_productive_time_only() -> None:
    history = [
        ev("submitted", 0),
        *running(0),
        detected(20, onset_s=20, fraction=1.0),
        ev("fault_injected", 30, step=100, kind="crash"),
        ev("injob_restart", 32, restart_count=1, cause_class="crash"),
        *running(40, 100, restart_count=1),
        cleared(60, recovered_s=0),
        ev("succeeded", 70),
    ]
    g = run(history, interval_steps=None)
    assert g.lost_s["fault_detection"] == pytest.approx(2) and g.lost_s["restart"] == pytest.approx(8)
    assert g.lost_s["straggler"] == pytest.approx(30 + 20)  # all productive time of 0..30 and 40..60
    assert g.productive_s == pytest.approx(10)


def test_rolling_goodput_shows_the_last_minutes() -> None:
    # productive until 3000 s, then a hang: nothing productive in the last 600 s
    history = [ev("submitted", 0), *running(0), ev("hang_detected", 3300, step=10, silent_s=300)]
    g = run(history, now=3600)
    rolling = {r.window_s: r for r in g.rolling}
    assert rolling[300].ettr == 0 and rolling[900].ettr == pytest.approx(300 / 900)
    assert rolling[3600].ettr == pytest.approx(g.ettr) and rolling[3600].wall_s == 3600
    short = run([ev("submitted", 0), *running(0)], now=120)
    assert [r.wall_s for r in short.rolling] == [120, 120, 120]  # a job younger than the window: all of it
