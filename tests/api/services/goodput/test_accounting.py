"""The goodput accounting on hand-built event histories; every expected figure is worked out here.

Times are seconds after the launch of attempt 0. Every history trains at 0.2 s per step, so
100 steps take 20 s.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from api.schemas.goodput import LOST_BUCKETS, GoodputOut
from api.services.goodput import MIN_FAILURES, Record, account

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ev(type_: str, t: float, /, *, attempt: int = 0, step: int | None = None, **details: Any) -> Record:
    return Record(type_, at(t), attempt, step, details)


def running(t: float, start_step: int = 0, *, attempt: int = 0, restart_count: int = 0, iteration: int = 0):
    """Two ranks; the second reports 0.3 s after the first (the run starts at t)."""
    return [
        ev(
            "running",
            t - 0.3 + 0.3 * rank,
            attempt=attempt,
            step=start_step,
            restart_count=restart_count,
            iteration=iteration,
            start_step=start_step,
            world_size=2,
        )
        for rank in range(2)
    ]


def saved(begin: float, step: int, *, blocking: float = 1.0, total: float | None = None, attempt: int = 0) -> Record:
    """A save that started at `begin`, blocked training for `blocking` s and completed after `total` s."""
    total = blocking if total is None else total
    details = {"step": step, "blocking_s": blocking, "total_s": total, "bytes": 1000}
    return Record("checkpoint_saved", at(begin + total), attempt, step, details)


def run(history: list[Record], *, now: float = 10_000, interval_steps: int | None = 100) -> GoodputOut:
    return account(history, now=at(now), interval_steps=interval_steps)


def lost(g: Any) -> dict[str, float]:
    return {k: round(v, 6) for k, v in g.lost_s.items() if v}


def assert_partition(g: GoodputOut) -> None:
    assert set(g.lost_s) == set(LOST_BUCKETS)
    assert all(v >= 0 for v in g.lost_s.values()) and g.productive_s >= 0
    assert g.productive_s + sum(g.lost_s.values()) == pytest.approx(g.wall_s, abs=1e-9)
    assert sum(a.wall_s for a in g.attempts) == pytest.approx(g.wall_s, abs=1e-9)
    for a in g.attempts:
        assert a.productive_s + sum(a.lost_s.values()) == pytest.approx(a.wall_s, abs=1e-9)
    for bucket in LOST_BUCKETS:
        assert sum(a.lost_s[bucket] for a in g.attempts) == pytest.approx(g.lost_s[bucket], abs=1e-9)
    if g.wall_s > 0:
        assert g.ettr is not None and 0 <= g.ettr <= 1
        assert g.ettr == pytest.approx(g.productive_s / g.wall_s)


def test_clean_run() -> None:
    """Launch at 0, training from 10 (step 0), a 1 s save at step 100 (30..31), the final save at step
    200 (51..52), succeeded at 55.

    initialization 0..10 = 10; checkpoint_stall 30..31 + 51..52 = 2; shutdown 52..55 = 3 (after the final
    save); productive 10..30 + 31..51 = 40. ETTR = 40 / 55.
    """
    g = run(
        [ev("submitted", 0), *running(10), saved(30, 100), saved(51, 200), ev("succeeded", 55, final_step=200)],
    )
    assert_partition(g)
    assert g.finished and g.wall_s == 55
    assert g.productive_s == pytest.approx(40)
    assert lost(g) == {"initialization": 10, "checkpoint_stall": 2, "shutdown": 3}
    assert g.ettr == pytest.approx(40 / 55)
    assert g.failures == 0 and g.recomputed_steps == 0
    assert g.step_time_s == pytest.approx(0.2)  # furthest point: save begins at 51 with step 200; 40 s busy
    assert [a.attempt for a in g.attempts] == [0]


# The in-job restart scenario's lost seconds per bucket (test_in_job_restart_with_recompute; the API test replays it).
RESTART_SCENARIO_LOST = {
    "initialization": 10,
    "checkpoint_stall": 2,
    "fault_detection": 0.2,
    "restart": 8.8,
    "recompute": 10,
    "shutdown": 3,
}


def restart_scenario() -> list[Record]:
    """test_in_job_restart_with_recompute's history."""
    return [
        ev("submitted", 0),
        *running(10),
        saved(30, 100),
        ev("fault_injected", 41, kind="crash", source="control_plane"),
        ev("rank_failed", 41.2, step=150, cause="RuntimeError", first_to_fail=True),
        ev("rank_failed", 43, step=150, cause="exit code 1", source="launcher"),
        ev("injob_restart", 43, step=150, restart_count=1, failed_step=150, source="launcher"),
        ev("checkpoint_loaded", 49.5, step=100, load_s=0.5),
        *running(50, 100, restart_count=1),
        ev("rank_failed", 50.5, step=150, cause="killed by SIGKILL", source="launcher"),
        saved(70, 200),
        ev("succeeded", 74, final_step=200),
    ]


def test_in_job_restart_with_recompute() -> None:
    """Training from 10; save at step 100 (30..31); a crash injected at 41 (step 150 would be reached then);
    rank 0 fails in the collective at 41.2 (its report: detection); the launcher's observation of the crash
    and the restart come at 43; the restarted run resumes from step 100 at 50; the launcher's late report
    of a second rank's exit at 50.5 is no failure of the new run; final save at step 200 (70..71);
    succeeded at 74.

    initialization 10; run 1 productive 10..30 + 31..41 = 30, stall 1; fault_detection 41..41.2 = 0.2;
    restart 41.2..50 = 8.8; run 2 redoes 150 - 100 = 50 steps = 10 s (50..60: recompute), productive
    60..70 = 10, stall 70..71; shutdown 71..74 = 3. Total 74.
    """
    g = run(restart_scenario())
    assert_partition(g)
    assert g.wall_s == 74
    assert lost(g) == RESTART_SCENARIO_LOST
    assert g.productive_s == pytest.approx(40)
    assert g.failures == 1 and g.recomputed_steps == 50
    assert g.step_time_s == pytest.approx(0.2)


def test_an_agents_inferred_running_does_not_move_a_run_its_ranks_announced() -> None:
    """The restart scenario with a node agent saying `running` for ranks it saw start (source "agent": it cannot
    know the step resumed from, so step 0), later than the ranks' own: the buckets are the scenario's. A run only
    the agent announced still counts."""
    inferred = [
        ev("running", 51, step=0, restart_count=0, iteration=0, start_step=0, source="agent"),
        ev("running", 52, step=0, restart_count=1, iteration=0, start_step=0, source="agent"),
    ]
    g = run(sorted(restart_scenario() + inferred, key=lambda r: r.ts))
    assert_partition(g)
    assert lost(g) == RESTART_SCENARIO_LOST and g.recomputed_steps == 50
    assert g.step_time_s == pytest.approx(0.2)

    zero_code = [ev("submitted", 0), ev("running", 10, step=0, start_step=0, source="agent"), ev("succeeded", 30)]
    g = run(zero_code)
    assert lost(g) == {"initialization": 10} and g.productive_s == pytest.approx(20)


def cycle(t: float, number: int, node: str, *, attempt: int = 0, **phases: float) -> Record:
    return ev("launcher_cycle", t, attempt=attempt, cycle=number, node=node, phases=phases, source="launcher")


def test_the_launchers_timed_cycles_split_initialization_and_restart_without_moving_them() -> None:
    """The in-job restart scenario with two nodes' launchers timing their cycles (NVRx 0.5+): each phase is the
    slowest node's; attempt 0's cycle 0 is initialization, its cycle 1 and a later attempt's cycle 0 restarts.
    The buckets are those of the scenario without them."""
    history = restart_scenario()
    timed = [
        cycle(2, 0, "a", rendezvous=3.0, health_check=0.5, worker_start=1.0),
        cycle(2, 0, "b", rendezvous=3.5, health_check=0.25, worker_start=0.5),
        cycle(41.5, 1, "a", termination=1.5, rendezvous=2.0, worker_start=1.0),
        cycle(41.5, 1, "b", termination=2.5, rendezvous=1.0, worker_start=1.25, bogus=9.0),
        cycle(60, 0, "a", attempt=1, rendezvous=1.0),  # a later attempt's launcher: a restart
        ev("launcher_cycle", 61, cycle=2, phases="not a mapping"),  # ignored, as a cycle without a number
        ev("launcher_cycle", 61, phases={"rendezvous": 5.0}),
    ]
    g = run(history + timed)
    assert_partition(g)
    assert lost(g) == lost(run(history)) == RESTART_SCENARIO_LOST
    assert g.launcher_phases == {
        "initialization": {"rendezvous": 3.5, "health_check": 0.5, "worker_start": 1.0},
        "restart": {"termination": 2.5, "rendezvous": 3.0, "worker_start": 1.25},
    }
    assert run(history).launcher_phases == {}  # NVRx 0.4.1 times nothing


def test_a_last_run_that_saved_nothing_trains_from_its_start_to_the_final_step_then_shuts_down() -> None:
    """Training from 10, save at step 100 (30..31); rank 1 fails at 41 at step 150 (onset and detection); the
    workers restart and the new run resumes from step 100 at 50. It saves nothing: its ranks reported step 125 at
    most, so it trained 50..55 (redoing steps 100..125: recompute) and the time from 55 to `succeeded` at 70 is its
    shutdown, not training (the last flush of its agents, the launcher's exit)."""
    history = [
        ev("submitted", 0),
        *running(10),
        saved(30, 100),
        ev("rank_failed", 41, step=150),
        ev("injob_restart", 45, restart_count=1),
        *running(50, 100, restart_count=1),
    ]
    g = run([*history, ev("succeeded", 70, final_step=125)])
    assert_partition(g)
    assert lost(g)["shutdown"] == pytest.approx(15) and lost(g)["recompute"] == pytest.approx(5)
    # The ranks never stepped past where the run resumed: all of it after its start is shutdown.
    idle = run([*history, ev("succeeded", 70, final_step=100)])
    assert lost(idle)["shutdown"] == pytest.approx(20) and "recompute" not in lost(idle)
    # Nobody said the final step: the tail stays productive (steps may have followed, for all one knows).
    unknown = run([*history, ev("succeeded", 70)])
    assert "shutdown" not in lost(unknown)


def test_job_level_restart_splits_attempts() -> None:
    """Training from 10; save at step 100 (30..31); rank 1 fails at 41 at step 150 (its own report: onset and
    detection); the supervisor decides a job restart at 45 (attempt 1 starts there), launches it at 45.5;
    the new attempt's run resumes from step 100 at 60; final save at step 200 (80..81); succeeded at 84.

    Total: initialization 10, productive 30 + 10, stall 2, fault_detection 0, restart 41..60 = 19,
    recompute 60..70 = 10, shutdown 81..84 = 3; wall 84.
    Attempt 0 (0..45): initialization 10, productive 30, stall 1, restart 41..45 = 4.
    Attempt 1 (45..84): restart 45..60 = 15, recompute 10, productive 10, stall 1, shutdown 3.
    """
    g = run(
        [
            ev("submitted", 0),
            *running(10),
            saved(30, 100),
            ev("rank_failed", 41, step=150, cause="InjectedFault"),
            ev("job_restart", 45, attempt=1, step=150, from_attempt=0, failed_step=150, cause="exit code 1"),
            ev("submitted", 45.5, attempt=1),
            *running(60, 100, attempt=1),
            saved(80, 200, attempt=1),
            ev("succeeded", 84, attempt=1, final_step=200),
        ]
    )
    assert_partition(g)
    assert lost(g) == {"initialization": 10, "checkpoint_stall": 2, "restart": 19, "recompute": 10, "shutdown": 3}
    assert g.productive_s == pytest.approx(40)
    a0, a1 = g.attempts
    assert (a0.attempt, a0.wall_s, a0.start, a0.end) == (0, 45, at(0), at(45))
    assert lost(a0) == {"initialization": 10, "checkpoint_stall": 1, "restart": 4}
    assert a0.productive_s == pytest.approx(30) and a0.failures == 1
    assert (a1.attempt, a1.wall_s, a1.end) == (1, 39, at(84))
    assert lost(a1) == {"checkpoint_stall": 1, "restart": 15, "recompute": 10, "shutdown": 3}
    assert a1.productive_s == pytest.approx(10) and a1.failures == 0


def test_in_process_restart() -> None:
    """Training from 10; an async save at step 100 begins at 30, blocks 1 s and completes at 33; an exception
    injected at 41 (step 150); the rank reports it at 41.5; the wrapper re-enters (inprocess_restart,
    iteration 1, at 44) and the ranks resume from step 100 at 45; final save at step 200 (65..66);
    succeeded at 67.

    initialization 10; productive 10..30 + 31..41 = 30; stall 30..31 + 65..66; fault_detection 41..41.5;
    restart 41.5..45 = 3.5; recompute 45..55; productive 55..65 = 10; shutdown 66..67 = 1.
    """
    g = run(
        [
            ev("submitted", 0),
            *running(10),
            saved(30, 100, blocking=1, total=3),
            ev("fault_injected", 41, step=150, kind="exception"),
            ev("rank_failed", 41.5, step=150, cause="InjectedFault", iteration=0, inprocess=True),
            ev("inprocess_restart", 44, iteration=1, restart_count=0),
            *running(45, 100, iteration=1),
            saved(65, 200),
            ev("succeeded", 67, final_step=200),
        ]
    )
    assert_partition(g)
    assert lost(g) == {
        "initialization": 10,
        "checkpoint_stall": 2,
        "fault_detection": 0.5,
        "restart": 3.5,
        "recompute": 10,
        "shutdown": 1,
    }
    assert g.productive_s == pytest.approx(40)


def test_still_running_counts_up_to_now() -> None:
    """No end event: wall ends now (50). Training from 10 with a save at step 100 (30..31): initialization
    10, stall 1, productive 39. Then a hang is injected at 45 and not yet detected at now = 50: those 5 s
    are fault detection, still counting."""
    history = [ev("submitted", 0), *running(10), saved(30, 100)]
    g = run(history, now=50)
    assert_partition(g)
    assert not g.finished and g.end == at(50) and g.wall_s == 50
    assert lost(g) == {"initialization": 10, "checkpoint_stall": 1}
    assert g.productive_s == pytest.approx(39)

    g = run([*history, ev("fault_injected", 45, step=170, kind="hang")], now=50)
    assert_partition(g)
    assert lost(g) == {"initialization": 10, "checkpoint_stall": 1, "fault_detection": 5}
    assert g.productive_s == pytest.approx(34) and g.failures == 1

    g = run(history, now=5)  # a trainer clock ahead of ours: events after now are clamped
    assert_partition(g)


def test_startup_failure_and_failed_job() -> None:
    """A rank fails at 8 before any run started (initialization 0..8, detection at 8), the in-job restart
    brings the run up at 20 (restart 8..20); it fails again at 30 (reported by the rank) and the job
    gives up at 33 (failed): restart 30..33, as training never resumed; productive 20..30."""
    g = run(
        [
            ev("submitted", 0),
            ev("rank_failed", 8, cause="ImportError"),
            ev("injob_restart", 12, restart_count=1),
            *running(20, 0, restart_count=1),
            ev("rank_failed", 30, step=50, cause="RuntimeError"),
            ev("failed", 33, cause="in-job restart budget spent"),
        ]
    )
    assert_partition(g)
    assert lost(g) == {"initialization": 8, "restart": 15}
    assert g.productive_s == pytest.approx(10)
    assert g.failures == 2 and g.finished


def test_advice_young_daly_from_measured_costs() -> None:
    """Two in-job restarts. Saves block 1, 2 and 3 s (C = median = 2). Wall 200 s, 2 failures: M = 100.
    Recovery: each failure is detected when reported (0 s) and training resumes 10 s later: R = 10.
    tau* = sqrt(2 * 2 * 100) = 20 s = 100 steps at 0.2 s/step. Predicted lost fraction at tau*:
    2/20 + 20/200 + 10/100 = 0.3 -> ETTR 0.7. The current interval (50 steps = 10 s):
    2/10 + 10/200 + 0.1 = 0.35 -> 0.65."""
    history = [
        ev("submitted", 0),
        *running(10),
        saved(30, 100, blocking=1),  # 10..30 = 100 steps
        ev("rank_failed", 51, step=200, cause="x"),  # 31..51 = 100 steps
        *running(61, 100, restart_count=1),
        saved(81, 200, blocking=2),
        ev("rank_failed", 103, step=300, cause="y"),  # 83..103 = 100 steps
        *running(113, 200, restart_count=2),
        saved(133, 300, blocking=3),
        ev("succeeded", 200),
    ]
    g = run(history, interval_steps=50)
    assert_partition(g)
    assert g.failures == 2 and g.step_time_s == pytest.approx(0.2)
    a = g.advice
    assert a.checkpoint_blocking_s == 2 and a.checkpoints == 3
    assert a.mtbf_s == 100 and a.restart_cost_s == pytest.approx(10)
    assert a.optimal is not None and a.current is not None
    assert a.optimal.interval_s == pytest.approx(20) and a.optimal.interval_steps == pytest.approx(100)
    assert a.optimal.lost_fraction == pytest.approx({"checkpoint": 0.1, "recompute": 0.1, "restart": 0.1})
    assert a.optimal.predicted_ettr == pytest.approx(0.7)
    # The interval the saves show (every 100 steps), not the spec's 50: what the job does is what it costs.
    assert a.current_from == "reported checkpoints" and a.current.interval_steps == pytest.approx(100)
    assert a.current.predicted_ettr == pytest.approx(0.7)

    few = run([*history[:7], ev("succeeded", 100)])  # up to the restarted run: one failure
    assert few.failures == 1 and few.advice.mtbf_s is None and few.advice.optimal is None
    assert f"{MIN_FAILURES} needed" in few.advice.note
    spec_only = run(history[:5], interval_steps=50, now=60)  # one save: the spec's interval, 50 steps = 10 s
    assert spec_only.advice.current_from == "spec" and spec_only.advice.current is not None
    assert spec_only.advice.current.interval_s == pytest.approx(10)
    off = run(history, interval_steps=None)  # the spec's engine is none, and the ranks reported three saves
    assert off.advice.current_from == "reported checkpoints" and "checkpointing is off" not in off.advice.note
    off = run(history[:5], interval_steps=None, now=60)
    assert off.advice.current is None and "checkpointing is off" in off.advice.note


def test_no_events_means_no_wall_time() -> None:
    g = account([], now=at(5))
    assert g.wall_s == 0 and g.ettr is None and g.start is None and not g.finished
    assert_partition(g)
