"""A failure's context: held until its round's output is all out (the launcher says the group restarts, or its
output ends), then reported with the last lines the rank printed in that round; the round's root cause carries
its tail into the in-job restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftplane import contract
from ftplane.contract import EventType
from ftplane.trainer.agent.failure_context import FailureContext, with_tail
from ftplane.trainer.agent.launcher_output import GroupRestarted, LauncherOutput, RankExit, RankFailed, RankOutput
from ftplane.trainer.agent.rank_logs import RankLogs
from ftplane.trainer.agent.redaction import Redactor
from ftplane.trainer.agent.uplink import NodeEvents
from tests.support.waiting import wait_for


class Recorded(NodeEvents):
    attempt = 0
    node = "node-a"

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def forward_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def test_a_failure_waits_for_its_rounds_last_lines_and_the_restart_carries_the_root_causes_tail(
    tmp_path: Path,
) -> None:
    logs = RankLogs(tmp_path / "logs", Redactor(["s3cr3t-value"]))
    uplink = Recorded()
    context = FailureContext(uplink, "job1", logs, injected=lambda round_: None, max_hold_s=60)
    logs.rank_line(1, "step 7")
    raised = RankExit(local_rank=1, pid=41, exit_code=1, rank=1)
    collateral = RankExit(local_rank=0, pid=40, exit_code=1, rank=0)  # its collective broke
    context.hold(RankFailed(0, raised))
    for line in ("Traceback (most recent call last):", '  File "t.py", line 3', "ValueError: bad s3cr3t-value"):
        logs.rank_line(1, line)  # the tee copies the traceback after the launcher's line
    context.hold(RankFailed(0, collateral))
    assert uplink.events == []  # held until the round is over
    context.hold(GroupRestarted(1, (raised, collateral), attempts_left=1))
    logs.rank_line(1, "the next cycle starts")  # printed after the restart: not the failure's
    wait_for("the failures reported", lambda: len(uplink.events) == 3, 5, interval=0.02)
    first, second, restart = uplink.events
    assert first["type"] == EventType.rank_failed and first["rank"] == 1
    details = first["details"]
    assert details["tail"].splitlines() == ["step 7", *details["tail"].splitlines()[1:3], "ValueError: bad ***"]
    assert details["cause_class"] == "exception" and details["exception"] == "ValueError: bad ***"
    assert details["cause"] == "raised ValueError: bad *** (exit code 1)"
    assert "tail" not in second["details"]  # rank 0 printed nothing
    # the root cause (as contract.root_cause picks it: the first to fail) carries its tail into the restart
    assert restart["type"] == EventType.injob_restart and restart["details"]["rank"] == 1
    assert restart["details"]["cause"] == "rank 1 raised ValueError: bad *** (exit code 1)"
    assert restart["details"]["tail"] == details["tail"] and restart["details"]["restart_count"] == 1
    context.close()
    logs.close()
    kept = [contract.read_log_record(x) for x in (tmp_path / "logs" / "rank1.jsonl").read_text().splitlines()]
    assert [(r["cycle"], r["line"]) for r in kept if r][-2:] == [
        (0, "ValueError: bad ***"),
        (1, "the next cycle starts"),
    ]


def test_the_end_of_the_output_reports_what_is_held_and_a_signal_is_not_an_exception(tmp_path: Path) -> None:
    logs = RankLogs(tmp_path / "logs", Redactor())
    uplink = Recorded()
    context = FailureContext(uplink, "job1", logs, injected=lambda round_: None, max_hold_s=60)
    logs.rank_line(0, "ValueError: printed, not raised")
    context.hold(RankFailed(0, RankExit(local_rank=0, pid=7, exit_code=-9, rank=0)))
    context.close()
    (event,) = uplink.events
    assert event["details"]["cause_class"] == "crash" and event["details"]["tail"] == "ValueError: printed, not raised"


def test_a_round_that_never_says_it_ended_is_reported_after_the_longest_hold(tmp_path: Path) -> None:
    uplink = Recorded()
    context = FailureContext(uplink, "job1", RankLogs(tmp_path / "logs", Redactor()), lambda r: None, max_hold_s=0.2)
    context.hold(RankFailed(0, RankExit(local_rank=0, pid=7, exit_code=1, rank=0)))
    wait_for("the failure reported", lambda: uplink.events, 5, interval=0.02)
    context.close()


def test_a_rank_that_printed_nothing_keeps_its_plain_cause() -> None:
    cause = RankExit(local_rank=0, pid=7, exit_code=1, rank=0).cause()
    assert with_tail(cause, []) == cause
    assert with_tail(cause, ["step 1"])["cause"] == "exit code 1"


# Two CPU ranks under ft_launcher in a gloo allreduce loop; rank 1 raises, rank 0's next allreduce breaks
# (captured/README.md). The launcher names rank 0 alone in the first round, rank 0 first in the second.
CAPTURED = Path(__file__).parent / "captured" / "gloo-peer-exited.log"
PEER_RAISED = "ValueError: rank 1 fails after step 3"


def rank_lines(rank: int, cycle: int) -> list[str]:
    """What `rank` printed in the captured `cycle`, without the agent's prefix."""
    cycles = CAPTURED.read_text().split("will restart worker group")
    prefix = f"[rank{rank}]:"
    return [line[len(prefix) :] for line in cycles[cycle].splitlines() if line.startswith(prefix)]


def test_a_rank_whose_gloo_collective_broke_when_its_peer_exited_is_a_consequence() -> None:
    broken = with_tail(RankExit(local_rank=0, pid=40, exit_code=1, rank=0).cause(), rank_lines(0, 0))
    assert broken["consequence"] is True and broken["cause_class"] == "exception"
    assert broken["exception"].startswith("RuntimeError: [") and "Connection closed by peer" in broken["exception"]
    assert broken["cause"].startswith("raised RuntimeError: [") and broken["cause"].endswith("(exit code 1)")
    raised = with_tail(RankExit(local_rank=1, pid=41, exit_code=1, rank=1).cause(), rank_lines(1, 0))
    assert raised["exception"] == PEER_RAISED and "consequence" not in raised
    killed = with_tail(RankExit(local_rank=0, pid=40, exit_code=-9, rank=0).cause(), rank_lines(0, 0))
    assert "consequence" not in killed  # a rank killed by a signal of its own is no consequence of its lines


def test_the_captured_rounds_name_the_rank_that_raised_whichever_the_launcher_named(tmp_path: Path) -> None:
    """The whole captured output, through the agent's reading of it: the first round's only named failure is
    rank 0's broken collective; the in-job restart's cause is rank 1's exception, read from its lines."""
    logs = RankLogs(tmp_path / "logs", Redactor())
    uplink = Recorded()
    context = FailureContext(uplink, "job1", logs, injected=lambda round_: None, max_hold_s=60)
    output = LauncherOutput(rank_of_local={0: 0, 1: 1})
    for line in CAPTURED.read_text().splitlines():
        for fact in output.feed(line):
            if isinstance(fact, RankOutput):
                logs.rank_line(fact.rank, fact.text)
            elif isinstance(fact, RankFailed | GroupRestarted):
                context.hold(fact)
    context.close()
    logs.close()
    kinds = [(e["type"], e.get("rank"), e["details"].get("round")) for e in uplink.events]
    assert kinds == [
        (EventType.rank_failed, 0, 0),
        (EventType.injob_restart, None, None),
        (EventType.rank_failed, 0, 1),
        (EventType.rank_failed, 1, 1),  # from the launcher's closing summary
    ]
    first, restart, second, raised = (e["details"] for e in uplink.events)
    assert first["consequence"] is True and second["consequence"] is True
    assert restart["cause"] == f"rank 1 raised {PEER_RAISED}" and restart["cause_class"] == "exception"
    assert restart["rank"] == 1 and restart["tail"].splitlines()[-1].endswith(PEER_RAISED)
    assert "consequence" not in restart
    assert raised["cause"] == f"raised {PEER_RAISED} (exit code 1)" and "consequence" not in raised
    # The control plane's rule over the second round's failures, as reported: rank 1's comes first.
    reported = [e for e in uplink.events if e["type"] == EventType.rank_failed and e["details"]["round"] == 1]
    root = contract.root_cause(
        reported,
        hung=lambda e: e["details"].get("cause_class") == "hang",
        signal=lambda e: e["details"].get("signal"),
        consequence=lambda e: e["details"].get("consequence") is True,
    )
    assert root is not None and root["rank"] == 1


def test_a_consequence_named_first_is_not_the_rounds_cause(tmp_path: Path) -> None:
    logs = RankLogs(tmp_path / "logs", Redactor())
    uplink = Recorded()
    context = FailureContext(uplink, "job1", logs, injected=lambda round_: None, max_hold_s=60)
    broken = RankExit(local_rank=0, pid=40, exit_code=1, rank=0)
    raised = RankExit(local_rank=1, pid=41, exit_code=1, rank=1)
    for line in rank_lines(0, 0):
        logs.rank_line(0, line)
    for line in rank_lines(1, 0):
        logs.rank_line(1, line)
    context.hold(RankFailed(0, broken))
    context.hold(RankFailed(0, raised))
    context.hold(GroupRestarted(1, (broken, raised), attempts_left=0))
    context.close()
    restart = uplink.events[-1]["details"]
    assert restart["cause"] == f"rank 1 raised {PEER_RAISED} (exit code 1)" and restart["pid"] == 41


def test_a_rank_the_watchdog_aborted_is_no_root_cause_before_the_one_that_raised(tmp_path: Path) -> None:
    """NCCL's watchdog aborts (SIGABRT) a rank whose collective a peer's exit left waiting: a fault signal, but its
    last lines say it is a consequence; the rank that raised is the round's cause."""
    logs = RankLogs(tmp_path / "logs", Redactor())
    uplink = Recorded()
    context = FailureContext(uplink, "job1", logs, injected=lambda round_: None, max_hold_s=60)
    aborted = RankExit(local_rank=0, pid=40, exit_code=-6, rank=0)
    raised = RankExit(local_rank=1, pid=41, exit_code=1, rank=1)
    watchdog = "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE) ran for"
    logs.rank_line(0, watchdog + " 600000 milliseconds before timing out.")
    for line in rank_lines(1, 0):
        logs.rank_line(1, line)
    context.hold(RankFailed(0, aborted))
    context.hold(RankFailed(0, raised))
    context.hold(GroupRestarted(1, (aborted, raised), attempts_left=0))
    context.close()
    first, _, restart = (e["details"] for e in uplink.events)
    assert first["consequence"] is True and first["signal"] == "SIGABRT"
    assert restart["cause"] == f"rank 1 raised {PEER_RAISED} (exit code 1)"


def test_a_rank_the_agent_crashed_gets_its_rank_failed_when_the_launcher_names_only_its_peer(tmp_path: Path) -> None:
    """ft_launcher names the first exit of a round: here rank 0's broken collective, not rank 1 the agent killed."""
    from ftplane.trainer.agent.faults import injected_crash_cause

    uplink = Recorded()
    crashed = injected_crash_cause(1, 51)
    context = FailureContext(uplink, "job1", RankLogs(tmp_path / "logs", Redactor()), lambda r: crashed, max_hold_s=60)
    peer = RankExit(local_rank=0, pid=50, exit_code=1, rank=0)
    context.hold(RankFailed(0, peer))
    context.hold(GroupRestarted(1, (peer,), attempts_left=1))
    wait_for("the failures reported", lambda: len(uplink.events) == 3, 5, interval=0.02)
    context.close()
    failed = {e["rank"]: e for e in uplink.events if e["type"] == EventType.rank_failed}
    assert set(failed) == {0, 1}
    assert failed[1]["details"]["injected"] is True and failed[1]["key"] == "agent:node-a:a0:pid51:exit"
    (restart,) = [e for e in uplink.events if e["type"] == EventType.injob_restart]
    assert restart["details"]["rank"] == 1 and restart["details"]["injected"] is True


def test_a_silent_rank_the_launcher_never_named_is_the_cause_before_its_peers_broken_collective(tmp_path: Path) -> None:
    """Rank 1 hangs; its monitor kills it; rank 0's gloo collective breaks and the launcher names only rank 0."""
    logs = RankLogs(tmp_path / "logs", Redactor())
    uplink = Recorded()
    context = FailureContext(uplink, "job1", logs, injected=lambda round_: None, max_hold_s=60)
    broken = RankExit(local_rank=0, pid=40, exit_code=1, rank=0)
    for line in rank_lines(0, 0):
        logs.rank_line(0, line)
    logs.rank_line(1, "step 12")
    context.hold(RankFailed(0, broken))
    context.hold(GroupRestarted(1, (broken,), attempts_left=1, silent={1: 4.0}))
    context.close()
    first, restart = (e["details"] for e in uplink.events)
    assert first["consequence"] is True
    assert restart["cause"] == "rank 1 stopped (ft_launcher: no heartbeat for 4 s)"
    assert (restart["cause_class"], restart["rank"], restart["silent_s"]) == ("hang", 1, 4.0)
    assert restart["tail"] == "step 12"


def test_a_held_failure_is_reported_as_its_round_ended(tmp_path: Path) -> None:
    """The monitor's line came after the launcher named the exit: the rank's `rank_failed` says it was silent."""
    uplink = Recorded()
    context = FailureContext(uplink, "job1", RankLogs(tmp_path / "logs", Redactor()), lambda r: None, max_hold_s=60)
    killed = RankExit(local_rank=1, pid=41, exit_code=-9, rank=1)
    context.hold(RankFailed(0, killed))
    context.hold(GroupRestarted(1, (RankExit(1, 41, -9, rank=1, silent_s=4.0),), attempts_left=1, silent={1: 4.0}))
    context.close()
    failed, restart = (e["details"] for e in uplink.events)
    assert failed["cause_class"] == restart["cause_class"] == "hang" and failed["silent_s"] == 4.0
