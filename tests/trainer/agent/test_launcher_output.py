"""Reading ft_launcher's output line by line: rounds of failures, their root cause, ranks' own lines. The logs
are as NVRx 0.4.1's launcher writes them (0.7 prints the same messages after another prefix)."""

from __future__ import annotations

from ftplane.trainer.agent.launcher_output import GroupRestarted, LauncherOutput, RankFailed, RankOutput, round_cause
from ftplane.trainer.agent.launcher_timing import CycleTimed

LOG = """\
[INFO] [ft_launcher1@vm] gpu_ib_map: None
[rank0]:step 3 loss 2.5
[ERROR] [ft_launcher1@vm] failed (exitcode: -9) local_rank: 1 (pid: 101) of binary: python
[INFO] [ft_launcher1@vm] [default] Worker group UNHEALTHY. 3/3 attempts left; will restart worker group
[ERROR] [ft_launcher1@vm] failed (exitcode: 1) local_rank: 0 (pid: 202) of binary: python
[INFO] [ft_launcher1@vm] [default] Worker group FAILED. 2/3 attempts left; will restart worker group
[ERROR] [ft_launcher1@vm] failed (exitcode: 1) local_rank: 0 (pid: 303) of binary: python
[ERROR] [ft_launcher1@vm] Some rank(s) exited with non-zero exit code: {0: ProcessFailure(local_rank=0, pid=303, \
exitcode=1, error_file='<N/A>'), 1: ProcessFailure(local_rank=1, pid=304, exitcode=-9, error_file='<N/A>')}.
"""

HUNG_LOG = """\
[2026-12-03 07:00:01,000] [WARNING] [RankMonServer4242@vm:1] Did not get subsequent heartbeat. Waited 8.00 seconds.
[2026-12-03 07:00:01,001] [WARNING] [RankMonServer4242@vm:1] FT timeout elapsed.
[ERROR] [ft_launcher1@vm] failed (exitcode: -15) local_rank: 0 (pid: 101) of binary: python
[ERROR] [ft_launcher1@vm] failed (exitcode: -9) local_rank: 1 (pid: 102) of binary: python
[INFO] [ft_launcher1@vm] [default] Worker group FAILED. 2/3 attempts left; will restart worker group
[ERROR] [ft_launcher1@vm] failed (exitcode: -9) local_rank: 1 (pid: 202) of binary: python
"""


def read(log: str, rank_of_pid: dict[int, int] | None = None) -> list[object]:
    output = LauncherOutput(rank_of_pid=dict(rank_of_pid or {}))
    return [fact for line in log.splitlines() for fact in output.feed(line)]


def test_failures_are_grouped_by_round_and_signals_are_the_root_cause() -> None:
    facts = read(LOG, {101: 1, 202: 0, 303: 0, 304: 1})
    assert facts[0] == RankOutput(0, "step 3 loss 2.5")
    failed = [f for f in facts if isinstance(f, RankFailed)]
    assert [(f.round, f.failure.pid) for f in failed] == [(0, 101), (1, 202), (2, 303), (2, 304)]
    restarts = [f for f in facts if isinstance(f, GroupRestarted)]
    assert [(r.restart_count, r.attempts_left) for r in restarts] == [(1, 3), (2, 2)]
    first = round_cause(list(restarts[0].failures))
    assert first == {
        "cause": "rank 1 killed by SIGKILL",
        "cause_class": "crash",
        "rank": 1,
        "local_rank": 1,
        "exit_code": -9,
        "signal": "SIGKILL",
        "pid": 101,
    }
    assert round_cause(list(restarts[1].failures))["cause"] == "rank 0 exit code 1"
    last_round = [f.failure for f in failed if f.round == 2]
    assert round_cause(last_round)["cause"] == "rank 1 killed by SIGKILL"  # rank 0's exit 1 was collateral


def test_without_the_pid_the_local_rank_is_named_and_a_clean_log_has_no_cause() -> None:
    failed = [f for f in read(LOG) if isinstance(f, RankFailed)]
    assert round_cause([failed[0].failure])["cause"] == "local rank 1 killed by SIGKILL"
    assert "rank" not in round_cause([failed[0].failure])
    assert round_cause([]) == {"cause": "worker group failed", "cause_class": "unknown"}
    assert read("all good\n") == []


def test_a_rank_killed_for_no_heartbeat_is_the_root_cause_of_its_round_only() -> None:
    facts = read(HUNG_LOG, {101: 0, 102: 1, 202: 1})
    restart = next(f for f in facts if isinstance(f, GroupRestarted))
    # rank 0's SIGTERM came first in the log but was the group's teardown; rank 1 was silent
    cause = round_cause(list(restart.failures))
    assert cause["cause"] == "rank 1 killed by SIGKILL (ft_launcher: no heartbeat for 8 s)"
    assert cause["cause_class"] == "hang" and cause["silent_s"] == 8 and cause["signal"] == "SIGKILL"
    assert restart.failures[0].silent_s is None
    later = [f.failure for f in facts if isinstance(f, RankFailed) and f.round == 1]
    assert round_cause(later)["cause"] == "rank 1 killed by SIGKILL"  # the next round's kill had no timeout before it


def test_a_monitors_silence_said_after_the_launcher_named_the_exit_still_marks_it_at_the_rounds_end() -> None:
    """The rank monitors are processes of their own: their lines and the launcher's share a pipe in no set order."""
    late = "\n".join([*HUNG_LOG.splitlines()[2:4], *HUNG_LOG.splitlines()[:2], HUNG_LOG.splitlines()[4]])
    facts = read(late, {101: 0, 102: 1})
    first = next(f for f in facts if isinstance(f, RankFailed) and f.failure.pid == 102)
    assert first.failure.silent_s is None  # as the launcher named it
    restart = next(f for f in facts if isinstance(f, GroupRestarted))
    assert restart.silent == {1: 8.0}
    cause = round_cause(list(restart.failures))
    assert cause["cause"] == "rank 1 killed by SIGKILL (ft_launcher: no heartbeat for 8 s)"


def test_nvrx_finding_the_node_unhealthy_is_read_with_its_reason() -> None:
    from ftplane.trainer.agent.launcher_output import NodeUnhealthy

    log = (
        "[WARNING] [ft_launcher1@vm] GPU health check failed for node vm: GPU 3 is not healthy\n"
        "[ERROR] [ft_launcher1@vm] Agent .run() raised UnhealthyNodeException: Node vm is unhealthy\n"
    )
    assert read(log) == [NodeUnhealthy("NVRx health check: GPU health check failed for node vm: GPU 3 is not healthy")]


def test_nvrx_07s_rank_monitor_line_is_read_too() -> None:
    log = (
        "2026-12-03 12:00:01,000 [WARNING] [gpu-host] [workload:?(0) infra:5] rank_monitor_server.py:497 "
        "[Cycle 0] Did not get subsequent heartbeat. Waited 15.00 seconds.\n"
        "E1203 12:00:02.000000 4242 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) "
        "local_rank: 0 (pid: 4242) of binary: python\n"
        "[default] Worker group UNHEALTHY. 2/3 attempts left; will restart worker group\n"
    )
    restart = next(f for f in read(log, {4242: 0}) if isinstance(f, GroupRestarted))
    cause = round_cause(list(restart.failures))
    assert cause["cause_class"] == "hang" and cause["silent_s"] == 15 and cause["rank"] == 0


def test_nvrx_timed_cycles_give_their_phases_once_the_workers_started() -> None:
    """NVRx 0.5+'s profiling lines (0.4.1 prints none): a cycle's phases come with its worker_start_completed;
    a phase whose two ends were not both seen is left out, a time without milliseconds is read."""
    line = "[INFO] [vm] profiling.py:93   - Cycle: {} Event: {} Node: vm_7 Rank: {} Time: 2026-12-03 10:00:{} UTC"
    output = LauncherOutput()
    fed = [
        output.feed(line.format(2, "failure_detected", 0, "00")),
        output.feed(line.format(2, "rendezvous_started", 0, "04.5")),
        output.feed("[rank0]:step 3 loss 2.5"),  # a rank's own line, read as such
        output.feed(line.format(2, "rendezvous_completed", 0, "06.000")),
        output.feed(line.format(2, "worker_start_started", "None", "06.250")),
    ]
    assert fed == [[], [], [RankOutput(0, "step 3 loss 2.5")], [], []]
    [done] = output.feed(line.format(2, "worker_start_completed", 0, "07"))
    assert isinstance(done, CycleTimed) and done.cycle == 2 and done.began.isoformat() == "2026-12-03T10:00:00+00:00"
    assert done.phases == {"rendezvous": 1.5, "worker_start": 0.75}  # no worker_terminated, no health check line


def test_a_rank_that_exits_after_a_peer_was_killed_is_its_consequence() -> None:
    from ftplane.trainer.agent.launcher_output import RankExit, consequence_of

    killed, broke = RankExit(1, 101, -9, rank=1), RankExit(0, 100, 1, rank=0)
    assert consequence_of([killed, broke], broke) == "rank 1" and consequence_of([killed, broke], killed) is None
    # The launcher logs only the first exit of a round by whole seconds: here rank 0's, and rank 1's kill not at
    # all. The agent knows rank 1 was crashed on purpose (its SDK said so first).
    assert consequence_of([broke], broke) is None and consequence_of([broke], broke, crashed=1) == "rank 1"
    assert consequence_of([broke], broke, crashed=0) is None


def test_the_sdks_word_that_it_crashes_its_rank_names_the_rank_and_process() -> None:
    from ftplane.contract import EventType, new_event
    from ftplane.trainer.agent.faults import crash_announced

    crash = new_event(EventType.fault_injected, attempt=0, rank=1, details={"kind": "crash", "pid": 4242})
    assert crash_announced(crash) == (1, 4242)
    other = new_event(EventType.fault_injected, attempt=0, rank=1, details={"kind": "exception", "pid": 4242})
    assert crash_announced(other) is None and crash_announced({"type": "fault_injected"}) is None
