"""Silences in the goodput accounting (hang_detected, heartbeat_lost): where a hang's lost time begins and which
silences are about the run, on hand-built histories (the conventions of test_accounting.py: seconds after the
launch, 0.2 s per step)."""

from __future__ import annotations

import pytest

from tests.api.services.goodput.test_accounting import assert_partition, ev, lost, run, running, saved

# The hang scenario's lost seconds per bucket (test_hang_detected_by_silence; the API test replays it).
HANG_SCENARIO_LOST = {
    "initialization": 10,
    "checkpoint_stall": 2,
    "fault_detection": 30,
    "restart": 9,
    "recompute": 10,
    "shutdown": 3,
}


def test_hang_detected_by_silence() -> None:
    """Training from 10; save at step 100 (30..31); rank 0 hangs at 41 at step 150 (injected); the control
    plane sees it at 71 after 30 s of silence (onset 71 - 30 = 41); the launcher restarts the workers
    (injob_restart at 75); the new run resumes from step 100 at 80. A second rank's silence detected at 85
    began at 75, before the new run started: it is about the old run and ignored. Final save at step
    200 (100..101); succeeded at 104.

    initialization 10; productive 10..30 + 31..41 = 30; stall 1; fault_detection 41..71 = 30; restart
    71..80 = 9; recompute 50 steps = 80..90; productive 90..100 = 10; stall 100..101; shutdown 101..104.
    """
    g = run(
        [
            ev("submitted", 0),
            *running(10),
            saved(30, 100),
            ev("fault_injected", 41, step=150, kind="hang"),
            ev("hang_detected", 71, step=150, cause="no heartbeat for 30.0 s (timeout 30 s) at step 150", silent_s=30),
            ev("injob_restart", 75, restart_count=1),
            *running(80, 100, restart_count=1),
            ev("hang_detected", 85, step=150, cause="no heartbeat for 10.0 s", silent_s=10),
            saved(100, 200),
            ev("succeeded", 104, final_step=200),
        ]
    )
    assert_partition(g)
    assert lost(g) == HANG_SCENARIO_LOST
    assert g.productive_s == pytest.approx(40)
    assert g.failures == 1


def test_a_job_wide_silence_began_where_the_job_stopped_stepping_not_at_a_lagging_nodes_last_report() -> None:
    """A node stops dead at 41 at step 150; its agent last reported at 20 (step 130, a 30 s report interval). Every
    other rank waits in its next collective: last heard at step 150 from 41.2 on. All are found silent (a node's
    lead rank each, as the supervisor records them); the job stopped stepping at step 150, at 41.2: training ran
    until then (not until 20), fault_detection 41.2..101 (the first detection), restart 101..140."""
    g = run(
        [
            ev("submitted", 0),
            *running(10),
            ev("hang_detected", 101, step=130, silent_s=81.0),  # the silent node's rank: last report at 20
            ev("hang_detected", 131.5, step=150, silent_s=90.3),  # the others: at the highest step from 41.2
            ev("hang_detected", 131.5, step=150, silent_s=90.1),
            ev("job_restart", 131.6, from_attempt=0),
            *running(140, 100, attempt=1),
        ],
        now=150,
    )
    assert_partition(g)
    assert g.failures == 1
    assert lost(g)["fault_detection"] == pytest.approx(101 - 41.2)
    assert g.productive_s == pytest.approx(41.2 - 10)  # the new run's 10 s redo steps 100.. (recompute)


def test_a_silence_without_silent_s_is_detection_only() -> None:
    """The cause is a sentence for people, never read: without silent_s a hang's onset is its detection
    at 71 (training counts as productive until then), not 71 - 30.0."""
    g = run(
        [
            ev("submitted", 0),
            *running(10),
            ev("hang_detected", 71, step=150, cause="no heartbeat for 30.0 s (timeout 30 s) at step 150"),
        ],
        now=80,
    )
    assert_partition(g)
    assert lost(g) == {"initialization": 10, "restart": 9}
    assert g.productive_s == pytest.approx(61)
