"""The local backend's stop: asked for, not waited on; carried on by any worker; a kill once the grace is over.

The node's process here is a plain one (no agent) that notes SIGTERM and goes on, as a hung launcher would."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.schemas.spec import JobSpec
from ftplane.trainer.agent.processes import is_stopped, process_start_time
from tests.support.waiting import wait_for
from workers.backends import local
from workers.backends.local import LocalBackend

SPEC = JobSpec.model_validate({"name": "stop-test", "command": ["true"]})

STUBBORN = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[1], 'w').write('TERM'))\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(runs_dir=tmp_path / "runs")


@pytest.fixture
def node_process(backend: LocalBackend, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A process that notes SIGTERM in `term` and keeps running, recorded as node 0 of job j attempt 0."""
    process = subprocess.Popen(
        [sys.executable, "-c", STUBBORN, str(tmp_path / "term")],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    (node,) = backend.nodes("j", 0, SPEC)
    node.path.mkdir(parents=True)
    started = process_start_time(process.pid)
    node.launch_file.write_text(json.dumps({"pid": process.pid, "start_time": started, "node": node.name}))
    yield process
    process.kill()
    process.wait()


def stop_record(backend: LocalBackend) -> dict[str, object]:
    return dict(json.loads((backend.attempt_dir("j", 0) / "stop.json").read_text()))


def test_stop_asks_once_another_worker_carries_on_and_the_grace_ends_in_a_kill(
    backend: LocalBackend, node_process: subprocess.Popen[str], tmp_path: Path
) -> None:
    node_process.send_signal(signal.SIGSTOP)  # hung: a stopped process handles no SIGTERM until continued
    wait_for("the process stopped", lambda: is_stopped(node_process.pid), timeout=10, interval=0.05)
    assert backend.stop("j", 0, SPEC) is False
    wait_for("SIGTERM handled after SIGCONT", lambda: (tmp_path / "term").exists(), timeout=10, interval=0.05)
    first = stop_record(backend)
    assert first["groups"] == [[node_process.pid, [[node_process.pid, process_start_time(node_process.pid)]]]]

    another_worker = LocalBackend(runs_dir=backend.runs_dir)
    assert another_worker.stop("j", 0, SPEC) is False  # within the grace: asked again, not killed
    assert stop_record(backend) == first and node_process.poll() is None

    first["requested_at"] = time.time() - local.TERMINATE_GRACE_S  # the grace has run out
    (backend.attempt_dir("j", 0) / "stop.json").write_text(json.dumps(first))
    assert another_worker.stop("j", 0, SPEC) is False  # the kill is sent; gone by a later call
    assert node_process.wait(timeout=10) == -signal.SIGKILL
    assert another_worker.stop("j", 0, SPEC) is True
    another_worker.cancel("j", 0, SPEC)  # the blocking form: nothing left to wait for


def test_a_recorded_process_whose_pid_was_recycled_is_gone_and_left_alone(
    backend: LocalBackend, node_process: subprocess.Popen[str]
) -> None:
    record = {
        "requested_at": time.time() - local.TERMINATE_GRACE_S,
        "groups": [[node_process.pid, [[node_process.pid, 1]]]],
    }
    backend.attempt_dir("j", 0).mkdir(parents=True, exist_ok=True)
    (backend.attempt_dir("j", 0) / "stop.json").write_text(json.dumps(record))
    assert backend.stop("j", 0, SPEC) is True
    assert node_process.poll() is None


def test_an_attempt_with_nothing_running_is_stopped_at_once(backend: LocalBackend) -> None:
    assert backend.stop("j", 7, SPEC) is True
    assert not backend.attempt_dir("j", 7).exists()  # a stop of nothing leaves nothing behind


def test_a_process_that_outlives_its_kill_is_left_behind_with_a_warning(
    backend: LocalBackend,
    node_process: subprocess.Popen[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Stuck in the kernel (here: its kill never arrives): the stop goes on without it rather than hold the job's
    next attempt for ever."""
    monkeypatch.setattr(LocalBackend, "_signal_group", staticmethod(lambda pgid, members, sig: None))
    assert backend.stop("j", 0, SPEC) is False
    record = stop_record(backend)
    record["requested_at"] = time.time() - local.TERMINATE_GRACE_S  # the kill is due (and, here, lost)
    (backend.attempt_dir("j", 0) / "stop.json").write_text(json.dumps(record))
    assert backend.stop("j", 0, SPEC) is False and node_process.poll() is None
    record["requested_at"] = time.time() - local.TERMINATE_GRACE_S - local.KILLED_WAIT_S
    (backend.attempt_dir("j", 0) / "stop.json").write_text(json.dumps(record))
    assert backend.stop("j", 0, SPEC) is True and node_process.poll() is None
    assert f"process(es) {node_process.pid} outlived SIGKILL" in caplog.text
