"""`python -m trainer` on its own: no launcher, no control plane, one rank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.conftest import REPO, AgentStandIn, Receiver, trainer_env
from trainer.checkpoint import list_checkpoints

pytestmark = pytest.mark.slow


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_runs_standalone_with_no_environment(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path), "PYTHONWARNINGS": "ignore"}
    result = run(["--model", "tiny", "--steps", "12", "--checkpoint-interval", "5"], env, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    root = tmp_path / "ftplane-standalone" / "checkpoints"
    assert [(c.step, c.complete) for c in list_checkpoints(root)] == [(10, True), (12, True)]
    assert "training finished at step 12" in result.stderr


def test_an_unrecovered_fault_exits_non_zero_after_reporting(
    receiver: Receiver, agent: AgentStandIn, tmp_path: Path
) -> None:
    faults = json.dumps([{"kind": "exception", "rank": 0, "at_step": 3}])
    env = trainer_env(agent, tmp_path / "ckpt", extra={"FTPLANE_FAULTS": faults})
    result = run(["--model", "tiny", "--steps", "10"], env, tmp_path)
    assert result.returncode == 1
    assert receiver.types() == ["running", "fault_injected", "rank_failed"]
    [failed] = receiver.of_type("rank_failed")
    assert failed["step"] == 3 and failed["details"]["exception_type"] == "InjectedFault"
    assert failed["details"]["cause"] == "InjectedFault: injected fault spec-0: exception on rank 0 at step 3"
    assert failed["details"]["cause_class"] == "exception" and failed["details"]["rank"] == 0
    assert receiver.max_step(0) == 3 and not agent.refused
