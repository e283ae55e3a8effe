"""The SDK against a fake node agent: what a rank sends, in what order, what it keeps while the agent is
away, and that the training thread never waits on any of it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from ftplane import sdk
from ftplane.trainer.faults import InjectedFault
from ftplane.trainer.nvrx.inprocess_restart import Iteration
from ftplane.trainer.sdk.environment import Environment
from ftplane.trainer.sdk.run import Run
from tests.support.paths import REPO
from tests.support.waiting import wait_for
from tests.trainer.sdk.conftest import DictStore, FakeAgent, sdk_env, socket_calls_on_this_thread


def test_without_an_agent_or_a_control_plane_every_report_is_a_no_op(
    make_run: Callable[..., Run], agent: FakeAgent, tmp_path: Path
) -> None:
    threads = threading.active_count()
    for run in (
        make_run(None),
        make_run(None, env={"FTPLANE_URL": "http://cp"}),  # a control plane, but no agent on this node
        make_run(None, env={"FTPLANE_AGENT_SOCKET": agent.path}),  # an agent, but no control plane behind it
    ):
        assert not run.enabled and run.channel is None and run.heartbeats is None and run.faults is None
        run.start(0)
        for n in range(1, 1001):
            run.step(n, loss=1.0, tokens=10)
        key = run.event("checkpoint_saved", {"step": 5})
        run.checkpoint_saved(5, blocking_s=0.1, bytes=1)
        run.checkpoint_loaded(5)
        run.exclude_node("bad GPU")
        assert run.failed(RuntimeError("boom")) is not None  # a key, though nothing is sent
        assert key and run.flush(0.1) and run.finish(0.1)
    assert threading.active_count() == threads  # no thread, no socket
    time.sleep(0.1)
    assert agent.messages == []


def test_events_arrive_in_order_with_the_contract_fields(make_run: Callable[..., Run], agent: FakeAgent) -> None:
    run = make_run(agent)
    keys = [run.event("checkpoint_saved", {"step": i}, step=i) for i in range(200)]
    assert run.flush(5)
    events = agent.wait_events(200)
    assert [e["key"] for e in events] == keys and len(set(keys)) == 200
    event = events[7]
    assert event["type"] == "checkpoint_saved" and event["attempt"] == 2 and event["rank"] == 0
    assert event["step"] == 7 and event["details"] == {"step": 7} and event["ts"].endswith("+00:00")
    assert agent.refused == []


def test_heartbeats_are_coalesced_to_the_newest(make_run: Callable[..., Run], agent: FakeAgent) -> None:
    run = make_run(agent, interval_s=0.2, total_steps=5000)
    run.start(0)
    for n in range(1, 2001):
        run.step(n, loss=float("nan") if n == 2000 else 2.5, tokens=1000)
    assert run.flush(5)  # sent; the agent reads its socket on a thread of its own
    wait_for("the newest heartbeat", lambda: agent.heartbeats(0) and agent.heartbeats(0)[-1].step == 2000, 5, 0.01)
    beats = agent.heartbeats(0)
    assert 1 <= len(beats) <= 5  # 2000 steps, a handful of heartbeats
    newest = beats[-1]
    assert newest.step == 2000 and newest.total_steps == 5000 and newest.loss is None  # NaN is not JSON
    assert newest.reply_to == run.channel.reply_to  # type: ignore[union-attr]
    assert newest.step_time_s is not None and newest.throughput == pytest.approx(1000 / newest.step_time_s)
    time.sleep(0.5)
    assert len(agent.heartbeats(0)) == len(beats)  # no new step, no heartbeat: a stopped loop goes silent
    run.step(2001, loss=1.0)
    wait_for("the next heartbeat", lambda: agent.heartbeats(0)[-1].step == 2001, 5, interval=0.01)


def test_step_never_waits_and_memory_stays_bounded_while_the_agent_is_away(
    make_run: Callable[..., Run], agent: FakeAgent
) -> None:
    agent.stop()  # no socket at that path
    run = make_run(agent, max_queued=500)
    with socket_calls_on_this_thread() as io:
        for n in range(1, 50_001):
            run.step(n, loss=0.5, tokens=10)
            if n % 50 == 0:
                run.event("checkpoint_saved", {"step": n}, step=n)
    assert io == []  # the training thread never touched a socket: the channel's thread sends
    assert run.channel is not None
    queued, beat_waiting = run.channel.pending()
    assert queued == 500 and beat_waiting  # the hello, running and the first 498 of 1000 events; one heartbeat
    assert run.channel.dropped == 502  # the hello and the running event went first; 502 later ones had no room
    assert run.flush(0.3) is False  # bounded, and says so

    agent.start()  # back at the same path: what was kept goes, in order
    assert run.flush(10)
    events = agent.wait_events(499)  # sent; the agent reads its socket on a thread of its own
    assert events[0]["type"] == "running"
    assert [e["step"] for e in events[1:]] == list(range(50, 50 * 499, 50))
    wait_for("the newest heartbeat", lambda: [b.step for b in agent.heartbeats(0)][-1:] == [50_000], 5, 0.01)


def test_a_full_agent_buffer_holds_up_nothing_and_loses_nothing(make_run: Callable[..., Run]) -> None:
    slow = FakeAgent(receive_buffer=4096).start(reading=False)  # bound, but not reading: its buffer fills
    try:
        run = make_run(slow)
        with socket_calls_on_this_thread() as io:  # the agent reads nothing: a call that waited on it never returns
            for i in range(2000):
                run.event("fault_history", {"i": i, "pad": "x" * 200})
        assert io == []
        assert run.channel is not None
        wait_for("the buffer to be full", lambda: run.channel.failures > 0, 5, interval=0.01)  # type: ignore[union-attr]
        assert run.channel.pending()[0] > 0
        slow.reading.set()  # the agent catches up
        assert run.flush(10)
        assert [e["details"]["i"] for e in slow.wait_events(2000)] == list(range(2000))
    finally:
        slow.stop()


def test_events_are_resent_in_order_after_the_agent_comes_back(make_run: Callable[..., Run], agent: FakeAgent) -> None:
    run = make_run(agent)
    first = [run.event("checkpoint_saved", {"n": i}) for i in range(3)]
    agent.wait_events(3)
    agent.stop()  # the agent restarts...
    during = [run.event("checkpoint_saved", {"n": i}) for i in range(3, 10)]
    assert run.channel is not None
    wait_for("several failed tries", lambda: run.channel.failures >= 2, 5, interval=0.01)  # type: ignore[union-attr]
    agent.start()  # ...and binds the same path again
    assert run.flush(10)
    assert [e["key"] for e in agent.wait_events(10)] == first + during  # each once, in order


def test_fault_directives_on_the_reply_socket_fire_at_their_step(
    make_run: Callable[..., Run], agent: FakeAgent
) -> None:
    run = make_run(agent, env={"RANK": "1"})
    run.start(0)
    run.step(1)
    [beat] = wait_for("a heartbeat naming the reply socket", lambda: agent.heartbeats(1), 5, interval=0.01)
    assert beat.reply_to is not None
    agent.send_faults(
        beat.reply_to,
        [
            {"id": "cp-1", "kind": "exception", "rank": 1, "at_step": 5},
            {"id": "cp-2", "kind": "exception", "rank": 0, "at_step": 3},  # another rank's
        ],
    )
    wait_for("the directive", lambda: run.faults is not None and run.faults._directives, 5, interval=0.01)
    for n in range(2, 5):
        run.step(n)
    with pytest.raises(InjectedFault, match="cp-1"):
        run.step(5)
    [fired] = agent.wait_events(1, "fault_injected")  # reported, and flushed, before it fired
    assert fired["rank"] == 1 and fired["step"] == 5
    assert fired["details"]["source"] == "control_plane" and fired["details"]["fault_id"] == "cp-1"


def test_spec_faults_fire_at_their_step_once_per_job(
    make_run: Callable[..., Run], agent: FakeAgent, tmp_path: Path
) -> None:
    faults = '[{"kind": "exception", "rank": 0, "at_step": 3}, {"kind": "exception", "rank": 1, "at_step": 1}]'
    run = make_run(agent, env={"FTPLANE_FAULTS": faults})
    run.start(0)
    run.step(1)
    run.step(2)
    with pytest.raises(InjectedFault):
        run.step(3)
    again = make_run(agent, env={"FTPLANE_FAULTS": faults})  # a restarted process resuming from step 2
    again.start(2)
    again.step(3)  # already fired in this job: not again
    assert again.flush(5)
    agent.wait_events(2, "running")
    assert [e["step"] for e in agent.events("fault_injected")] == [3]
    assert (tmp_path / "ckpt" / ".ftplane" / "faults" / "job-1.spec-0").exists()  # on shared storage


def test_a_fault_due_at_the_start_step_fires_in_start(make_run: Callable[..., Run], agent: FakeAgent) -> None:
    run = make_run(agent, env={"FTPLANE_FAULTS": '[{"kind": "exception", "rank": 0, "at_step": 0}]'})
    with pytest.raises(InjectedFault):
        run.start(0)
    assert [e["type"] for e in agent.wait_events(2)] == ["running", "fault_injected"]


def test_exclude_node_reaches_the_agent(make_run: Callable[..., Run], agent: FakeAgent) -> None:
    run = make_run(agent, env={"RANK": "3"})
    run.exclude_node("ECC errors on GPU 2")  # waits (bounded) until the agent's socket has it
    [asked] = wait_for("the request", agent.exclusions, 5, interval=0.01)
    assert (asked.rank, asked.reason) == (3, "ECC errors on GPU 2")


def test_running_is_reported_per_start_and_per_restart(make_run: Callable[..., Run], agent: FakeAgent) -> None:
    store = DictStore()
    run = make_run(agent, env={"TORCHELASTIC_RESTART_COUNT": "2"}, total_steps=100, store=store)
    run.start(40, {"device": "cpu"})
    run.step(41)
    # In-process restart: rank 1 failed first (recorded in the shared store), then every rank re-enters.
    store.compare_set("ftplane/causes/2/0", "", "rank 1: InjectedFault: boom")
    run.enter_iteration(Iteration(index=1))
    run.step(31)  # no start(): the first step of the iteration reports `running` itself
    run.step(32)
    assert run.flush(5)
    events = agent.wait_events(3)
    assert [e["type"] for e in events] == ["running", "inprocess_restart", "running"]
    first, restart, second = events
    assert first["step"] == 40 and first["details"]["device"] == "cpu"
    assert {k: first["details"][k] for k in ("restart_count", "iteration", "start_step", "total_steps")} == {
        "restart_count": 2,
        "iteration": 0,
        "start_step": 40,
        "total_steps": 100,
    }
    assert first["details"]["world_size"] == 2 and first["details"]["pid"] == os.getpid()
    assert restart["key"] == "inprocess_restart:job-1:2:2:1"  # every rank 0 of every node: stored once
    assert restart["details"] == {
        "iteration": 1,
        "cause": "rank 1: InjectedFault: boom",
        "cause_class": "exception",
        "restart_count": 2,
    }
    assert (second["details"]["iteration"], second["details"]["start_step"]) == (1, 30)


def test_failures_are_reported_once_with_their_cause_and_whether_they_came_first(
    make_run: Callable[..., Run], agent: FakeAgent
) -> None:
    store = DictStore()
    first = make_run(agent, env={"RANK": "1"}, store=store)
    second = make_run(agent, env={"RANK": "0"}, store=store)
    first.start(0)
    first.step(7)
    error = ValueError("bad batch\nsecond line")
    first.failed(error)
    assert first.failed(error) is None  # the same exception again: reported once
    second.failed(RuntimeError("collective timed out"), step=7)
    root, collateral = agent.wait_events(2, "rank_failed")
    assert root["rank"] == 1 and root["step"] == 7
    assert root["details"]["cause"] == "ValueError: bad batch" and root["details"]["cause_class"] == "exception"
    assert root["details"]["exception_type"] == "ValueError" and "second line" in root["details"]["exception"]
    assert root["details"]["first_to_fail"] is True and root["details"]["rank"] == 1
    assert collateral["details"]["first_to_fail"] is False
    assert collateral["details"]["first_failure"] == "rank 1: ValueError: bad batch"
    assert second.failed(SystemExit(0)) is None  # a clean exit is no failure


def test_an_uncaught_exception_is_reported_before_the_script_dies(agent: FakeAgent, tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        from ftplane import sdk
        run = sdk.init(total_steps=10)
        run.start(0)
        run.step(1)
        raise KeyError("no such shard")
        """
    )
    env = {**os.environ, **sdk_env(agent, tmp_path), "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "KeyError: 'no such shard'" in result.stderr  # the usual traceback too
    [failed] = agent.wait_events(2)[1:]
    assert failed["type"] == "rank_failed" and failed["details"]["cause"] == "KeyError: 'no such shard'"


def test_init_makes_one_run_per_process(monkeypatch: pytest.MonkeyPatch, agent: FakeAgent, tmp_path: Path) -> None:
    for name, value in sdk_env(agent, tmp_path).items():
        monkeypatch.setenv(name, value)
    run = sdk.init(total_steps=10, report_uncaught=False)
    try:
        assert sdk.init() is run and sdk.current() is run and run.total_steps == 10
        assert sdk.init(total_steps=20) is run and run.total_steps == 20
        assert run.enabled and run.job_id == "job-1" and run.attempt == 2 and run.world_size == 2
    finally:
        run.finish(1)
    assert sdk.current() is None


def test_a_malformed_environment_says_which_variable(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="RANK='three': expected an integer"):
        Environment.read({"RANK": "three"})
    with pytest.raises(ValueError, match=r"faults\[0\].kind"):
        Environment.read({"FTPLANE_FAULTS": '[{"kind": "meteor", "rank": 0, "at_step": 1}]'})


def test_what_json_cannot_carry_is_made_plain_and_what_is_too_big_is_dropped(
    make_run: Callable[..., Run], agent: FakeAgent, caplog: pytest.LogCaptureFixture
) -> None:
    class Scalar:  # a numpy or torch scalar
        def item(self) -> float:
            return 0.25

    run = make_run(agent)
    with caplog.at_level("WARNING", logger="ftplane.trainer.sdk.channel"):
        run.event("custom", {"value": Scalar(), "nan": float("inf"), "path": Path("/x"), "nested": {"t": (1, 2)}})
        run.event("custom", {"blob": "x" * 100_000})  # over the protocol's 64 KiB
        run.event("custom", {"after": True})
        assert run.flush(5)
    plain, after = agent.wait_events(2)
    assert plain["details"] == {"value": 0.25, "nan": None, "path": "/x", "nested": {"t": [1, 2]}}
    assert after["details"] == {"after": True}
    assert "dropped a message of type event for the node agent" in caplog.text
    assert "over the 65536-byte limit" in caplog.text


def test_under_ft_launcher_the_run_sends_its_rank_heartbeats(
    make_run: Callable[..., Run], agent: FakeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the launcher's rank monitor named, heartbeats go to it from a thread (here it is absent: the
    connection fails, logged, and training is not affected)."""
    monitor = {"FT_RANK_MONITOR_IPC_SOCKET": "/nonexistent/monitor.socket"}
    monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", monitor["FT_RANK_MONITOR_IPC_SOCKET"])
    run = make_run(agent, env=monitor)
    assert run.heartbeats is not None and run.heartbeats.enabled
    run.start(0)
    run.step(1)
    assert agent.wait_events(1)[0]["details"]["nvrx_heartbeats"] is True
    assert make_run(agent, env=monitor, nvrx_heartbeats=False).heartbeats is None  # the script sends its own
    monkeypatch.delenv("FT_RANK_MONITOR_IPC_SOCKET")
    assert make_run(agent).heartbeats is None  # not under ft_launcher


def test_a_framework_reports_a_step_first_and_fires_its_fault_once_the_checkpoint_is_written(
    make_run: Callable[..., Run], agent: FakeAgent
) -> None:
    """A callback reports step 20 before the framework writes its checkpoint (`inject=False`), then `before_step(20)`
    when the next step is about to start: the fault at_step 20 fires there, not in `step`."""
    run = make_run(agent, env={"FTPLANE_FAULTS": '[{"kind": "exception", "rank": 0, "at_step": 20}]'})
    run.start(19)
    run.step(20, inject=False)  # no fault yet: the checkpoint of step 20 is being written
    with pytest.raises(InjectedFault):
        run.before_step(20)
    assert [e["step"] for e in agent.wait_events(1, "fault_injected")] == [20]


def test_a_phase_keeps_the_heartbeats_going_for_its_timeout_only(
    make_run: Callable[..., Run], agent: FakeAgent
) -> None:
    """No step for a while inside a phase (a validation): heartbeats at the same step go on, newer each time,
    until the phase's timeout; outside a phase a rank without steps goes silent."""
    run = make_run(agent, interval_s=0.05)
    run.start(0)
    run.step(5)
    wait_for("the step's heartbeat", lambda: agent.heartbeats(), 5, interval=0.01)
    with run.phase("validation", timeout_s=0.6):
        ends = time.time() + 0.6
        assert run.phases.current == "validation"
        beats = wait_for("heartbeats during the phase", lambda: len(agent.heartbeats()) >= 5 and agent.heartbeats(), 5)
        assert {b.step for b in beats} == {5} and len({b.ts for b in beats}) == len(beats)
        wait_for("the phase's timeout", lambda: run.phases.current is None, 5, interval=0.01)
        time.sleep(0.5)  # ten heartbeat intervals past the timeout: a beat made after it would be here
        late = [b for b in agent.heartbeats() if datetime.fromisoformat(str(b.ts)).timestamp() > ends + 0.05]
        assert late == []  # silence, as a hang must be
    assert run.phases.current is None


def test_a_failure_that_says_a_peer_broke_the_collective_is_marked_a_consequence(
    make_run: Callable[..., Run], agent: FakeAgent
) -> None:
    run = make_run(agent)
    run.failed(RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:28369"), step=3)
    other = make_run(agent, env={"RANK": "1"})
    other.failed(ValueError("loss is NaN"), step=3)
    broken, own = agent.wait_events(2, "rank_failed")
    assert broken["details"]["consequence"] is True and "consequence" not in own["details"]
