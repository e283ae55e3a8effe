"""The fault injector: the right fault, on the right rank, before the right step, once per job."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ftplane.trainer.faults import (
    FaultInjector,
    FaultSpec,
    FaultSpecError,
    InjectedFault,
    hang_forever,
    marker_dir,
    parse_faults,
)
from tests.support.waiting import wait_for
from tests.trainer.conftest import REPO


class FakeReporter:
    """An EventSink that keeps what it is given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def event(self, type: str, **kwargs: Any) -> str:
        self.calls.append(("event", (type, kwargs)))
        return "k"

    def flush(self, timeout: float) -> bool:
        self.calls.append(("flush", timeout))
        return True


def injector(tmp_path: Path, faults: list[FaultSpec], rank: int = 1) -> tuple[FaultInjector, FakeReporter]:
    reporter = FakeReporter()
    return (
        FaultInjector(faults, rank=rank, job_id="job-1", markers=tmp_path / "faults", reporter=reporter),  # type: ignore[arg-type]
        reporter,
    )


def run_steps(inj: FaultInjector, steps: range) -> list[int]:
    """The steps before which a fault fired."""
    fired = []
    for step in steps:
        try:
            inj.before_step(step)
        except InjectedFault:
            fired.append(step)
    return fired


def test_a_spec_fault_fires_on_its_rank_at_its_step_reported_and_flushed_first(tmp_path: Path) -> None:
    faults = [FaultSpec("exception", 1, 5), FaultSpec("exception", 0, 3)]
    inj, reporter = injector(tmp_path, faults, rank=1)
    assert run_steps(inj, range(10)) == [5]
    (kind, (type_, kwargs)), (flush, timeout) = reporter.calls
    assert (kind, type_, flush) == ("event", "fault_injected", "flush")
    assert kwargs["rank"] == 1 and kwargs["step"] == 5 and 0 < timeout <= 2
    assert kwargs["details"] == {
        "kind": "exception",
        "source": "spec",
        "fault_id": "spec-0",
        "at_step": 5,
        "pid": os.getpid(),
        "index": 0,
    }


def test_a_fault_fires_once_per_job_across_restarts(tmp_path: Path) -> None:
    faults = [FaultSpec("exception", 1, 5)]
    first, _ = injector(tmp_path, faults)
    assert run_steps(first, range(10)) == [5]
    assert run_steps(first, range(3, 10)) == []  # in-process restart from an earlier checkpoint
    again, reporter = injector(tmp_path, faults)  # a restarted process, same shared storage
    assert run_steps(again, range(10)) == [] and reporter.calls == []
    marker = json.loads((tmp_path / "faults" / "job-1.spec-0").read_text())
    assert marker["kind"] == "exception" and marker["step"] == 5


def test_control_plane_directives(tmp_path: Path) -> None:
    inj, reporter = injector(tmp_path, [], rank=1)
    inj.add_directives(
        [
            {"id": "a", "kind": "exception", "rank": 1, "at_step": None},  # next step
            {"id": "b", "kind": "exception", "rank": 0, "at_step": None},  # another rank's
            {"id": "c", "kind": "meteor", "rank": 1, "at_step": None},  # unknown kind
            {"id": "d", "kind": "exception", "rank": 1, "at_step": 2},  # already passed: next step
            {"id": "e", "kind": "exception", "rank": 1, "at_step": 40},
        ]
    )
    assert run_steps(inj, range(30, 32)) == [30, 31]  # a, then d (one fault per raise)
    inj.add_directives([{"id": "a", "kind": "exception", "rank": 1, "at_step": None}])  # repeated reply
    assert run_steps(inj, range(32, 45)) == [40]
    sources = [c[1][1]["details"] for c in reporter.calls if c[0] == "event"]
    assert [(d["fault_id"], d["source"]) for d in sources] == [
        ("a", "control_plane"),
        ("d", "control_plane"),
        ("e", "control_plane"),
    ]


def test_marker_dir_is_shared_storage_or_a_per_job_temp_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert marker_dir("/ckpt/j", "j") == Path("/ckpt/j/.ftplane/faults")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert marker_dir(None, "j-9") == tmp_path / "ftplane-j-9" / "faults"


def test_unrecordable_fault_does_not_fire(tmp_path: Path) -> None:
    blocker = tmp_path / "faults"
    blocker.write_text("a file where the marker directory should be")
    inj, reporter = injector(tmp_path, [FaultSpec("exception", 1, 0)])
    assert run_steps(inj, range(3)) == [] and reporter.calls == []


def _child(tmp_path: Path, kind: str) -> subprocess.Popen:
    code = textwrap.dedent(
        f"""
        from pathlib import Path
        from ftplane.trainer.faults import FaultInjector, FaultSpec
        class Sink:
            def event(self, type, details=None, **kwargs):
                return "k"
            def flush(self, timeout):
                return True
        inj = FaultInjector([FaultSpec({kind!r}, 0, 2)], rank=0, job_id="j", markers=Path({str(tmp_path)!r}),
                            reporter=Sink())
        for step in range(5):
            inj.before_step(step)
            print("step", step, flush=True)
        """
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_crash_kills_the_process_with_sigkill(tmp_path: Path) -> None:
    child = _child(tmp_path, "crash")
    out, _ = child.communicate(timeout=60)
    assert child.returncode == -9
    assert out.split() == ["step", "0", "step", "1"]
    assert (tmp_path / "j.spec-0").exists()


def test_hang_blocks_the_step_for_good(tmp_path: Path) -> None:
    child = _child(tmp_path, "hang")
    try:
        assert child.stdout is not None
        lines = [child.stdout.readline() for _ in range(2)]
        assert lines == ["step 0\n", "step 1\n"]
        wait_for("the hang to start", lambda: (tmp_path / "j.spec-0").exists(), 30, interval=0.05)
        time.sleep(2)  # a hang is the absence of progress: give it time to (not) make some
        assert child.poll() is None
    finally:
        child.kill()
        out, _ = child.communicate(timeout=30)
    assert "step 2" not in out


def test_hang_is_interruptible_by_an_asynchronous_exception() -> None:
    """NVRx's Wrapper recovers a hung rank by raising into its main thread; the hang must let it."""

    class Interrupt(Exception):
        pass

    ended: list[str] = []

    def target() -> None:
        try:
            hang_forever()
        except Interrupt:
            ended.append("interrupted")

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    wait_for("the thread to enter the hang", lambda: _inside(thread, hang_forever), 10, interval=0.01)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(Interrupt))
    thread.join(timeout=5)
    assert ended == ["interrupted"]


def _inside(thread: threading.Thread, function: Any) -> bool:
    """Whether `thread` is running `function` now (its code is on the thread's stack)."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code is function.__code__:
            return True
        frame = frame.f_back
    return False


def test_parse_faults_reads_what_the_control_plane_writes() -> None:
    text = json.dumps([{"kind": "hang", "rank": 3, "at_step": 7}, {"kind": "crash", "rank": 0, "at_step": 0}])
    assert parse_faults(text) == [FaultSpec("hang", 3, 7), FaultSpec("crash", 0, 0)]
    assert parse_faults([{"kind": "exception", "rank": 1, "at_step": 0}]) == [FaultSpec("exception", 1, 0)]
    assert parse_faults(None) == parse_faults("") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"kind": "crash"}), "expected a JSON list"),
        (json.dumps([{"kind": "meteor", "rank": 0, "at_step": 1}]), "faults[0].kind: 'meteor' is not one of"),
        (json.dumps([{"kind": "crash", "rank": -1, "at_step": 1}]), "faults[0].rank: expected an integer >= 0"),
        (json.dumps([{"kind": "crash", "rank": 0, "at_step": True}]), "faults[0].at_step"),
        (json.dumps([{"kind": "crash", "rank": 0, "at_step": 1, "x": 1}]), "faults[0]: unknown key(s) x"),
    ],
)
def test_bad_faults_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(FaultSpecError) as exc:
        parse_faults(text)
    assert message in str(exc.value)
