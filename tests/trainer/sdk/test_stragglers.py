"""What a rank tells straggler detection: its own work per step (run.compute() sections, and the time the fault
hook spends, which is how a slowdown shows), NVRx's score where its detector runs; and the slowdown fault itself:
a fraction of the rank's step time slept in each of its steps, from the step given, once per job."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ftplane.trainer.faults import FaultSpecError, parse_faults
from ftplane.trainer.sdk.run import Run
from ftplane.trainer.sdk.stragglers import StragglerDetection, rank_score
from tests.support.waiting import wait_for
from tests.trainer.sdk.conftest import FakeAgent


def newest_beat(agent: FakeAgent, step: int) -> Any:
    return wait_for(f"the heartbeat of step {step}", lambda: next(
        (b for b in reversed(agent.heartbeats(0)) if b.step == step), None), 5, interval=0.01)  # fmt: skip


WALL, MONOTONIC = time.time, time.monotonic


class FakeClock:
    """The SDK's and the fault hook's clock: `sleep` moves it at once, so durations are exact on any machine."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def time(self) -> float:  # wall time, for the heartbeats' `ts`
        return WALL()

    def monotonic(self) -> float:
        return MONOTONIC()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    from ftplane.trainer import faults
    from ftplane.trainer.sdk import run as run_module

    fake = FakeClock()
    monkeypatch.setattr(run_module, "time", fake)
    monkeypatch.setattr(faults, "time", fake)
    return fake


def test_compute_sections_add_up_per_step_and_go_out_with_the_heartbeat(
    make_run: Callable[..., Run], agent: FakeAgent, clock: FakeClock
) -> None:
    run = make_run(agent)
    run.start(0)
    for n in range(1, 4):
        with run.compute():
            clock.sleep(0.02)
        clock.sleep(0.03)  # "waiting in a collective": not the rank's own work
        with run.compute():
            clock.sleep(0.01)
        run.step(n)
    beat = newest_beat(agent, 3)
    assert beat.compute_s == pytest.approx(0.03) and beat.step_time_s == pytest.approx(0.06)


def test_without_sections_no_compute_is_reported(make_run: Callable[..., Run], agent: FakeAgent) -> None:
    run = make_run(agent)
    run.start(0)
    run.step(1)
    run.step(2)
    assert newest_beat(agent, 2).compute_s is None


def test_a_slowdown_sleeps_a_fraction_of_the_step_time_for_its_steps_and_counts_as_own_work(
    make_run: Callable[..., Run], agent: FakeAgent, clock: FakeClock
) -> None:
    faults = json.dumps([{"kind": "slowdown", "rank": 0, "at_step": 4, "fraction": 1.0, "duration_steps": 3}])
    run = make_run(agent, env={"FTPLANE_FAULTS": faults})
    run.start(0)
    took, beats = {}, {}
    for n in range(1, 10):
        started = clock.perf_counter()
        with run.compute():
            clock.sleep(0.05)
        run.step(n)
        took[n] = clock.perf_counter() - started
        beats[n] = newest_beat(agent, n)  # each step's own heartbeat (steps take no real time here)
    (injected,) = agent.wait_events(1, "fault_injected")
    assert injected["step"] == 4 and injected["details"]["kind"] == "slowdown"
    assert injected["details"]["fraction"] == 1.0 and injected["details"]["duration_steps"] == 3
    # step() 4, 5, 6 sleep a whole healthy step (fraction 1.0 of the 0.05 s steps before it) after the step's work
    assert [round(took[n], 6) for n in range(1, 10)] == [0.05, 0.05, 0.05, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05]
    # step 7's work began after step() 6's sleep, which counts as the rank's own
    assert [round(beats[n].compute_s, 6) for n in range(2, 10)] == [0.05, 0.05, 0.05, 0.1, 0.1, 0.1, 0.05, 0.05]


def test_a_slowdown_from_the_control_plane_starts_at_the_next_step(
    make_run: Callable[..., Run], agent: FakeAgent
) -> None:
    run = make_run(agent)
    run.start(0)
    run.step(1)
    assert run.faults is None or not run.faults._slowdowns
    assert run.channel is not None
    agent.send_faults(
        run.channel.reply_to,
        [{"id": "f1", "kind": "slowdown", "rank": 0, "at_step": None, "fraction": 0.5, "duration_steps": 2}],
    )
    wait_for("the directive", lambda: run.faults is not None and run.faults._directives, 5, interval=0.01)
    run.step(2)  # fires before step 2 runs: steps 2 and 3 are slow
    assert run.faults is not None and len(run.faults._slowdowns) == 1
    run.step(3)
    assert len(run.faults._slowdowns) == 1
    run.step(4)
    assert run.faults._slowdowns == []


def test_a_bad_slowdown_directive_is_ignored(make_run: Callable[..., Run], agent: FakeAgent) -> None:
    run = make_run(agent)
    run.start(0)
    run._on_faults([{"id": "f2", "kind": "slowdown", "rank": 0, "fraction": 50, "duration_steps": 2}])
    assert run.faults is not None and run.faults._directives == []


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"kind": "slowdown", "rank": 0, "at_step": 1, "fraction": 0, "duration_steps": 3}, "faults[0].fraction"),
        ({"kind": "slowdown", "rank": 0, "at_step": 1, "fraction": 11, "duration_steps": 3}, "faults[0].fraction"),
        ({"kind": "slowdown", "rank": 0, "at_step": 1, "fraction": 0.5, "duration_steps": 0}, "duration_steps"),
        ({"kind": "slowdown", "rank": 0, "at_step": 1, "fraction": 0.5}, "duration_steps"),
        ({"kind": "crash", "rank": 0, "at_step": 1, "fraction": 0.5}, "slowdown only"),
    ],
)
def test_faults_env_refuses_bad_slowdowns(entry: dict[str, Any], words: str) -> None:
    with pytest.raises(FaultSpecError, match=words.replace("[", r"\[").replace("]", r"\]")):
        parse_faults(json.dumps([entry]))


def test_faults_env_takes_what_the_spec_writes(tmp_path: Path) -> None:
    from api.schemas.spec import FaultSpec

    written = [FaultSpec(kind="crash", rank=0, at_step=3).model_dump()]  # fraction and duration_steps: null
    written.append(FaultSpec(kind="slowdown", rank=1, at_step=2, fraction=0.2, duration_steps=9).model_dump())
    crash, slowdown = parse_faults(json.dumps(written))
    assert crash.fraction is None and (slowdown.fraction, slowdown.duration_steps) == (0.2, 9)


class FakeDetector:
    """NVRx's Detector as the helper calls it: class methods, a section context, a report every other step."""

    initialized = False
    calls: list[str] = []

    @classmethod
    def initialize(cls, **options: Any) -> None:
        cls.options = options
        cls.initialized = True

    @classmethod
    def detection_section(cls, name: str, profile_cuda: bool = True) -> Any:
        import contextlib

        cls.calls.append(f"section {name} {profile_cuda}")
        return contextlib.nullcontext()

    @classmethod
    def generate_report_if_interval_elapsed(cls) -> Any:
        cls.calls.append("report")
        if cls.calls.count("report") % 2:
            return None

        class Report:
            gpu_relative_perf_scores = {0: 0.9}
            section_relative_perf_scores = {"fwd": {0: 0.7}, "opt": {0: float("nan")}}

        return Report()

    @classmethod
    def shutdown(cls) -> None:
        cls.initialized = False


def test_nvrx_scores_go_out_with_the_heartbeats(make_run: Callable[..., Run], agent: FakeAgent) -> None:
    run = make_run(agent)
    FakeDetector.calls = []
    detection = StragglerDetection(run, cuda=True, detector=FakeDetector, report_interval_s=5)
    assert detection.active and FakeDetector.options["gather_on_rank0"] is False
    assert FakeDetector.options["report_time_interval"] == 5
    run.start(0)
    with detection.section("fwd"):
        time.sleep(0.01)
    run.step(1)
    assert newest_beat(agent, 1).perf_score is None  # no report yet
    with detection.section("fwd"):
        pass
    run.step(2)
    beat = newest_beat(agent, 2)
    assert beat.perf_score == 0.7 and beat.compute_s is not None  # the lowest of its relative scores
    assert FakeDetector.calls[:2] == ["section fwd True", "report"]
    detection.close()
    assert not FakeDetector.initialized
    run.step(3)
    assert FakeDetector.calls.count("report") == 2  # closed: no more reports


def test_without_cuda_the_helper_times_sections_for_compute_only(
    make_run: Callable[..., Run], agent: FakeAgent
) -> None:
    run = make_run(agent)
    detection = StragglerDetection(run)  # this machine: no CUDA (and NVRx's detector would need it)
    assert not detection.active
    run.start(0)
    with detection.section("opt"):
        time.sleep(0.01)
    run.step(1)
    beat = newest_beat(agent, 1)
    assert beat.compute_s is not None and beat.compute_s >= 0.01 and beat.perf_score is None
    detection.close()


def test_a_detector_that_cannot_start_leaves_the_sections_timed(make_run: Callable[..., Run]) -> None:
    class Broken(FakeDetector):
        @classmethod
        def initialize(cls, **options: Any) -> None:
            raise ImportError("libcupti.so: cannot open shared object file")

    detection = StragglerDetection(make_run(None), cuda=True, detector=Broken)
    assert not detection.active


def test_rank_score_reads_relative_scores_only() -> None:
    class Report:
        gpu_relative_perf_scores: dict[int, float] = {}
        section_relative_perf_scores = {"a": {3: 0.8, 4: 0.2}}
        gpu_individual_perf_scores = {3: 0.1}  # the rank against its own past: not a straggler signal

    assert rank_score(Report(), 3) == 0.8 and rank_score(Report(), 9) is None


def test_the_agent_passes_own_work_and_scores_on_and_refuses_them_out_of_range() -> None:
    from ftplane.trainer.agent import protocol

    beat = protocol.parse(b'{"type": "heartbeat", "rank": 3, "step": 9, "compute_s": 0.31, "perf_score": 0.97}')
    assert isinstance(beat, protocol.Heartbeat)
    sent = beat.for_control_plane("node-a")
    assert sent["compute_s"] == 0.31 and sent["perf_score"] == 0.97 and sent["node"] == "node-a"
    with pytest.raises(protocol.BadMessage, match="perf_score"):
        protocol.parse(b'{"type": "heartbeat", "rank": 3, "step": 9, "perf_score": 1.5}')
    with pytest.raises(protocol.BadMessage, match="compute_s"):
        protocol.parse(b'{"type": "heartbeat", "rank": 3, "step": 9, "compute_s": -1}')
