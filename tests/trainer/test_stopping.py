"""The built-in trainer told to stop (finding 13: an eviction lost the checkpoint in flight): SIGTERM reaches the
ranks through the node agent and ft_launcher, every rank saves the step it is at, the (async) save completes,
and the node ends as stopped, not finished."""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ftplane.trainer.checkpoint import list_checkpoints
from tests.support.waiting import wait_for
from tests.trainer.conftest import Job, Receiver, free_port, launcher_command, trainer_env

pytestmark = pytest.mark.slow

STOPPED_AT = re.compile(r"told to stop: stopping at step (\d+)")


def test_sigterm_mid_run_leaves_a_complete_checkpoint_of_the_step_it_stopped_at(
    receiver: Receiver, launch: Callable[..., Job], tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    # Async saves (dcp.async_save on the CPU), none due before the stop: the only checkpoint is the stop's own,
    # written in the background, so the rank must wait for it before it ends.
    env = trainer_env(
        receiver,
        root,
        extra={
            "FTPLANE_CHECKPOINT_ENGINE": "async",
            "FTPLANE_CHECKPOINT_INTERVAL": "100000",
            "FTPLANE_STOP_GRACE_S": "120",
        },
    )
    args = ["--model", "tiny", "--steps", "100000", "--step-delay-s", "0.05", "--log-every", "1"]
    job = launch(launcher_command(args, nproc=2), env)
    wait_for("the ranks to make steps", lambda: receiver.max_step(0) >= 3 and receiver.max_step(1) >= 3, 180)

    os.kill(job.process.pid, signal.SIGTERM)  # the kubelet stopping the pod
    assert job.wait(150) == 128 + signal.SIGTERM, job.tail()  # stopped, not finished

    stops = STOPPED_AT.findall(job.log())
    assert stops, job.tail()
    stopped_at = int(stops[-1])
    assert stopped_at >= 3
    assert [(c.step, c.complete) for c in list_checkpoints(root)] == [(stopped_at, True)], job.tail()
    [saved] = receiver.of_type("checkpoint_saved")
    assert saved["step"] == stopped_at and saved["details"]["engine"] == "async"
    assert "training finished" not in job.log()


def test_one_node_stopped_stops_the_other_which_never_reads_as_finished(
    receiver: Receiver, launch: Callable[..., Job], tmp_path: Path
) -> None:
    """An eviction stops one pod only: the other node's ranks learn of it at the same step (the save needs every
    rank), save with it, and end as stopped by the others: the node told to stop reports 128 + SIGTERM, the other
    its launcher's failure, never 0 (a Succeeded index)."""
    root = tmp_path / "ckpt"
    port = free_port()
    args = ["--model", "tiny", "--steps", "100000", "--step-delay-s", "0.05", "--log-every", "1"]
    jobs = []
    for node in ("node-a", "node-b"):
        env = trainer_env(
            receiver,
            root,
            extra={"FTPLANE_CHECKPOINT_INTERVAL": "100000", "FTPLANE_STOP_GRACE_S": "120", "FTPLANE_NODE_NAME": node},
        )
        command = [
            f"--rdzv-endpoint=127.0.0.1:{port}" if part.startswith("--rdzv-endpoint=") else part
            for part in launcher_command(args, nproc=1, max_restarts=0)
        ]
        command[command.index("--nnodes=1")] = "--nnodes=2"
        jobs.append(launch(command, env, name=node))
    wait_for("both nodes to make steps", lambda: receiver.max_step(0) >= 3 and receiver.max_step(1) >= 3, 180)

    stopped, other = jobs
    os.kill(stopped.process.pid, signal.SIGTERM)  # the kubelet stopping one pod
    assert stopped.wait(150) == 128 + signal.SIGTERM, stopped.tail()
    assert other.wait(150) not in (0, 128 + signal.SIGTERM), other.tail()  # never a finished node

    logs = stopped.log() + other.log()
    [stopped_at] = {int(step) for step in STOPPED_AT.findall(logs)}
    assert [(c.step, c.complete) for c in list_checkpoints(root)] == [(stopped_at, True)]


@pytest.mark.parametrize(("told", "ended"), [(True, 0), (False, -signal.SIGTERM)])
def test_a_stopped_rank_exits_0_where_told_and_by_sigterm_where_only_the_others_were(told: bool, ended: int) -> None:
    import subprocess

    code = (
        "import os, signal, time\n"
        "from ftplane.trainer.sdk import termination\n"
        "termination.install()\n"
        f"if {told}:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.1)\n"
        f"assert termination.agreed() is {told} and termination.agreed_stop() is {told}\n"
        "termination.end()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], timeout=60, check=False, capture_output=True, text=True)
    assert result.returncode == ended, result.stderr
