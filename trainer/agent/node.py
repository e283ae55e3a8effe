"""The node agent: starts ft_launcher with the job's command and speaks for the whole node.

    agent ── uplink ──► control plane (one batched report per interval, the job's token)
      ├── rank channel ◄── ranks using the SDK (heartbeats, events, exclude_node)
      └── ft_launcher ──► ranks (their output teed, prefixed with the rank)

Each interval the agent reports the node's liveness (itself, the launcher, each rank's process,
GPU health), the ranks' newest heartbeats and any events. It reads what the launcher did from its
output (rank failures and their causes, in-job restarts) and, with a log pattern in the spec, the
ranks' steps from their own lines. It carries out the faults the control plane hands it (crash,
hang, node loss), and forwards to the ranks those only they can inject. It never blocks or kills
training because the control plane is away. Its exit status tells the backend what the node's end
means (exit_codes.py).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any

from trainer.agent import exit_codes, faults, protocol
from trainer.agent.channel import RankChannel
from trainer.agent.config import AgentConfig, socket_path
from trainer.agent.cycle_info import CycleInfoReader, with_cycle_info
from trainer.agent.gpu import GpuMonitor
from trainer.agent.launcher_output import (
    PREFIX_TEMPLATE,
    GroupRestarted,
    LauncherOutput,
    NodeUnhealthy,
    RankFailed,
    RankOutput,
    round_cause,
)
from trainer.agent.launcher_timing import CycleTimed
from trainer.agent.processes import RankProcess, rank_processes
from trainer.agent.report_buffer import utcnow_iso
from trainer.agent.uplink import Uplink

log = logging.getLogger(__name__)

TERMINATE_GRACE_S = 10.0
EXIT_FLUSH_S = 10.0
# A round of ranks that has lived this long without a word from the SDK runs code that does not report.
RUNNING_AFTER_S = float(os.environ.get("FTPLANE_RUNNING_AFTER_S", "30"))


@dataclass
class RankProgress:
    """Steps read from one rank's own output lines (log-pattern progress)."""

    step: int
    at: float
    step_time_s: float | None = None


@dataclass
class NodeState:
    ranks: dict[int, RankProcess] = field(default_factory=dict)  # by global rank, the newest process
    exits: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its last exit, from the launcher
    sdk_ranks: set[int] = field(default_factory=set)
    sdk_heard_at: float = 0.0  # monotonic time of the newest message from an SDK rank
    rounds_seen: dict[int, tuple[float, str]] = field(default_factory=dict)  # restart count -> first seen (mono, iso)
    rounds_announced: set[int] = field(default_factory=set)
    injected: dict[int, tuple[int, int]] = field(default_factory=dict)  # round -> (rank, pid) this agent crashed
    log_progress: dict[int, RankProgress] = field(default_factory=dict)
    unhealthy: str | None = None


class NodeAgent:
    def __init__(self, config: AgentConfig, gpus: GpuMonitor | None = None) -> None:
        self.config = config
        self.state = NodeState()
        self.lock = threading.Lock()
        self.pattern = re.compile(config.log_pattern) if config.log_pattern else None
        self.gpus = gpus if gpus is not None else GpuMonitor()
        self.output = LauncherOutput()
        self.uplink = Uplink(
            config.url,
            config.job_id,
            config.attempt,
            config.token,
            config.node,
            interval_s=config.interval_s,
            on_faults=self._on_faults,
        )
        config.run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(config.run_dir, 0o700)  # the socket and the launcher log are this node's alone
        self.socket_path = socket_path(config.run_dir)
        self.channel = RankChannel(self.socket_path, self._on_rank_message)
        self.cycle_records = CycleInfoReader(config.run_dir / "nvrx")
        self.launcher: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._log: IO[bytes] | None = None
        self._known: dict[tuple[int, int], RankProcess | None] = {}  # what each process under the launcher is

    # ---- running ----

    def run(self) -> int:
        """Start the launcher, report until it ends, and return the agent's exit status."""
        self.launcher = self._start_launcher()
        reader = threading.Thread(target=self._read_output, name="ftplane-launcher-output", daemon=True)
        reader.start()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._forward_signal)
        try:
            while True:
                code = self.launcher.poll()
                self._observe()
                if code is not None or self._stop.wait(self.config.interval_s):
                    break
            code = self._wait_for_launcher()
            reader.join(timeout=5.0)
            self._observe()
            return self._finish(code)
        finally:
            self.channel.close()
            if self._log is not None:
                self._log.close()

    def _start_launcher(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.pop("FTPLANE_TOKEN", None)  # the ranks never see the job's token
        env.update(
            {
                protocol.SOCKET_ENV: str(self.socket_path),
                "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": PREFIX_TEMPLATE,
                "PYTHONUNBUFFERED": "1",
                "FTPLANE_NODE_NAME": self.config.node,
            }
        )
        self._log = open(self.config.run_dir / "launcher.log", "ab", buffering=0)  # noqa: SIM115
        command = with_cycle_info(self.config.command, self.cycle_records.directory)
        log.info("node %s: starting %s", self.config.node, " ".join(command))
        return subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )

    def _wait_for_launcher(self) -> int:
        """The launcher's exit status; one told to stop gets TERMINATE_GRACE_S, then its tree is killed."""
        assert self.launcher is not None
        try:
            return self.launcher.wait(timeout=TERMINATE_GRACE_S if self._stop.is_set() else None)
        except subprocess.TimeoutExpired:
            log.warning("node %s: the launcher outlived its grace period; killing its process tree", self.config.node)
            faults.kill_tree(self.launcher.pid)
            return self.launcher.wait()

    def _forward_signal(self, signum: int, _frame: object) -> None:
        if self.launcher is not None and self.launcher.poll() is None:
            faults.resume_stopped(self.launcher.pid)  # a stopped (hung) rank can't handle SIGTERM
            self.launcher.send_signal(signum)
        self._stop.set()

    def _read_output(self) -> None:
        assert self.launcher is not None and self.launcher.stdout is not None
        for raw in self.launcher.stdout:
            if self._log is not None:
                self._log.write(raw)
            if self.config.echo_output:
                os.write(1, raw)
            try:
                self._on_line(raw.decode(errors="replace"))
            except Exception:
                log.exception("reading a launcher line failed")

    def _finish(self, code: int) -> int:
        unhealthy = self.state.unhealthy
        if unhealthy is not None:
            status = exit_codes.NODE_UNHEALTHY
        elif code == exit_codes.VERDICT:
            status = exit_codes.VERDICT
        elif code < 0:
            status = 128 - code  # killed by a signal, as a shell would say
        else:
            status = code
        self.uplink.status(self._status(final_code=code))
        if not self.uplink.close(EXIT_FLUSH_S):
            log.warning("node %s: left with reports undelivered", self.config.node)
        log.info("node %s: launcher exited with %s; agent exits %d", self.config.node, code, status)
        return status

    # ---- what the node sees ----

    def _observe(self) -> None:
        """Refresh the rank process table, read GPU health, and queue the node's liveness."""
        if self.launcher is None:
            return
        seen = rank_processes(self.launcher.pid, self._known) if self.launcher.poll() is None else []
        with self.lock:
            for process in seen:
                self.state.ranks[process.rank] = process
                self.output.rank_of_pid[process.pid] = process.rank
                self.output.rank_of_local[process.local_rank] = process.rank
                self.state.rounds_seen.setdefault(process.restart_count, (time.monotonic(), utcnow_iso()))
        self._announce_runs()
        self._announce_cycle_records()
        devices = self.gpus.read()
        reason = self.gpus.unhealthy_reason(devices)
        if reason is not None:
            self.mark_unhealthy(reason, source="gpu")
        self.uplink.status(self._status(devices=[d.as_dict() for d in devices], alive={p.pid for p in seen}))

    def _announce_runs(self) -> None:
        """`running` for the ranks' code when it does not say so itself: a round of ranks that has lived
        RUNNING_AFTER_S with no word from the SDK is a run of a zero-code job (goodput needs its start)."""
        now = time.monotonic()
        with self.lock:
            due = [
                (count, first)
                for count, (seen_at, first) in self.state.rounds_seen.items()
                if count not in self.state.rounds_announced
                and now - seen_at >= RUNNING_AFTER_S
                and not self.state.sdk_heard_at  # ranks that use the SDK say `running` themselves, every round
            ]
            self.state.rounds_announced.update(count for count, _ in due)
            start = min((p.step for p in self.state.log_progress.values()), default=1) - 1
        for count, first in due:
            self.uplink.event(
                "running",
                ts=first,
                step=max(start, 0),
                key=f"running:{self.config.node}:a{self.config.attempt}:r{count}",
                details={"restart_count": count, "iteration": 0, "start_step": max(start, 0), "source": "agent"},
            )

    def _announce_cycle_records(self) -> None:
        """NVRx's own record of each launcher cycle (written on the rendezvous host only): one `launcher_cycle` as the
        cycle starts (its active and standby nodes) and one as it ends."""
        for record in self.cycle_records.new():
            end = "end" if record.ended else "start"
            self.uplink.event(
                "launcher_cycle",
                key=f"cycle_info:{self.config.job_id}:a{self.config.attempt}:{record.attempt_index}:c{record.cycle}:{end}",
                ts=(record.ended or record.started) or None,
                details=record.details(),
            )

    def _status(
        self,
        *,
        devices: list[dict[str, Any]] | None = None,
        alive: set[int] | None = None,
        final_code: int | None = None,
    ) -> dict[str, Any]:
        assert self.launcher is not None
        code = self.launcher.poll() if final_code is None else final_code
        with self.lock:
            ranks = []
            for rank, process in sorted(self.state.ranks.items()):
                row: dict[str, Any] = {"rank": rank, "local_rank": process.local_rank, "pid": process.pid}
                row["alive"] = alive is not None and process.pid in alive
                row.update(self.state.exits.get(rank, {}) if not row["alive"] else {})
                ranks.append(row)
            progress = "log" if self.pattern else ("sdk" if self.state.sdk_ranks else "none")
            unhealthy = self.state.unhealthy
        status: dict[str, Any] = {
            "pid": os.getpid(),
            "launcher": {"pid": self.launcher.pid, "alive": code is None, "exit_code": code},
            "ranks": ranks,
            "progress": progress,
            "interval_s": self.config.interval_s,
            "healthy": unhealthy is None,
        }
        if unhealthy is not None:
            status["unhealthy_reason"] = unhealthy
        if devices:
            status["gpus"] = devices
        return status

    def _on_line(self, line: str) -> None:
        for fact in self.output.feed(line):
            if isinstance(fact, RankOutput):
                self._rank_output(fact)
            elif isinstance(fact, RankFailed):
                cause = fact.failure.cause()
                if fact.failure.rank is not None:
                    with self.lock:
                        self.state.exits[fact.failure.rank] = {
                            k: cause[k] for k in ("exit_code", "signal") if k in cause
                        }
                self.uplink.event(
                    "rank_failed",
                    rank=fact.failure.rank,
                    key=f"agent:{self.config.node}:a{self.config.attempt}:pid{fact.failure.pid}:exit",
                    details={**cause, "source": "launcher", "round": fact.round},
                )
            elif isinstance(fact, NodeUnhealthy):
                self.mark_unhealthy(fact.reason, source="launcher")
            elif isinstance(fact, CycleTimed):
                self.uplink.event(
                    "launcher_cycle",
                    key=f"agent:{self.config.node}:a{self.config.attempt}:cycle{fact.cycle}",
                    ts=fact.began.isoformat(),
                    details={"cycle": fact.cycle, "phases": fact.phases, "source": "launcher"},
                )
            elif isinstance(fact, GroupRestarted):
                # Every node's agent reports the restart under one key: stored once, the first wins.
                cause = self._injected_cause(fact.restart_count - 1) or round_cause(list(fact.failures))
                self.uplink.event(
                    "injob_restart",
                    key=f"injob_restart:{self.config.job_id}:{self.config.attempt}:{fact.restart_count}",
                    details={
                        **cause,
                        "restart_count": fact.restart_count,
                        "attempts_left": fact.attempts_left,
                        "source": "launcher",
                    },
                )

    def _rank_output(self, line: RankOutput) -> None:
        if self.pattern is None:
            return
        match = self.pattern.search(line.text)
        if match is None:
            return
        try:
            step = int(match["step"])
        except (TypeError, ValueError):
            return
        now = time.monotonic()
        with self.lock:
            held = self.state.log_progress.get(line.rank)
            step_time = None
            if held is not None and step > held.step:
                step_time = (now - held.at) / (step - held.step)
            self.state.log_progress[line.rank] = RankProgress(
                step, now, step_time or (held.step_time_s if held else None)
            )
        beat = protocol.Heartbeat(rank=line.rank, step=step, ts=utcnow_iso(), step_time_s=step_time)
        self.uplink.heartbeat(beat.for_control_plane(self.config.node))

    def _on_rank_message(self, message: protocol.Message) -> None:
        if isinstance(message, protocol.Hello):
            with self.lock:
                self.state.sdk_ranks.add(message.rank)
                self.state.sdk_heard_at = time.monotonic()
        elif isinstance(message, protocol.Heartbeat):
            with self.lock:
                self.state.sdk_ranks.add(message.rank)
                self.state.sdk_heard_at = time.monotonic()
            self.uplink.heartbeat(message.for_control_plane(self.config.node))
        elif isinstance(message, protocol.RankEvent):
            with self.lock:
                self.state.sdk_heard_at = time.monotonic()
            self.uplink.forward_event(dict(message.event))
        elif isinstance(message, protocol.ExcludeNode):
            who = f"rank {message.rank}" if message.rank is not None else "a rank"
            self.mark_unhealthy(f"{who} asked to exclude this node: {message.reason}", source="rank")

    # ---- health and faults ----

    def mark_unhealthy(self, reason: str, *, source: str) -> None:
        """Report node_unhealthy once, stop the launcher, and leave with NODE_UNHEALTHY."""
        with self.lock:
            if self.state.unhealthy is not None:
                return
            self.state.unhealthy = reason
        log.error("node %s is unhealthy: %s", self.config.node, reason)
        self.uplink.event(
            "node_unhealthy",
            key=f"node_unhealthy:{self.config.node}:a{self.config.attempt}",
            details={"cause": reason, "cause_class": "node", "node": self.config.node, "source": source},
        )
        if self.launcher is not None and self.launcher.poll() is None:
            faults.resume_stopped(self.launcher.pid)
            self.launcher.terminate()
        self._stop.set()

    def _on_faults(self, directives: list[dict[str, Any]]) -> None:
        for directive in directives:
            rank = directive.get("rank")
            if not isinstance(rank, int):
                continue
            if directive.get("delivery") == "agent":
                # Off the uplink's thread: carrying a fault out may wait on the uplink (a node loss flushes first).
                threading.Thread(target=self._carry_out, args=(directive, rank), daemon=True).start()
            else:
                self.channel.send_faults(rank, [directive])

    def _injected_cause(self, round_: int) -> dict[str, Any] | None:
        """The crash this agent itself injected in the round, if any: what it did is known, whichever of the ranks
        the launcher happened to see die first (a peer's broken collective often exits first)."""
        with self.lock:
            crashed = self.state.injected.pop(round_, None)
        if crashed is None:
            return None
        rank, pid = crashed
        return {
            "cause": f"rank {rank} killed by SIGKILL (a crash injected by ftplane)",
            "cause_class": "crash",
            "rank": rank,
            "pid": pid,
            "signal": "SIGKILL",
            "exit_code": -9,
            "injected": True,
        }

    def _carry_out(self, directive: dict[str, Any], rank: int) -> None:
        kind = str(directive.get("kind"))
        with self.lock:
            process = self.state.ranks.get(rank)
        details = {"kind": kind, "fault_id": directive.get("id"), "source": "control_plane", "delivery": "agent"}
        if process is None or self.launcher is None:
            log.warning("fault %s: rank %s has no process on node %s", directive.get("id"), rank, self.config.node)
            return
        self.uplink.event("fault_injected", rank=rank, key=f"fault:{directive.get('id')}", details=details)
        if kind == "node_loss":
            self.uplink.event(
                "node_failed",
                key=f"node_failed:{self.config.node}:a{self.config.attempt}",
                details={"cause": "node lost (injected)", "cause_class": "node", "node": self.config.node},
            )
            self.uplink.flush(2.0)  # what happened must outlive the node
            faults.lose_node(self.launcher.pid)
        elif faults.signal_rank(process, kind) and kind == "crash":
            with self.lock:
                self.state.injected[self.output.round] = (rank, process.pid)
