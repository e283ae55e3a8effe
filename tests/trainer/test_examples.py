"""examples/byo: a plain torch.distributed script, untouched and with the SDK's lines, under the node
agent and real ft_launcher on two CPU ranks, reporting to a stand-in control plane."""

from __future__ import annotations

import difflib
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.trainer.conftest import REPO, Job, Receiver, launcher_command, trainer_env

BYO = REPO / "examples" / "byo"
MAX_SDK_LINES = 10


def code(path: Path) -> list[str]:
    """The script's lines after its module docstring."""
    text = path.read_text()
    return text[text.index('"""', 3) + 3 :].splitlines()


def test_the_sdk_version_only_adds_its_lines() -> None:
    plain, with_sdk = code(BYO / "train_plain.py"), code(BYO / "train_sdk.py")
    matcher = difflib.SequenceMatcher(a=plain, b=with_sdk, autojunk=False)
    changes = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    assert {op[0] for op in changes} == {"insert"}, "train_sdk.py must be train_plain.py with lines added"
    added = [line for _, _, _, j1, j2 in changes for line in with_sdk[j1:j2] if line.strip()]
    assert len(added) <= MAX_SDK_LINES, added
    assert all("# ftplane" in line for line in added), added


def run_example(
    launch: Callable[..., Job], receiver: Receiver, tmp_path: Path, script: str, *args: str, **env: str
) -> Job:
    ckpt = tmp_path / "ckpt"
    command = launcher_command(
        ["--steps=30", "--checkpoint-every=10", f"--checkpoint-dir={ckpt}", *args],
        program=[sys.executable, str(BYO / script)],
        max_restarts=1,
    )
    return launch(command, trainer_env(receiver, ckpt, extra=env))


@pytest.mark.slow
def test_the_untouched_script_is_supervised_and_its_steps_read_from_its_output(
    receiver: Receiver, launch: Callable[..., Job], tmp_path: Path
) -> None:
    job = run_example(launch, receiver, tmp_path, "train_plain.py", FTPLANE_LOG_PATTERN=r"step (?P<step>\d+)")
    assert job.wait(120) == 0, job.tail()
    assert receiver.max_step(0) == receiver.max_step(1) == 30  # read from each rank's own lines
    # Nothing went wrong, and the script reports nothing itself: the agent says the run runs (its ranks are up,
    # and their lines show its first step: where it began, a plain pattern does not say).
    with receiver.lock:
        reported = list(receiver.events.values())
    said = [(e["type"], e.get("rank"), {k: e["details"].get(k) for k in ("basis", "cause")}) for e in reported]
    assert [e["type"] for e in reported] == ["running", "running"], said
    runs = {e["details"]["basis"]: e for e in reported}
    assert set(runs) == {"processes", "progress"}
    assert runs["progress"]["details"]["start_step"] is None
    with receiver.lock:
        report = receiver.reports[-1]
    assert report["node"] == "node-a" and report["progress"] == "log"
    assert [r["rank"] for r in report["ranks"]] == [0, 1]


@pytest.mark.slow
def test_the_sdk_script_reports_steps_checkpoints_and_an_injected_fault(
    receiver: Receiver, launch: Callable[..., Job], tmp_path: Path
) -> None:
    faults = json.dumps([{"kind": "exception", "rank": 1, "at_step": 15}])
    job = run_example(launch, receiver, tmp_path, "train_sdk.py", FTPLANE_FAULTS=faults)
    assert job.wait(150) == 0, job.tail()

    [fault] = receiver.of_type("fault_injected")
    assert (fault["rank"], fault["step"], fault["details"]["source"]) == (1, 15, "spec")
    # Both ranks report their failure (sys.excepthook): rank 1 the injected one, rank 0 its broken collective.
    failed = {e["rank"]: e for e in receiver.of_type("rank_failed") if e["details"].get("source") != "launcher"}
    assert sorted(failed) == [0, 1] and failed[1]["step"] == 15
    assert failed[1]["details"]["cause"].startswith("InjectedFault: injected fault spec-0")
    assert {e["details"]["cause_class"] for e in failed.values()} == {"exception"}
    assert "consequence" not in failed[1]["details"]  # the injected failure is the cause, never a consequence
    [restart] = receiver.of_type("injob_restart")  # the node agent's, from the launcher
    assert restart["details"]["restart_count"] == 1

    running = {(e["details"]["restart_count"], e["rank"]): e["details"] for e in receiver.ranks_running()}
    assert {key: d["start_step"] for key, d in running.items()} == {(0, 0): 0, (0, 1): 0, (1, 0): 10, (1, 1): 10}
    assert {d["total_steps"] for d in running.values()} == {30}
    assert {(e["rank"], e["step"]) for e in receiver.of_type("checkpoint_loaded")} == {(0, 10), (1, 10)}
    saved = receiver.of_type("checkpoint_saved")
    assert [e["step"] for e in saved] == [10, 20, 30] and {e["rank"] for e in saved} == {0}
    assert all(0 < e["details"]["blocking_s"] == e["details"]["total_s"] and e["details"]["bytes"] > 0 for e in saved)

    assert receiver.max_step(0) == receiver.max_step(1) == 30
    with receiver.lock:
        beats = [b for b in receiver.heartbeats if b["rank"] == 1 and b.get("loss") is not None]
        report = receiver.reports[-1]
    assert beats and all(b["total_steps"] == 30 and b["throughput"] > 0 for b in beats)
    assert report["progress"] == "sdk"
