"""End to end: the node agent, real ft_launcher, two CPU ranks over gloo reporting through the SDK, a
stand-in control plane over HTTP.

Each test injects one kind of fault and checks that the rung of the recovery
ladder it is meant to exercise fired (from the events the trainer reported and
the worker PIDs), that training resumed from a checkpoint at a step > 0, and
that the final model and optimizer state equal those of an uninterrupted run
(read back from the checkpoints on disk), i.e. the resumed run lost nothing.
In-job restarts and their causes are the node agent's to report (from the
launcher's output); everything else comes from the ranks, through the SDK.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from ftplane.trainer.checkpoint import COMPLETE_MARKER, latest_complete, list_checkpoints, step_dir
from tests.support.waiting import wait_for
from tests.trainer.conftest import Job, Receiver, launcher_command, trainer_env

pytestmark = pytest.mark.slow

STEPS = 30
TRAINER_ARGS = ["--model", "tiny", "--steps", str(STEPS), "--log-every", "5"]
JOB_TIMEOUT_S = 150


def checkpoints_root(checkpoint_dir: Path) -> Path:
    return checkpoint_dir  # step-<N> directories sit right in the job's checkpoint dir


def flat_state(checkpoint: Path, scratch: Path) -> dict[str, torch.Tensor]:
    """A DCP checkpoint read back offline, as {dotted.name: tensor}."""
    out = scratch / f"{checkpoint.name}-{len(list(scratch.glob('*.pt')))}.pt"
    dcp_to_torch_save(checkpoint, out)
    state = torch.load(out, weights_only=False)
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, torch.Tensor):
            flat[prefix] = value

    walk("", state)
    return flat


def assert_same_state(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    assert any(k.startswith("model.") for k in actual) and any(k.startswith("optim.") for k in actual)
    different = [k for k in expected if not torch.equal(actual[k], expected[k])]
    assert not different, f"{len(different)} tensors differ from the uninterrupted run, e.g. {different[:3]}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The final state of an uninterrupted 2-rank run (no node agent: the SDK's reports are no-ops)."""
    work = tmp_path_factory.mktemp("reference")
    env = trainer_env(None, work / "ckpt", extra={"FTPLANE_JOB_ID": "reference"})
    result = subprocess.run(
        launcher_command(TRAINER_ARGS, max_restarts=0),
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    final = latest_complete(checkpoints_root(work / "ckpt"))
    assert final is not None and final.step == STEPS
    return flat_state(final.path, work)


def running_by(receiver: Receiver) -> dict[tuple[int, int, int], dict]:
    """The ranks' running events keyed by (restart_count, iteration, rank)."""
    return {(e["details"]["restart_count"], e["details"]["iteration"], e["rank"]): e for e in receiver.ranks_running()}


def test_exceptions_from_the_spec_and_the_control_plane_are_recovered_in_process(
    receiver: Receiver,
    launch: Callable[..., Job],
    tmp_path: Path,
    reference: dict[str, torch.Tensor],
) -> None:
    """Two faults in one job, each recovered by the in-process rung: the spec's exception on rank 1 at step 12,
    then a fault the control plane asks for once rank 0 is past step 17 (fired once, though every later reply
    asks again)."""
    ckpt = tmp_path / "ckpt"
    env = trainer_env(
        receiver,
        ckpt,
        extra={
            "FTPLANE_INPROCESS": "1",
            "FTPLANE_COLLECTIVE_TIMEOUT_S": "5",
            "FTPLANE_FAULTS": json.dumps([{"kind": "exception", "rank": 1, "at_step": 12}]),
        },
    )
    # No in-job restart budget at all: only the in-process rung can save this job.
    job = launch(launcher_command([*TRAINER_ARGS, "--step-delay-s", "0.15"], max_restarts=0), env)
    wait_for("rank 0 to pass step 17", lambda: receiver.max_step(0) >= 17, 90, interval=0.05)
    with receiver.lock:
        receiver.faults.append({"id": "cp-fault-1", "kind": "exception", "rank": 0, "at_step": None})
    assert job.wait(JOB_TIMEOUT_S) == 0, job.tail()

    spec_fault, directed = receiver.of_type("fault_injected")
    assert (spec_fault["rank"], spec_fault["step"]) == (1, 12)
    assert spec_fault["details"]["kind"] == "exception" and spec_fault["details"]["source"] == "spec"
    assert directed["rank"] == 0 and directed["details"]["source"] == "control_plane"
    assert directed["details"]["fault_id"] == "cp-fault-1" and directed["step"] >= 18

    first, second = receiver.of_type("inprocess_restart")
    assert (first["details"]["iteration"], second["details"]["iteration"]) == (1, 2)
    assert "rank 1" in first["details"]["cause"] and "InjectedFault" in first["details"]["cause"]
    assert "rank 0" in second["details"]["cause"]
    assert not receiver.of_type("injob_restart")

    failed = {e["rank"]: e for e in receiver.of_type("rank_failed") if e["step"] == 12}
    assert failed[1]["details"]["first_to_fail"] is True and failed[1]["details"]["exception_type"] == "InjectedFault"
    assert failed[1]["details"]["cause_class"] == "exception" and failed[1]["details"]["inprocess"] is True

    # Same processes, re-entered: same PID per rank in every iteration, each resumed from the newest checkpoint.
    resumed_from = directed["step"] // 5 * 5
    running = running_by(receiver)
    for rank in (0, 1):
        for iteration, start_step in ((1, 10), (2, resumed_from)):
            assert running[(0, iteration, rank)]["details"]["pid"] == running[(0, 0, rank)]["details"]["pid"]
            assert running[(0, iteration, rank)]["details"]["start_step"] == start_step
    assert [e["step"] for e in receiver.of_type("checkpoint_loaded")] == [10, resumed_from]

    final = latest_complete(checkpoints_root(ckpt))
    assert final is not None and final.step == STEPS
    assert_same_state(flat_state(final.path, tmp_path), reference)
    assert receiver.max_step(0) == receiver.max_step(1) == STEPS


def test_crash_triggers_in_job_restart(
    receiver: Receiver,
    launch: Callable[..., Job],
    tmp_path: Path,
    reference: dict[str, torch.Tensor],
) -> None:
    """Also the async engine end to end: saves in the background, complete ones resumed from."""
    ckpt = tmp_path / "ckpt"
    env = trainer_env(
        receiver,
        ckpt,
        extra={
            "FTPLANE_CHECKPOINT_ENGINE": "async",
            "FTPLANE_FAULTS": json.dumps([{"kind": "crash", "rank": 1, "at_step": 12}]),
        },
    )
    job = launch(launcher_command(TRAINER_ARGS, max_restarts=2), env)
    assert job.wait(JOB_TIMEOUT_S) == 0, job.tail()

    [fault] = receiver.of_type("fault_injected")  # reported before the SIGKILL, fired once
    assert (fault["rank"], fault["step"], fault["details"]["kind"]) == (1, 12, "crash")

    [restart] = receiver.of_type("injob_restart")  # from the node agent, with the launcher's cause
    assert restart["details"]["restart_count"] == 1 and restart["details"]["source"] == "launcher"
    # The cause is what the launcher printed: often only rank 0's exit (its collective broke when rank 1
    # died), not rank 1's SIGKILL; the fault_injected event above is what names rank 1 here.
    details = restart["details"]
    assert details["cause_class"] == "crash" and details["rank"] in (0, 1), details
    assert not receiver.of_type("inprocess_restart")

    # New worker processes, resumed from the newest complete checkpoint: step 10, unless its
    # background save had not been confirmed complete by rank 0 when the crash came (then step 5).
    [loaded] = receiver.of_type("checkpoint_loaded")
    assert loaded["step"] in (5, 10)
    running = running_by(receiver)
    for rank in (0, 1):
        assert running[(1, 0, rank)]["details"]["pid"] != running[(0, 0, rank)]["details"]["pid"]
        assert running[(1, 0, rank)]["details"]["start_step"] == loaded["step"]
    assert fault["details"]["pid"] == running[(0, 0, 1)]["details"]["pid"]
    saved = receiver.of_type("checkpoint_saved")
    assert {e["details"]["engine"] for e in saved} == {"async"}
    assert all(0 <= e["details"]["blocking_s"] <= e["details"]["total_s"] for e in saved)

    final = latest_complete(checkpoints_root(ckpt))
    assert final is not None and final.step == STEPS
    assert_same_state(flat_state(final.path, tmp_path), reference)


def test_hang_is_detected_by_ft_launcher_heartbeat_timeout(
    receiver: Receiver,
    launch: Callable[..., Job],
    tmp_path: Path,
    reference: dict[str, torch.Tensor],
) -> None:
    ckpt = tmp_path / "ckpt"
    heartbeat_timeout, collective_timeout = 4.0, 90.0
    env = trainer_env(
        receiver,
        ckpt,
        extra={
            # The peer blocked in a collective would only give up after 90 s: a restart well before
            # that can only come from ft_launcher noticing the missing heartbeats.
            "FTPLANE_COLLECTIVE_TIMEOUT_S": str(collective_timeout),
            "FTPLANE_FAULTS": json.dumps([{"kind": "hang", "rank": 1, "at_step": 12}]),
        },
    )
    job = launch(launcher_command(TRAINER_ARGS, max_restarts=2, heartbeat_timeout=heartbeat_timeout), env)
    assert job.wait(JOB_TIMEOUT_S) == 0, job.tail()

    [fault] = receiver.of_type("fault_injected")
    assert (fault["rank"], fault["step"], fault["details"]["kind"]) == (1, 12, "hang")
    # ft_launcher killed the silent ranks: rank 1, and rank 0 too (it waits in a collective for rank 1, so
    # its loop stopped as well); the node agent names the first the launcher printed.
    [restart] = receiver.of_type("injob_restart")
    details = restart["details"]
    assert details["cause_class"] == "hang" and details["rank"] in (0, 1), details
    assert details["silent_s"] == heartbeat_timeout
    running = running_by(receiver)
    assert running[(1, 0, 1)]["details"]["pid"] != running[(0, 0, 1)]["details"]["pid"]
    assert running[(1, 0, 1)]["details"]["start_step"] == 10

    # Detection time: from the hang to ft_launcher's restart of the group, both by their own clocks (the rank's and
    # the node agent's, which reads the restart off the launcher's log before the new workers start: their start-up
    # on a busy machine is no part of detection).
    detected_after = (datetime.fromisoformat(restart["ts"]) - datetime.fromisoformat(fault["ts"])).total_seconds()
    assert heartbeat_timeout - 0.5 <= detected_after < collective_timeout / 2, detected_after
    restarted = min(e["received"] for key, e in running.items() if key[0] == 1)
    with receiver.lock:
        silent = [b for b in receiver.heartbeats if fault["received"] < b["received"] < restarted]
    assert not [b for b in silent if b["rank"] == 1 and b["step"] > 12], "the hung rank kept beating"

    final = latest_complete(checkpoints_root(ckpt))
    assert final is not None and final.step == STEPS
    assert_same_state(flat_state(final.path, tmp_path), reference)


def test_torn_checkpoint_is_never_loaded(
    receiver: Receiver,
    launch: Callable[..., Job],
    tmp_path: Path,
    reference: dict[str, torch.Tensor],
) -> None:
    ckpt = tmp_path / "ckpt"
    root = checkpoints_root(ckpt)
    first = launch(
        launcher_command(["--model", "tiny", "--steps", "15"], max_restarts=0),
        trainer_env(receiver, ckpt),
        name="first",
    )
    assert first.wait(JOB_TIMEOUT_S) == 0, first.tail()
    assert [(c.step, c.complete) for c in list_checkpoints(root)] == [(10, True), (15, True)]

    # What a crash mid-save leaves: a newer step directory with part of the data and no completion
    # marker (here: a rank's shard missing, DCP metadata present), and one with no metadata at all.
    torn = step_dir(root, 20)
    shutil.copytree(step_dir(root, 15), torn)
    (torn / COMPLETE_MARKER).unlink()
    next(torn.glob("__1_*.distcp")).unlink()
    unfinished = step_dir(root, 25)
    shutil.copytree(step_dir(root, 15), unfinished)
    (unfinished / ".metadata").unlink()
    assert latest_complete(root).step == 15

    second = launch(launcher_command(TRAINER_ARGS, max_restarts=0), trainer_env(receiver, ckpt), name="second")
    assert second.wait(JOB_TIMEOUT_S) == 0, second.tail()
    assert [e["step"] for e in receiver.of_type("checkpoint_loaded")] == [15]
    assert {e["details"]["start_step"] for e in receiver.ranks_running()} == {0, 15}

    # The torn directories were discarded and step 20/25 written again, complete.
    final = latest_complete(root)
    assert final is not None and final.step == STEPS
    assert_same_state(flat_state(final.path, tmp_path), reference)
    saved = [e["step"] for e in receiver.of_type("checkpoint_saved")]
    assert saved == [5, 10, 15, 20, 25, 30]


def test_spent_budgets_climb_the_ladder_until_the_launcher_fails(
    receiver: Receiver, launch: Callable[..., Job], tmp_path: Path
) -> None:
    """One in-process restart allowed, one in-job restart allowed, three faults: the first is
    recovered in process, the second in job, the third ends the launcher with a non-zero exit."""
    faults = [
        {"kind": "exception", "rank": 1, "at_step": 6},
        {"kind": "exception", "rank": 0, "at_step": 9},
        {"kind": "crash", "rank": 1, "at_step": 12},
    ]
    env = trainer_env(
        receiver,
        tmp_path / "ckpt",
        extra={
            "FTPLANE_FAULTS": json.dumps(faults),
            "FTPLANE_INPROCESS": "1",
            "FTPLANE_INPROCESS_MAX_ITERATIONS": "1",
            "FTPLANE_COLLECTIVE_TIMEOUT_S": "5",
        },
    )
    job = launch(launcher_command(TRAINER_ARGS, max_restarts=1), env)
    rc = job.wait(JOB_TIMEOUT_S)
    assert rc != 0, job.tail()
    assert [(e["rank"], e["step"]) for e in receiver.of_type("fault_injected")] == [(1, 6), (0, 9), (1, 12)]
    [inprocess] = receiver.of_type("inprocess_restart")
    [injob] = receiver.of_type("injob_restart")
    assert inprocess["details"]["iteration"] == 1 and injob["details"]["restart_count"] == 1
    running = running_by(receiver)
    assert set(running) == {(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1)}
    assert running[(0, 1, 1)]["details"]["pid"] == running[(0, 0, 1)]["details"]["pid"]  # in process
    assert running[(1, 0, 1)]["details"]["pid"] != running[(0, 1, 1)]["details"]["pid"]  # new processes
    assert {e["details"]["world_size"] for e in running.values()} == {2}  # never trained on fewer ranks
    assert receiver.max_step() < STEPS
