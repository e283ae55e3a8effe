"""Time an attempt waits in a queue (Kueue) is its own goodput bucket, carved out of the time before a run."""

from __future__ import annotations

import pytest

from tests.api.services.goodput.test_accounting import assert_partition, ev, lost, run, running, saved


def test_a_queue_wait_before_the_first_run_is_queued_not_initialization() -> None:
    """Launched at 0, queued at 1 until Kueue admits it at 31; training from 41 (step 0); the final save at
    step 100 (61..62); succeeded at 65.

    queued 1..31 = 30; initialization 0..1 + 31..41 = 11; checkpoint_stall 61..62 = 1; shutdown 62..65 = 3;
    productive 41..61 = 20.
    """
    g = run(
        [
            ev("submitted", 0),
            ev("queued", 1, queue_state="waiting", queue="team-a"),
            ev("queued", 31, queue_state="admitted", queue="team-a"),
            *running(41),
            saved(61, 100),
            ev("succeeded", 65, final_step=100),
        ]
    )
    assert_partition(g)
    assert lost(g) == {"queued": 30, "initialization": 11, "checkpoint_stall": 1, "shutdown": 3}
    assert g.productive_s == pytest.approx(20)


def test_a_preemption_then_a_new_attempt_queued_again() -> None:
    """Training from 10; preempted at 30 (step 100 saved at 29..30); the job restart at 32 makes attempt 1,
    which waits in the queue 33..63 and runs again from 70 (step 100) until it is cancelled at 80.

    initialization 0..10; productive 10..29 (19) + 70..80 (10); stall 29..30; fault_detection 30..30 (the
    preemption is its own detection); restart 30..33 + 63..70 = 10; queued 33..63 = 30.
    """
    g = run(
        [
            ev("submitted", 0),
            *running(10),
            saved(29, 100),
            ev("preempted", 30, cause_class="preempted"),
            ev("job_restart", 32, attempt=1, from_attempt=0, failed_step=100),
            ev("queued", 33, attempt=1, queue_state="waiting"),
            ev("queued", 63, attempt=1, queue_state="admitted"),
            *running(70, 100, attempt=1),
            ev("cancelled", 80, attempt=1),
        ]
    )
    assert_partition(g)
    assert g.failures == 1
    assert lost(g) == {"initialization": 10, "checkpoint_stall": 1, "restart": 10, "queued": 30}
    assert g.productive_s == pytest.approx(29)
    queued_by_attempt = [a.lost_s["queued"] for a in g.attempts]
    assert queued_by_attempt == [0, pytest.approx(30)]


def test_a_wait_never_admitted_lasts_until_the_job_ends() -> None:
    g = run([ev("submitted", 0), ev("queued", 2, queue_state="waiting"), ev("cancelled", 50)])
    assert_partition(g)
    assert lost(g) == {"initialization": 2, "queued": 48}
