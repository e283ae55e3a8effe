"""`python -m ftplane.trainer` on its own, one rank: with no environment at all, and under a node agent."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ftplane.trainer.checkpoint import list_checkpoints
from tests.trainer.conftest import REPO, Job, Receiver, trainer_env

pytestmark = pytest.mark.slow


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ftplane.trainer", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_runs_standalone_with_no_environment(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path), "PYTHONWARNINGS": "ignore"}
    result = run(["--model", "tiny", "--steps", "12", "--checkpoint-interval", "5"], env, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    root = tmp_path / "ftplane-standalone" / "checkpoints"
    assert [(c.step, c.complete) for c in list_checkpoints(root)] == [(10, True), (12, True)]
    assert "training finished at step 12" in result.stderr


def test_an_unrecovered_fault_exits_non_zero_after_reporting(
    receiver: Receiver, launch: Callable[..., Job], tmp_path: Path
) -> None:
    faults = json.dumps([{"kind": "exception", "rank": 0, "at_step": 3}])
    env = trainer_env(receiver, tmp_path / "ckpt", extra={"FTPLANE_FAULTS": faults})
    job = launch([sys.executable, "-m", "ftplane.trainer", "--model", "tiny", "--steps", "10"], env)
    assert job.wait(120) == 1, job.tail()  # the agent exits with its command's status
    assert receiver.types() == ["running", "fault_injected", "rank_failed"]
    [failed] = receiver.of_type("rank_failed")
    assert failed["step"] == 3 and failed["details"]["exception_type"] == "InjectedFault"
    assert failed["details"]["cause"] == "InjectedFault: injected fault spec-0: exception on rank 0 at step 3"
    assert failed["details"]["cause_class"] == "exception" and failed["details"]["rank"] == 0
    assert receiver.max_step(0) == 3
    assert receiver.token not in job.log() and "dropped a message from a rank" not in job.log()
