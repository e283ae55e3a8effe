"""The faults an agent carries out on a rank's process: reported `fault_injected` only when the signal reached the
rank's process, timed before it; a rank whose process has exited (its training over) gets no fault, and no event
that would count a failure the job never had."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime

import pytest

from ftplane.contract import EventType
from ftplane.trainer.agent.faults import inject_signal
from ftplane.trainer.agent.processes import RankProcess, is_stopped, process_start_time
from tests.support.waiting import wait_for
from tests.trainer.agent.test_failure_context import Recorded

DETAILS = {"kind": "hang", "fault_id": "f1", "source": "control_plane", "delivery": "agent"}


@pytest.fixture
def rank() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait(10)


def as_rank(process: subprocess.Popen[bytes], start_time: int) -> RankProcess:
    return RankProcess(rank=1, local_rank=1, pid=process.pid, start_time=start_time, restart_count=0)


def test_a_hang_stops_the_ranks_process_and_is_reported_as_of_before_the_signal(
    rank: subprocess.Popen[bytes],
) -> None:
    started = wait_for("the rank's start time", lambda: process_start_time(rank.pid), 10, interval=0.01)
    uplink = Recorded()
    before = datetime.now().astimezone()
    assert inject_signal(uplink, as_rank(rank, started), "hang", "fault:f1", DETAILS)
    wait_for("the rank stopped", lambda: is_stopped(rank.pid), 10, interval=0.01)
    (event,) = uplink.events
    assert event["type"] == EventType.fault_injected and event["rank"] == 1 and event["key"] == "fault:f1"
    assert event["details"] == DETAILS
    assert before <= datetime.fromisoformat(event["ts"]) <= datetime.now().astimezone()


def test_a_rank_whose_process_has_exited_gets_no_fault_and_no_event(rank: subprocess.Popen[bytes]) -> None:
    started = wait_for("the rank's start time", lambda: process_start_time(rank.pid), 10, interval=0.01)
    rank.kill()
    rank.wait(10)
    uplink = Recorded()
    assert not inject_signal(uplink, as_rank(rank, started), "crash", "fault:f1", {**DETAILS, "kind": "crash"})
    assert uplink.events == []


def test_a_pid_that_is_another_process_now_gets_no_fault(rank: subprocess.Popen[bytes]) -> None:
    started = wait_for("the rank's start time", lambda: process_start_time(rank.pid), 10, interval=0.01)
    uplink = Recorded()
    assert not inject_signal(uplink, as_rank(rank, started - 1), "crash", "fault:f1", {**DETAILS, "kind": "crash"})
    assert uplink.events == [] and rank.poll() is None
