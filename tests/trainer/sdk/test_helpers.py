"""The SDK's opt-in helpers: NVRx's in-process restart around a training function, and checkpoints
reported through the run."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from ftplane.trainer.checkpoint import Checkpointer, latest_complete
from ftplane.trainer.nvrx import inprocess_restart, versions
from ftplane.trainer.sdk import checkpointer, inprocess, restart
from ftplane.trainer.sdk.run import Run
from tests.trainer.conftest import free_port
from tests.trainer.sdk.conftest import DictStore, FakeAgent

INPROCESS_ENV = {
    "FTPLANE_INPROCESS": "1",
    "FTPLANE_INPROCESS_SOFT_TIMEOUT_S": "20",
    "FTPLANE_INPROCESS_HARD_TIMEOUT_S": "30",
    "FTPLANE_INPROCESS_MAX_ITERATIONS": "4",
    "MASTER_ADDR": "localhost",
    "MASTER_PORT": "29400",
    "FTPLANE_MASTER_ADDR": "10.0.0.7",
}


@pytest.fixture(autouse=True)
def warnings_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(restart, "_warned", set())  # each warning is said once per process


def test_turned_off_the_function_runs_once_and_its_failure_is_reported(
    make_run: Callable[..., Run], agent: FakeAgent
) -> None:
    run = make_run(agent)
    calls: list[int] = []

    def train() -> None:
        calls.append(run.iteration)
        run.start(0)
        raise RuntimeError("out of memory")

    wrapped = inprocess(train, run, enabled=False, environ=INPROCESS_ENV)
    with pytest.raises(RuntimeError):
        wrapped()
    assert calls == [0]
    running, failed = agent.wait_events(2)
    assert running["details"]["inprocess"] is False
    assert failed["type"] == "rank_failed" and failed["details"]["cause"] == "RuntimeError: out of memory"


def test_an_nvrx_without_in_process_restart_degrades_to_the_next_rung(
    make_run: Callable[..., Run], agent: FakeAgent, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(inprocess_restart.inprocess, "Wrapper")  # as in an NVRx that dropped it (deprecated since 0.6)
    built: list[Any] = []
    monkeypatch.setattr(inprocess_restart, "wrap_inprocess", lambda *a, **kw: built.append(kw))
    run = make_run(agent)
    calls: list[str] = []
    with caplog.at_level(logging.WARNING, logger="ftplane.trainer.sdk"):
        inprocess(lambda: calls.append("trained"), run, environ=INPROCESS_ENV)()
        inprocess(lambda: calls.append("again"), run, environ=INPROCESS_ENV)()
    assert calls == ["trained", "again"] and built == []  # run unwrapped, no Wrapper built
    warnings = [r.getMessage() for r in caplog.records if r.name == "ftplane.trainer.sdk"]
    assert len(warnings) == 1, warnings  # said once
    assert "has no inprocess.Wrapper" in warnings[0] and "ft_launcher's in-job restart" in warnings[0]


def test_without_a_launcher_there_is_nothing_to_restart_in(make_run: Callable[..., Run], agent: FakeAgent) -> None:
    calls: list[int] = []
    environ = {k: v for k, v in INPROCESS_ENV.items() if k != "MASTER_PORT"}
    inprocess(lambda: calls.append(1), make_run(agent), environ=environ)()
    assert calls == [1]


def test_turned_on_it_builds_the_wrapper_from_the_job_spec(
    make_run: Callable[..., Run], agent: FakeAgent, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    built: dict[str, Any] = {}

    def wrap(train: Callable[[inprocess_restart.Iteration], None], **options: Any) -> Callable[[], None]:
        built.update(options, train=train)
        return lambda: None

    monkeypatch.setattr(inprocess_restart, "wrap_inprocess", wrap)
    with caplog.at_level(logging.WARNING, logger="ftplane.trainer.sdk"):
        inprocess(lambda: None, make_run(agent), environ=INPROCESS_ENV, cuda=False)
    assert {k: v for k, v in built.items() if k != "train"} == {
        "store_host": "10.0.0.7",  # FTPLANE_MASTER_ADDR: rank 0's reachable address, not MASTER_ADDR
        "store_port": None,  # the Wrapper's own store, at a free port the ranks agree on when it is called ...
        "rendezvous_port": 29400,  # ... through the rendezvous store
        "soft_timeout_s": 20.0,
        "hard_timeout_s": 30.0,
        "max_iterations": 4,
        "cuda": False,
    }
    assert "deprecated since 0.6" in caplog.text and versions.NVRX_VERSION in caplog.text


class FakeCallWrapper:
    """What the Wrapper hands each iteration: its progress ping and its store."""

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration
        self.pings = 0
        self.base_store = DictStore()

    def ping(self) -> None:
        self.pings += 1


def test_each_iteration_reports_its_restart_its_start_and_its_failure(
    make_run: Callable[..., Run], agent: FakeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The function the Wrapper enters, iteration by iteration (the Wrapper itself runs for real in
    tests/trainer/test_recovery.py)."""
    body: list[Callable[[inprocess_restart.Iteration], None]] = []
    monkeypatch.setattr(
        inprocess_restart, "wrap_inprocess", lambda train, **options: body.append(train) or (lambda: None)
    )
    run = make_run(agent)
    failures = iter([ValueError("loss is NaN"), None])

    def train() -> None:
        run.start(10)
        run.step(11)
        failure = next(failures)
        if failure is not None:
            raise failure

    inprocess(train, run, environ=INPROCESS_ENV, cuda=False)
    [iteration] = body
    first, second = FakeCallWrapper(0), FakeCallWrapper(1)
    second.base_store = first.base_store  # one store for the Wrapper's whole life
    with pytest.raises(ValueError):
        iteration(inprocess_restart.Iteration(index=0, call_wrapper=first))
    iteration(inprocess_restart.Iteration(index=1, call_wrapper=second))
    assert first.pings == second.pings == 1  # run.step() fed the Wrapper's progress watchdog
    events = agent.wait_events(4)
    assert [e["type"] for e in events] == ["running", "rank_failed", "inprocess_restart", "running"]
    assert events[1]["details"]["first_to_fail"] is True and events[1]["details"]["inprocess"] is True
    assert events[2]["details"]["cause"] == "rank 0: ValueError: loss is NaN"
    assert [e["details"]["iteration"] for e in events if e["type"] == "running"] == [0, 1]
    assert not run.inprocess  # outside the Wrapper again


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.usefixtures("one_rank_group")
def test_the_checkpointer_reports_through_the_run(
    make_run: Callable[..., Run], agent: FakeAgent, tmp_path: Path
) -> None:
    environ = {
        "FTPLANE_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "FTPLANE_CHECKPOINT_ENGINE": "async",
        "FTPLANE_CHECKPOINT_INTERVAL": "3",
        "FTPLANE_CHECKPOINT_KEEP": "1",
    }
    run = make_run(agent)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = checkpointer(run, environ=environ)
    assert isinstance(ckpt, Checkpointer) and ckpt.reporter is run
    assert (ckpt.engine, ckpt.interval, ckpt.keep, ckpt.rank, ckpt.device.type) == ("async", 3, 1, 0, "cpu")
    assert ckpt.load_latest(model, optimizer) == 0 and ckpt.due(3)
    ckpt.save(3, model, optimizer)
    ckpt.wait()
    ckpt.close()
    assert latest_complete(tmp_path / "ckpt").step == 3  # type: ignore[union-attr]
    assert checkpointer(run, environ=environ).load_latest(model, optimizer) == 3
    saved, loaded = agent.wait_events(2)
    assert saved["type"] == "checkpoint_saved" and saved["step"] == 3
    details = saved["details"]
    assert details["engine"] == "async" and details["bytes"] > 0 and 0 <= details["blocking_s"] <= details["total_s"]
    assert loaded["type"] == "checkpoint_loaded" and loaded["details"]["step"] == 3


def test_the_checkpointer_refuses_an_unknown_engine(make_run: Callable[..., Run], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="checkpoint engine 'fast' is not one of sync, async, none"):
        checkpointer(make_run(None), root=tmp_path, engine="fast", rank=0, device=torch.device("cpu"))
