"""A control-plane outage in the middle of a job: no event lost, no training step held up.

The trainer reports through the SDK to its node agent; the agent, alone in talking to the control
plane, keeps what it could not deliver. The SDK's own behaviour while the agent is away is tested
against a fake agent in tests/sdk.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from tests.support.waiting import wait_for
from tests.trainer.conftest import TOKEN, Job, Receiver, launcher_command, trainer_env

pytestmark = pytest.mark.slow


def test_no_event_lost_and_no_step_blocked_across_a_30s_outage(
    receiver: Receiver, launch: Callable[..., Job], tmp_path: Path
) -> None:
    """A 2-rank job under its node agent; the control plane goes down for 30 s in the middle of it."""
    steps, delay, interval, outage_s = 300, 0.08, 20, 30.0
    metrics = tmp_path / "metrics-{rank}.jsonl"
    env = trainer_env(receiver, tmp_path / "ckpt", extra={"FTPLANE_CHECKPOINT_INTERVAL": str(interval)})
    args = ["--model", "tiny", "--steps", str(steps), "--step-delay-s", str(delay), "--metrics-file", str(metrics)]
    job = launch(launcher_command(args, max_restarts=0), env)

    wait_for(
        "both ranks at step 30", lambda: receiver.max_step(0) >= 30 and receiver.max_step(1) >= 30, 90, interval=0.05
    )
    receiver.stop()
    down, down_wall = time.monotonic(), time.time()
    time.sleep(outage_s)  # the outage itself is the thing under test
    receiver.start()
    up_wall = time.time()
    assert job.wait(120) == 0, job.tail()

    # Every event arrives, once, in order; those made during the outage arrive after it.
    saved = receiver.of_type("checkpoint_saved")
    assert [e["step"] for e in saved] == sorted({*range(interval, steps + 1, interval), steps})
    during = [e for e in saved if down_wall < datetime.fromisoformat(e["ts"]).timestamp() < up_wall]
    assert len(during) >= 5, "the outage should have covered several checkpoints"
    assert all(e["received"] > down + outage_s for e in during)
    with receiver.lock:
        events = [receiver.events[k] for k in receiver.event_order]
    for rank in (0, 1):
        stamps = [e["ts"] for e in events if e["rank"] == rank and e["details"].get("source") != "launcher"]
        assert stamps == sorted(stamps), f"rank {rank}'s events arrived out of order"
    assert {e["rank"] for e in receiver.of_type("running")} == {0, 1}

    # Heartbeats resumed and caught up; during the outage only the newest one per rank was kept.
    assert receiver.max_step(0) == receiver.max_step(1) == steps

    # Training never waited on the control plane.
    for rank in (0, 1):
        rows = [json.loads(line) for line in Path(str(metrics).replace("{rank}", str(rank))).read_text().splitlines()]
        outage = [r for r in rows if down_wall < r["t"] < up_wall]
        assert len(outage) >= 30  # training went on through the outage
        # run.step() takes microseconds; waiting on anything would take far longer. The bounds leave
        # room for a busy scheduler.
        reports = sorted(r["enqueue_s"] for r in outage)
        assert reports[-1] < 0.5 and reports[int(len(reports) * 0.95)] < 0.005
        assert max(r["step_s"] for r in outage) < delay + 0.5
        before = sorted(r["step_s"] for r in rows if r["t"] < down_wall)[5:]
        assert statistics.median(r["step_s"] for r in outage) < statistics.median(before) * 1.5
    assert TOKEN not in job.log()
