"""Goodput's rules for what says where a run began: the SDK, the ranks' output read by the node agent (zero-code
progress), or only their processes being up; and the tail of a succeeded job. Times are seconds after the launch;
every history trains at 0.2 s per step."""

from __future__ import annotations

import pytest

from api.services.goodput_view import runs_line
from tests.api.services.goodput.test_accounting import assert_partition, at, ev, lost, run, running, saved


def agent_running(t: float, basis: str, start_step: int | None = None, *, restart_count: int = 0) -> list:
    """The node agent's `running` of one round (one node)."""
    details = {"restart_count": restart_count, "iteration": 0, "start_step": start_step, "source": "agent"}
    return [ev("running", t, step=start_step, basis=basis, **details)]


def launcher_failure(t: float, step: int, step_at: float) -> list:
    """A rank's end seen by the launcher at t; the agent read its last step at step_at."""
    seen = at(step_at).isoformat()
    return [ev("rank_failed", t, step=step, cause="killed by SIGKILL", source="launcher", step_at=seen)]


def zero_code_restart(*, resumed_from: int | None) -> list:
    """Ranks up at 5, their output shows training begin at 10 (step 0); a crash at 40 (last step read, 150, at
    40); the launcher sees it at 41 and restarts at 42; the new ranks are up at 45, their output shows the run
    resuming at 50 (from step 100, or not saying); succeeded at 80, the ranks' highest step 250."""
    return [
        ev("submitted", 0),
        *agent_running(5, "processes"),
        *agent_running(10, "progress", 0),
        *launcher_failure(41, 150, 40),
        ev("injob_restart", 42, step=150, restart_count=1, failed_step=150, source="launcher"),
        *agent_running(45, "processes", restart_count=1),
        *agent_running(50, "progress", resumed_from, restart_count=1),
        ev("succeeded", 80, final_step=250),
    ]


def test_zero_code_progress_starts_runs_where_the_output_does_and_measures_recompute() -> None:
    """Productive time starts where the output showed each run begin (10, 50), not when the processes were up
    (start-up is initialization and restart). The second run resumed from 100 where 150 was reached: 50 steps
    redone (10 s at the 0.2 s per step the first run's failure shows: 150 steps in 10..40). No checkpoint:
    the tail to `succeeded` stays productive.

    initialization 0..10; productive 10..41 (the launcher's report is no time signal: the run ends at the
    restart's detection, 42); restart 42..50; recompute 50..60; productive 60..80."""
    g = run(zero_code_restart(resumed_from=100))
    assert_partition(g)
    assert g.step_time_s == pytest.approx(0.2)
    assert g.recomputed_steps == 50
    assert lost(g) == {"initialization": 10, "restart": 8, "recompute": 10}
    assert g.productive_s == pytest.approx(52)
    assert [(r.basis, r.start_step, r.start) for r in g.runs] == [("progress", 0, at(10)), ("progress", 100, at(50))]


def test_a_run_resumed_from_a_step_nobody_said_is_cannot_tell_not_zero() -> None:
    unsaid = run(zero_code_restart(resumed_from=None))
    assert_partition(unsaid)
    assert unsaid.recomputed_steps is None and unsaid.lost_s["recompute"] == 0
    assert unsaid.runs[1].start_step is None

    # Without progress at all: productive from the processes being up; recompute unknown after the restart.
    processes_only = [
        ev("submitted", 0),
        *agent_running(5, "processes"),
        ev("rank_failed", 41, cause="killed by SIGKILL", source="launcher"),
        ev("injob_restart", 42, restart_count=1, source="launcher"),
        *agent_running(45, "processes", restart_count=1),
        ev("succeeded", 80),
    ]
    g = run(processes_only)
    assert_partition(g)
    assert g.recomputed_steps is None and g.step_time_s is None
    assert [r.basis for r in g.runs] == ["processes", "processes"]
    assert runs_line(g) == (
        "Productive time of 2 runs from: the ranks' processes being up (no progress: start-up counts as productive). "
        "Steps redone after a restart: cannot tell (no run said where it resumed)"
    )
    assert lost(g) == {"initialization": 5, "restart": 3} and g.productive_s == pytest.approx(72)

    # One run and no restart: nothing was redone, and that can be told.
    assert run(processes_only[:3] + [ev("succeeded", 30)]).recomputed_steps == 0


def test_the_sdks_running_comes_before_the_agents_words() -> None:
    """Where the ranks' SDK said `running` (11, at step 0), the agent's processes (5) and progress (10) are left
    out: the run starts at 11."""
    g = run([ev("submitted", 0), *agent_running(5, "processes"), *agent_running(10, "progress", 0), *running(11)])
    assert [(r.basis, r.start) for r in g.runs] == [("sdk", at(11))]
    assert lost(g) == {"initialization": 11}


def test_a_succeeded_runs_steps_after_its_last_checkpoint_are_productive() -> None:
    """Training from 10; the last save at step 100 (30..31); the ranks go on to step 150 (10 s more, to 41) and
    the job succeeds at 45: 31..41 is productive, only 41..45 is shutdown. Without the final step it is all
    productive; with the save at the final step, everything after it is shutdown."""
    history = [ev("submitted", 0), *running(10), saved(30, 100)]
    g = run([*history, ev("succeeded", 45, final_step=150)])
    assert_partition(g)
    assert lost(g) == {"initialization": 10, "checkpoint_stall": 1, "shutdown": 4}
    assert g.productive_s == pytest.approx(30)

    unknown = run([*history, ev("succeeded", 45)])
    assert lost(unknown) == {"initialization": 10, "checkpoint_stall": 1} and unknown.productive_s == pytest.approx(34)

    at_the_end = run([*history, ev("succeeded", 45, final_step=100)])
    assert lost(at_the_end) == {"initialization": 10, "checkpoint_stall": 1, "shutdown": 14}


def test_the_step_a_rank_showed_after_its_fault_was_handed_over_still_times_the_steps() -> None:
    """A crash handed over at 39.5 (the run's lost time starts there) that the rank outlives for a moment: the agent
    read its step 150 at 40, after the onset. That point still says 150 steps took 10..40 (the rank was training
    then): 0.2 s per step and 50 steps redone, not "no step time" and none redone (a loaded CI run saw that)."""
    history = zero_code_restart(resumed_from=100)
    history.insert(3, ev("fault_injected", 39.5, kind="crash", source="control_plane"))
    g = run(history)
    assert_partition(g)
    assert g.step_time_s == pytest.approx(0.2)
    assert g.recomputed_steps == 50 and lost(g)["recompute"] == pytest.approx(10)
