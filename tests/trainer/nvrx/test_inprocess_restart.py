"""NVRx's in-process restart as the SDK wraps it (trainer/nvrx/inprocess_restart.py), without a launcher: the
Wrapper's options and health checks, the restart budget, the world it keeps, the first failure as the cause."""

from __future__ import annotations

import datetime
import socket
import threading

import pytest
import torch.distributed as dist
from nvidia_resiliency_ext import inprocess
from nvidia_resiliency_ext.inprocess import param_utils
from nvidia_resiliency_ext.inprocess.rank_assignment import RankAssignmentCtx, RankDiscarded
from nvidia_resiliency_ext.inprocess.state import State

from ftplane.trainer.nvrx import inprocess_restart
from tests.trainer.conftest import free_port

WRAPPER_OPTIONS = {
    "store_host": "10.1.2.3",
    "store_port": 29501,
    "rendezvous_port": 29500,
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

    monkeypatch.setattr(inprocess_restart.inprocess, "Wrapper", NewerWrapper)
    inprocess_restart.wrap_inprocess(lambda iteration: None, **WRAPPER_OPTIONS)  # type: ignore[arg-type]
    [wrapper] = built
    assert isinstance(wrapper.restart_health_check, inprocess_restart.RestartBudget)
    assert wrapper.restart_health_check.max_iterations == 3
    # Its own store: an explicit host (not MASTER_ADDR) and a port of its own.
    assert wrapper.store_kwargs == {"host_name": "10.1.2.3", "port": 29501}
    assert wrapper.soft_timeout == datetime.timedelta(seconds=60)


def test_the_wrapped_function_receives_the_call_wrapper() -> None:
    run = inprocess_restart.wrap_inprocess(lambda iteration: None, **WRAPPER_OPTIONS)  # type: ignore[arg-type]
    sentinel = object.__new__(inprocess.CallWrapper)
    args, kwargs = param_utils.substitute_param_value(run.__wrapped__, (), {}, {inprocess.CallWrapper: sentinel})
    assert sentinel in (*args, *kwargs.values())


def test_the_ranks_agree_on_a_free_port_for_the_wrappers_store() -> None:
    """Rank 0 takes a free port and every rank reads it from the rendezvous store, whatever sits at MASTER_PORT + 1
    (a listener here: the port the Wrapper's store used to take unasked); the rendezvous store is let go after."""
    rendezvous = free_port()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", rendezvous + 1))
        squatter.listen()
        agreed: dict[int, int] = {}

        def rank(r: int) -> None:
            env = {"RANK": str(r), "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "3"}
            agreed[r] = inprocess_restart.agreed_store_port("127.0.0.1", rendezvous, env, timeout_s=30)

        threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 0)]  # the reader may come first
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert agreed[0] == agreed[1] and agreed[0] != rendezvous + 1
    with socket.socket() as probe:
        probe.bind(("", agreed[0]))  # free: the Wrapper's store can listen there
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", rendezvous))  # nothing of the agreement left listening


def test_restart_budget_counts_restarts_only() -> None:
    budget = inprocess_restart.RestartBudget(max_iterations=2)
    before_restart = inprocess_restart.BeforeRestart(budget)
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
    assignment = inprocess_restart.AllRanksOrNone()
    state = State(rank=1, world_size=2)
    ctx = assignment(RankAssignmentCtx(state, None, set()))
    assert ctx.state.active_world_size == 2 and ctx.state.active_rank == 1
    with pytest.raises(RankDiscarded, match=r"rank\(s\) \[0\] left"):
        assignment(RankAssignmentCtx(state, None, {0}))


def test_restart_causes_first_writer_wins() -> None:
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=datetime.timedelta(seconds=10))
    causes = inprocess_restart.RestartCauses(store, restart_count=0)
    assert causes.first(0) is None
    assert causes.record(0, 1, "InjectedFault: boom") == (True, "rank 1: InjectedFault: boom")
    assert causes.record(0, 0, "RuntimeError: timed out") == (False, "rank 1: InjectedFault: boom")
    assert causes.first(0) == "rank 1: InjectedFault: boom"
    assert causes.first(1) is None


def test_restart_signals_are_recognised() -> None:
    from nvidia_resiliency_ext.inprocess.monitor_thread import RankShouldRestart

    assert inprocess_restart.is_restart_signal(RankShouldRestart("x")) and not inprocess_restart.is_restart_signal(
        RuntimeError("x")
    )


def test_in_process_restart_is_available_in_this_nvrx(monkeypatch: pytest.MonkeyPatch) -> None:
    assert inprocess_restart.inprocess_available()
    monkeypatch.delattr(inprocess_restart.inprocess, "Wrapper")
    assert not inprocess_restart.inprocess_available()
    monkeypatch.setattr(inprocess_restart, "inprocess", None)
    assert not inprocess_restart.inprocess_available()
