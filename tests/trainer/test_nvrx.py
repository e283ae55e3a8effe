"""The NVRx integration points that do not need a launcher: version guards, restart budget, causes."""

from __future__ import annotations

import datetime
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from nvidia_resiliency_ext import inprocess
from nvidia_resiliency_ext.inprocess import param_utils
from nvidia_resiliency_ext.inprocess.rank_assignment import RankAssignmentCtx, RankDiscarded
from nvidia_resiliency_ext.inprocess.state import State

from tests.support.waiting import wait_for
from tests.trainer.conftest import free_port
from trainer import nvrx

WRAPPER_OPTIONS = {
    "store_host": "10.1.2.3",
    "store_port": 29501,
    "soft_timeout_s": 60.0,
    "hard_timeout_s": 90.0,
    "max_iterations": 3,
    "cuda": False,
}


class FailingGpuCheck(inprocess.health_check.HealthCheck):
    def __call__(self, state):  # noqa: ANN001, ANN204
        raise RuntimeError("NVML Shared Library Not Found")


def test_newer_nvrx_gpu_health_checks_are_replaced_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVRx >= 0.5 appends NVML-based checks to `restart_health_check` when LOCAL_RANK is set."""
    built: list[inprocess.Wrapper] = []

    class NewerWrapper(inprocess.Wrapper):
        def __init__(self, **kwargs):  # noqa: ANN003, ANN204
            super().__init__(**kwargs)
            self.restart_health_check = inprocess.Compose(kwargs["health_check"], FailingGpuCheck())
            built.append(self)

    monkeypatch.setattr(nvrx.inprocess, "Wrapper", NewerWrapper)
    nvrx.wrap_inprocess(lambda iteration: None, **WRAPPER_OPTIONS)  # type: ignore[arg-type]
    [wrapper] = built
    assert isinstance(wrapper.restart_health_check, nvrx.RestartBudget)
    assert wrapper.restart_health_check.max_iterations == 3
    # Its own store: an explicit host (not MASTER_ADDR) and a port of its own.
    assert wrapper.store_kwargs == {"host_name": "10.1.2.3", "port": 29501}
    assert wrapper.soft_timeout == datetime.timedelta(seconds=60)


def test_the_wrapped_function_receives_the_call_wrapper() -> None:
    run = nvrx.wrap_inprocess(lambda iteration: None, **WRAPPER_OPTIONS)  # type: ignore[arg-type]
    sentinel = object.__new__(inprocess.CallWrapper)
    args, kwargs = param_utils.substitute_param_value(run.__wrapped__, (), {}, {inprocess.CallWrapper: sentinel})
    assert sentinel in (*args, *kwargs.values())


def test_restart_budget_counts_restarts_only() -> None:
    budget = nvrx.RestartBudget(max_iterations=2)
    before_restart = nvrx.BeforeRestart(budget)
    state = State(rank=0, world_size=2)
    for iteration in (0, 1):  # the failures of iterations 0 and 1 may restart (iterations 1 and 2)
        state.iteration = iteration
        assert budget(state.freeze()) is not None  # the check before the iteration starts
        before_restart(state.freeze())
        assert budget(state.freeze()) is not None  # the check before the restart
    state.iteration = 2
    assert budget(state.freeze()) is not None  # iteration 2 runs...
    before_restart(state.freeze())
    with pytest.raises(RuntimeError, match="in-process restart budget spent"):
        budget(state.freeze())  # ...but may not restart


def test_in_process_restart_never_shrinks_the_world() -> None:
    assignment = nvrx.AllRanksOrNone()
    state = State(rank=1, world_size=2)
    ctx = assignment(RankAssignmentCtx(state, None, set()))
    assert ctx.state.active_world_size == 2 and ctx.state.active_rank == 1
    with pytest.raises(RankDiscarded, match=r"rank\(s\) \[0\] left"):
        assignment(RankAssignmentCtx(state, None, {0}))


def test_restart_causes_first_writer_wins() -> None:
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=datetime.timedelta(seconds=10))
    causes = nvrx.RestartCauses(store, restart_count=0)
    assert causes.first(0) is None
    assert causes.record(0, 1, "InjectedFault: boom") == (True, "rank 1: InjectedFault: boom")
    assert causes.record(0, 0, "RuntimeError: timed out") == (False, "rank 1: InjectedFault: boom")
    assert causes.first(0) == "rank 1: InjectedFault: boom"
    assert causes.first(1) is None


def test_heartbeats_are_a_no_op_outside_ft_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(nvrx.FT_RANK_MONITOR_ENV, raising=False)
    client = nvrx.HeartbeatClient()
    client.connect()
    client.beat()
    assert not client.enabled and not client.connected


def test_a_missing_rank_monitor_does_not_stop_training(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(nvrx.FT_RANK_MONITOR_ENV, str(tmp_path / "no-such.socket"))
    monkeypatch.setenv("RANK", "0")
    client = nvrx.HeartbeatClient()
    client.connect()  # logs an error
    client.beat()
    assert client.enabled and not client.connected


def test_async_writer_refuses_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also where a GPU is present
    with pytest.raises(RuntimeError, match="needs CUDA"):
        nvrx.NvrxAsyncSaver()


def test_restart_signals_are_recognised() -> None:
    from nvidia_resiliency_ext.inprocess.monitor_thread import RankShouldRestart

    assert nvrx.is_restart_signal(RankShouldRestart("x")) and not nvrx.is_restart_signal(RuntimeError("x"))


def test_the_async_writers_results_queue_is_started_off_the_training_thread() -> None:
    """NVRx makes its results queue (a Manager process, seconds to start) on the first save; the saver
    starts it on a thread at construction, so the first save finds it made."""
    from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async

    thread = nvrx._start_results_queue()
    assert thread is not None and thread.name == "nvrx-results-queue" and thread.daemon
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert filesystem_async._results_queue is not None
    filesystem_async._results_queue.put("ping")
    assert filesystem_async._results_queue.get(timeout=10) == "ping"


def test_in_process_restart_is_available_in_this_nvrx(monkeypatch: pytest.MonkeyPatch) -> None:
    assert nvrx.inprocess_available()
    monkeypatch.delattr(nvrx.inprocess, "Wrapper")
    assert not nvrx.inprocess_available()
    monkeypatch.setattr(nvrx, "inprocess", None)
    assert not nvrx.inprocess_available()


class CountingClient(nvrx.HeartbeatClient):
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
    beats = nvrx.ProgressHeartbeats(interval_s=0.02, client=client)
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
    monkeypatch.delenv(nvrx.FT_RANK_MONITOR_ENV, raising=False)
    beats = nvrx.ProgressHeartbeats()
    beats.progress()
    beats.reconnect()
    beats.close()
    assert not beats.enabled and beats._thread is None
