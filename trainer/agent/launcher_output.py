"""Reading ft_launcher's output as it is written: the ranks' lines, and what the launcher says it did.

The agent starts the launcher with `--tee 3` and a line prefix naming each rank
(`TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=[rank${rank}]:`), so every line is either a rank's own
output (`[rank3]:step 120 loss 2.31`) or the launcher's. From the launcher's lines this reads
(NVRx 0.4.1 and 0.7 print the same messages; 0.6+ names the rank monitor's rank otherwise, and both
forms are read; they give these facts as text only):

    [ERROR] ... failed (exitcode: -9) local_rank: 1 (pid: 4242) of binary: ...   a rank ended
    ProcessFailure(local_rank=1, pid=4242, exitcode=1 ...)                      the same, at the end
    [RankMonServer...:1] Did not get subsequent heartbeat. Waited 20.00 seconds  killed for silence
    Worker group UNHEALTHY. 2/3 attempts left; will restart worker group         an in-job restart
    ... UnhealthyNodeException ...                                               NVRx found the node unhealthy
    Progress tracker detected no progress across restarts. No more restarts ...   NVRx's verdict (0.6+)
    ... Cycle: 1 Event: rendezvous_completed ... Time: ... UTC                   NVRx 0.5+: a cycle's timing

A round is the life of one worker group; each in-job restart starts the next. A rank killed for
silence is the root cause of its round; else one killed by a signal; ranks that then exit 1 on a
broken collective (a consequence: marked so from their last lines, failure_context.py), or are killed
as the group is torn down, are collateral.
"""

from __future__ import annotations

import dataclasses
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ftplane import contract
from ftplane.trainer.agent.launcher_timing import CycleTimed, LauncherTiming

RANK_LINE = re.compile(r"^\[rank(\d+)\]:(.*)$")
RANK_EXIT = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
FINAL_FAILURE = re.compile(r"ProcessFailure\(local_rank=(\d+), pid=(\d+), exitcode=(-?\d+)")
# The rank monitor names the rank it serves after the host.
HEARTBEAT_TIMEOUT = re.compile(
    r"\[RankMonServer\d+@[^\]:]*:(\d+)\] Did not get (?:initial|subsequent) heartbeat\. Waited ([\d.]+) seconds"
)
# NVRx 0.6+: the monitor names its rank as `[workload:RANK(LOCAL_RANK) ...]` ("?" while it is not known yet).
HEARTBEAT_TIMEOUT_CYCLES = re.compile(
    r"\[workload:(\S*?)\((\d+)\)[^\]]*\].*?(?:\[Cycle \d+\] )?Did not get (?:initial|subsequent) heartbeat\. "
    r"Waited ([\d.]+) seconds"
)
# NVRx's health checks found this node unhealthy (0.4.1 then exits 0, later versions 1): the node must go.
UNHEALTHY = re.compile(r"UnhealthyNodeException:?\s*(.*)")
HEALTH_CHECK_FAILED = re.compile(r"([^\[\]]*\S failed for node \S+: .*)$")
# NVRx 0.6+'s progress tracker stops restarting a job that makes no progress: its verdict, whatever the launcher's own
# exit code then is (fault_tolerance/launcher.py, `_handle_restart_decision`).
NO_PROGRESS_VERDICT = re.compile(r"(Progress tracker detected no progress across restarts\. No more restarts.*)$")
GROUP_RESTART = re.compile(r"Worker group (\w+)\. (\d+)/(\d+) attempts left; will restart worker group")
PREFIX_TEMPLATE = "[rank${rank}]:"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe_exit(code: int) -> str:
    return f"killed by {signal_name(-code)}" if code < 0 else f"exit code {code}"


@dataclass(frozen=True)
class RankExit:
    """A rank process the launcher saw end, in one round."""

    local_rank: int
    pid: int
    exit_code: int
    rank: int | None = None  # the global rank, when the agent knew the pid
    silent_s: float | None = None  # set when the launcher killed it for no heartbeat in this long

    def signal(self) -> str | None:
        """The name of the signal that ended it, if one did."""
        return signal_name(-self.exit_code) if self.exit_code < 0 else None

    def cause(self) -> dict[str, Any]:
        """The structured cause (the event details' keys): a hang when killed for silence, else a crash."""
        facts: dict[str, Any] = {"local_rank": self.local_rank, "exit_code": self.exit_code, "pid": self.pid}
        if self.rank is not None:
            facts["rank"] = self.rank
        if self.exit_code < 0:
            facts["signal"] = self.signal()
        text = describe_exit(self.exit_code)
        if self.silent_s is not None:
            facts["silent_s"] = self.silent_s
            return {
                "cause": f"{text} (ft_launcher: no heartbeat for {self.silent_s:g} s)",
                "cause_class": "hang",
                **facts,
            }
        return {"cause": text, "cause_class": "crash", **facts}

    @property
    def who(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"local rank {self.local_rank}"


def silence_cause(rank: int, silent_s: float) -> dict[str, Any]:
    """The cause of a round whose rank `rank` its monitor found silent, when the launcher never named its exit."""
    return {
        "cause": f"rank {rank} stopped (ft_launcher: no heartbeat for {silent_s:g} s)",
        "cause_class": "hang",
        "rank": rank,
        "silent_s": silent_s,
    }


def root_cause(failures: list[RankExit], consequence: Callable[[RankExit], bool] | None = None) -> RankExit | None:
    """contract.root_cause over a round's failures; `consequence` says which broke because a peer failed."""
    return contract.root_cause(
        failures, hung=lambda f: f.silent_s is not None, signal=RankExit.signal, consequence=consequence
    )


def consequence_of(failures: list[RankExit], failure: RankExit, crashed: int | None = None) -> str | None:
    """Who `failure` is a consequence of, if it is one: a rank that exited after a peer of its round was killed by a
    signal (its collective broke), or after rank `crashed` was crashed on purpose (an injected fault)."""
    if contract.fault_signal(failure.signal()):
        return None
    first = root_cause(failures)
    if first is not None and first is not failure and contract.fault_signal(first.signal()):
        return first.who
    if crashed is not None and crashed != failure.rank:
        return f"rank {crashed}"
    return None


def round_cause(
    failures: list[RankExit], cause_of: Callable[[RankExit], dict[str, Any]] = RankExit.cause
) -> dict[str, Any]:
    """The cause of a round's end, as event details (`worker group failed` when no rank said why); `cause_of`
    gives a failure's own cause (with its tail, when the agent has it), marked `consequence` when its collective
    broke because a peer failed: a failure that is none comes first."""
    first = root_cause(failures, consequence=lambda f: cause_of(f).get("consequence") is True)
    if first is None:
        return {"cause": "worker group failed", "cause_class": "unknown"}
    cause = dict(cause_of(first))
    cause["cause"] = f"{first.who} {cause['cause']}"
    return cause


@dataclass(frozen=True)
class RankOutput:
    rank: int
    text: str


@dataclass(frozen=True)
class RankFailed:
    round: int
    failure: RankExit


@dataclass(frozen=True)
class GroupRestarted:
    restart_count: int  # 1 for the first in-job restart
    failures: tuple[RankExit, ...]
    attempts_left: int
    # The ranks the rank monitors said were silent in the round, in the order they said it: rank -> the timeout
    # that elapsed. The launcher may name a silent rank's exit before its monitor's line, or not at all.
    silent: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeUnhealthy:
    reason: str


@dataclass(frozen=True)
class Verdict:
    """NVRx decided not to restart: the node agent ends with contract.VERDICT, whatever its launcher's exit code."""

    reason: str


Fact = RankOutput | RankFailed | GroupRestarted | NodeUnhealthy | Verdict | CycleTimed


@dataclass
class LauncherOutput:
    """Feed it the launcher's output line by line; it returns the facts each line gives."""

    rank_of_pid: dict[int, int] = field(default_factory=dict)  # kept up to date by the agent
    rank_of_local: dict[int, int] = field(default_factory=dict)  # the newest seen: a rank that died young
    round: int = 0
    failures: list[RankExit] = field(default_factory=list)  # this round's
    _silent: dict[int, float] = field(default_factory=dict)  # this round's: rank -> the timeout that elapsed
    _seen_pids: set[int] = field(default_factory=set)
    _check_failed: str | None = None  # the last health check failure said, for the reason
    timing: LauncherTiming = field(default_factory=LauncherTiming)  # NVRx 0.5+'s timed cycle events

    def feed(self, line: str) -> list[Fact]:
        line = line.rstrip("\r\n")
        rank_line = RANK_LINE.match(line)
        if rank_line:
            return [RankOutput(int(rank_line[1]), rank_line[2])]
        timed = self.timing.feed(line)
        if timed is not None:
            return [timed]
        silence = HEARTBEAT_TIMEOUT.search(line)
        if silence:
            self._silent.setdefault(int(silence[1]), float(silence[2]))
            return []
        silence = HEARTBEAT_TIMEOUT_CYCLES.search(line)
        if silence:
            rank = int(silence[1]) if silence[1].isdigit() else self.rank_of_local.get(int(silence[2]), int(silence[2]))
            self._silent.setdefault(rank, float(silence[3]))
            return []
        failed = RANK_EXIT.search(line)
        if failed:
            return self._failed(local_rank=int(failed[2]), pid=int(failed[3]), code=int(failed[1]))
        finals = list(FINAL_FAILURE.finditer(line))  # the closing summary names every failed rank on one line
        if finals:
            return [f for m in finals for f in self._failed(local_rank=int(m[1]), pid=int(m[2]), code=int(m[3]))]
        check = HEALTH_CHECK_FAILED.search(line)
        if check:
            self._check_failed = check[1].strip()[:500]
        unhealthy = UNHEALTHY.search(line)
        if unhealthy:
            reason = self._check_failed or unhealthy[1][:500] or "NVRx's health check failed"
            return [NodeUnhealthy(f"NVRx health check: {reason}")]
        verdict = NO_PROGRESS_VERDICT.search(line)
        if verdict:
            return [Verdict(f"NVRx: {verdict[1].strip()[:300]}")]
        restart = GROUP_RESTART.search(line)
        if restart:
            failures = tuple(self._with_silence(f) for f in self.failures)
            fact = GroupRestarted(self.round + 1, failures, attempts_left=int(restart[2]), silent=dict(self._silent))
            self.round += 1
            self.failures = []
            self._silent = {}
            return [fact]
        return []

    def _failed(self, *, local_rank: int, pid: int, code: int) -> list[Fact]:
        if pid in self._seen_pids:
            return []
        self._seen_pids.add(pid)
        rank = self.rank_of_pid.get(pid, self.rank_of_local.get(local_rank))
        failure = self._with_silence(RankExit(local_rank, pid, code, rank=rank))
        self.failures.append(failure)
        return [RankFailed(self.round, failure)]

    def _with_silence(self, failure: RankExit) -> RankExit:
        """`failure`, marked killed for silence when its rank's monitor has said so in this round (the monitor
        names the rank it serves: the global rank where known, else the local one)."""
        if failure.silent_s is not None or failure.exit_code >= 0:
            return failure
        silent = self._silent.get(failure.rank if failure.rank is not None else failure.local_rank)
        return failure if silent is None else dataclasses.replace(failure, silent_s=silent)
