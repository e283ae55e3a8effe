"""NVRx heartbeats to ft_launcher's rank monitor (trainer/nvrx/heartbeats.py): nothing outside ft_launcher, a
missing monitor does not stop training, and heartbeats go out off the training loop, only after progress."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ftplane.trainer.nvrx import heartbeats
from tests.support.waiting import wait_for


def test_heartbeats_are_a_no_op_outside_ft_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(heartbeats.FT_RANK_MONITOR_ENV, raising=False)
    client = heartbeats.HeartbeatClient()
    client.connect()
    client.beat()
    assert not client.enabled and not client.connected


def test_a_missing_rank_monitor_does_not_stop_training(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(heartbeats.FT_RANK_MONITOR_ENV, str(tmp_path / "no-such.socket"))
    monkeypatch.setenv("RANK", "0")
    client = heartbeats.HeartbeatClient()
    client.connect()  # logs an error
    client.beat()
    assert client.enabled and not client.connected


class CountingClient(heartbeats.HeartbeatClient):
    """A HeartbeatClient that counts instead of talking to a rank monitor."""

    def __init__(self) -> None:
        super().__init__()
        self.enabled = True
        self.connects: list[int] = []
        self.beats = 0
        self.closed = False
        self.threads: set[str] = set()

    def connect(self) -> None:
        self.threads.add(threading.current_thread().name)
        self.connects.append(self.beats)

    def beat(self) -> None:
        self.threads.add(threading.current_thread().name)
        self.beats += 1

    def close(self) -> None:
        self.closed = True


def test_progress_heartbeats_are_sent_off_the_loop_and_only_after_progress() -> None:
    client = CountingClient()
    beats = heartbeats.ProgressHeartbeats(interval_s=0.02, client=client)
    wait_for("the first connect", lambda: client.connects, 5, interval=0.01)
    time.sleep(0.1)
    assert client.beats == 0  # no step yet: the launcher's initial timeout runs
    for _ in range(1000):
        beats.progress()  # a thousand steps within an interval or two: one or two heartbeats
    wait_for("a heartbeat", lambda: client.beats, 5, interval=0.01)
    time.sleep(0.1)
    assert 1 <= client.beats <= 3
    sent = client.beats
    time.sleep(0.1)
    assert client.beats == sent  # a loop that stopped goes silent: how the launcher sees a hang
    beats.reconnect()  # a new in-process iteration
    wait_for("the reconnect", lambda: len(client.connects) == 2, 5, interval=0.01)
    beats.close()
    assert client.closed and client.threads == {"ftplane-nvrx-heartbeats"}


def test_progress_heartbeats_do_nothing_outside_ft_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(heartbeats.FT_RANK_MONITOR_ENV, raising=False)
    beats = heartbeats.ProgressHeartbeats()
    beats.progress()
    beats.reconnect()
    beats.close()
    assert not beats.enabled and beats._thread is None
