"""A pod told to stop (finding 13: an eviction lost the checkpoint in flight, the agent killing the launcher 10 s
after SIGTERM whatever the pod's grace period): the agent passes SIGTERM on and waits the job's stop grace
(FTPLANE_STOP_GRACE_S) before it kills anything, and a rank that uses the SDK's `termination` learns of it and
may finish a save."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from tests.support.waiting import wait_for

SAVING_RANK = """
import pathlib, sys, time
from ftplane.trainer.sdk import termination
termination.install()
out = pathlib.Path(sys.argv[1])
(out / "ready").write_text("")
while not termination.requested():
    time.sleep(0.05)
left = termination.seconds_left()
time.sleep(12)  # a checkpoint save longer than the agent's old 10 s
(out / "saved").write_text(f"{left:.0f}")
"""


def test_sigterm_reaches_the_rank_which_gets_the_stop_grace_to_save(start_agent: Any, tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(SAVING_RANK)
    agent = start_agent(None, None, [sys.executable, str(script), str(tmp_path)], FTPLANE_STOP_GRACE_S="40")
    wait_for("the rank to start", lambda: (tmp_path / "ready").exists(), 60)
    os.kill(agent.process.pid, signal.SIGTERM)  # the kubelet stopping the pod
    assert agent.wait(60) == 128 + signal.SIGTERM  # stopped, not finished: never a Succeeded pod
    assert (tmp_path / "saved").read_text() in ("39", "40")  # it knew how long it had


def test_termination_is_a_flag_after_install_and_nothing_before() -> None:
    import subprocess

    code = (
        "import os, signal, time\n"
        "from ftplane.trainer.sdk import termination\n"
        "assert not termination.requested() and termination.seconds_left() is None\n"
        "termination.install()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(0.1)\n"
        "assert termination.requested() and 0 < termination.seconds_left() <= 7\n"
        "os.kill(os.getpid(), signal.SIGTERM)  # twice: ends as Python would\n"
        "time.sleep(5)\n"
    )
    ended = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "FTPLANE_STOP_GRACE_S": "7"}, timeout=60, check=False
    )
    assert ended.returncode == -signal.SIGTERM
