"""The node agent: starts ft_launcher with the job's command and speaks for the whole node.

    agent ── uplink ──► control plane (one batched report per interval, the job's token)
      ├── rank channel ◄── ranks using the SDK (heartbeats, events, exclude_node)
      └── ft_launcher ──► ranks (their output teed, prefixed with the rank)

Each interval the agent reports the node's liveness (itself, the launcher, each rank's process,
GPU health), the ranks' newest heartbeats and any events. It reads what the launcher did from its
output (rank failures and their causes, in-job restarts) and, with a log pattern in the spec, the
ranks' steps from their own lines. It keeps each rank's lines on the node, redacted (rank_logs.py),
and a failure's last lines travel with it (failure_context.py). It carries out the faults the
control plane hands it (crash, hang, node loss), and forwards to the ranks those only they can
inject. It never blocks or kills training because the control plane is away. Its exit status tells
the backend what the node's end means (ftplane/contract.py).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import threading
import time
from typing import Any

from ftplane import contract
from ftplane.contract import Env, EventType, utcnow_iso
from ftplane.trainer.agent import faults, protocol
from ftplane.trainer.agent.channel import RankChannel
from ftplane.trainer.agent.config import AgentConfig, socket_path
from ftplane.trainer.agent.cycle_info import CycleInfoReader, with_cycle_info
from ftplane.trainer.agent.exit_status import exit_status
from ftplane.trainer.agent.failure_context import FailureContext
from ftplane.trainer.agent.gpu import GpuMonitor, application_xid_facts
from ftplane.trainer.agent.launcher_copies import LauncherCopies
from ftplane.trainer.agent.launcher_output import (
    PREFIX_TEMPLATE,
    GroupRestarted,
    LauncherOutput,
    NodeUnhealthy,
    RankFailed,
    RankOutput,
    Verdict,
    consequence_of,
)
from ftplane.trainer.agent.launcher_timing import CycleTimed
from ftplane.trainer.agent.line_progress import LineProgress
from ftplane.trainer.agent.observations import NodeObservations
from ftplane.trainer.agent.presets import PRESETS
from ftplane.trainer.agent.processes import RankProcess, rank_processes
from ftplane.trainer.agent.rank_logs import RankLogs, lines_of
from ftplane.trainer.agent.redaction import Redactor
from ftplane.trainer.agent.run_reports import RunReports
from ftplane.trainer.agent.uplink import Uplink

log = logging.getLogger(__name__)


class NodeAgent:
    def __init__(self, config: AgentConfig, gpus: GpuMonitor | None = None) -> None:
        self.config = config
        self.state = NodeObservations()
        self.lock = threading.Lock()
        self.preset = PRESETS[config.preset] if config.preset else None
        pattern = re.compile(config.log_pattern) if config.log_pattern else None
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
        progress = LineProgress(self.preset, pattern) if self.preset or pattern else None
        self.runs = RunReports(self.uplink, config.node, config.attempt, progress)
        config.run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(config.run_dir, 0o700)  # the socket and the kept output are this node's alone
        redact = Redactor.from_environment(os.environ)
        self.logs = RankLogs(config.run_dir / contract.LOG_DIR, redact, config.log_max_bytes, echo=config.echo_output)
        # the ranks' consequences (held by RunReports) follow the launcher's word on their round
        release = self.runs.release_all
        self.failures = FailureContext(self.uplink, config.job_id, self.logs, self._injected_cause, on_reported=release)
        self.socket_path = socket_path(config.run_dir)
        self.channel = RankChannel(self.socket_path, self._on_rank_message)
        self.cycle_records = CycleInfoReader(config.run_dir / "nvrx")
        self.launcher: subprocess.Popen[bytes] | None = None
        self.copies = LauncherCopies(0)  # ft_launcher's own copies of the ranks' output, kept bounded
        self._stop = threading.Event()
        self._signalled = 0  # the signal the agent was told to stop with, if any
        self._known: dict[tuple[int, int], RankProcess | None] = {}  # what each process under the launcher is

    # ---- running ----

    def run(self) -> int:
        """Start the launcher, report until it ends, and return the agent's exit status."""
        self.launcher = self._start_launcher()
        self.copies = LauncherCopies(self.launcher.pid)
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
            self.failures.close()  # the failures held for their tails, reported before the agent leaves
            self._observe()
            self.runs.release_all()
            return self._finish(code)
        finally:
            self.channel.close()
            self.logs.close()

    def _start_launcher(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.pop(Env.TOKEN, None)  # the ranks never see the job's token
        # The ranks' own environment: the preset's, then the spec's `env` (never the agent's own).
        env.update(self.preset.environment if self.preset else {})
        env.update(json.loads(env.pop(Env.RANK_ENV, "") or "{}"))
        env.update(
            {
                protocol.SOCKET_ENV: str(self.socket_path),
                "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": PREFIX_TEMPLATE,
                "PYTHONUNBUFFERED": "1",
                Env.NODE_NAME: self.config.node,
            }
        )
        command = with_cycle_info(self.config.command, self.cycle_records.directory)
        log.info("node %s: starting %s", self.config.node, " ".join(command))
        return subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )

    def _wait_for_launcher(self) -> int:
        """The launcher's exit status; one told to stop gets the stop grace (the spec's, 10 s by default: time for the
        ranks it passed SIGTERM to, to save and end), then its tree is killed."""
        assert self.launcher is not None
        try:
            return self.launcher.wait(timeout=self.config.stop_grace_s if self._stop.is_set() else None)
        except subprocess.TimeoutExpired:
            log.warning("node %s: the launcher outlived its grace period; killing its process tree", self.config.node)
            faults.kill_tree(self.launcher.pid)
            return self.launcher.wait()

    def _forward_signal(self, signum: int, _frame: object) -> None:
        self._signalled = signum
        if self.launcher is not None and self.launcher.poll() is None:
            faults.resume_stopped(self.launcher.pid)  # a stopped (hung) rank can't handle SIGTERM
            self.launcher.send_signal(signum)
        self._stop.set()

    def _read_output(self) -> None:
        assert self.launcher is not None and self.launcher.stdout is not None
        for line in lines_of(self.launcher.stdout):
            try:
                self._on_line(line)
            except Exception:
                log.exception("reading a launcher line failed")

    def _finish(self, code: int) -> int:
        status = exit_status(
            code, unhealthy=self.state.unhealthy is not None, verdict=self.state.verdict, signalled=self._signalled
        )
        self.uplink.liveness(self._liveness(final_code=code))
        # An agent told to stop does not hold its last report: a job restart waits for it (contract.exit_flush_s).
        holds = self._signalled is None
        if not self.uplink.close(contract.exit_flush_s(self.config.interval_s, held=holds), hold=holds):
            log.warning("node %s: left with reports undelivered", self.config.node)
        log.info("node %s: launcher exited with %s; agent exits %d", self.config.node, code, status)
        return status

    # ---- what the node sees ----

    def _observe(self) -> None:
        """Refresh the rank process table, read GPU health, and queue the node's liveness."""
        if self.launcher is None:
            return
        seen = rank_processes(self.launcher.pid, self._known) if self.launcher.poll() is None else []
        if seen:
            self.copies.release()
        with self.lock:
            for process in seen:
                self.state.ranks[process.rank] = process
                self.output.rank_of_pid[process.pid] = process.rank
                self.output.rank_of_local[process.local_rank] = process.rank
                up = self.state.round_ranks.setdefault(process.restart_count, set())
                up.add(process.local_rank)
                if len(up) >= process.local_world_size:  # every rank of the round on this node is up
                    self.state.rounds_seen.setdefault(process.restart_count, (time.monotonic(), utcnow_iso()))
        self._announce_runs()
        self.runs.release()
        self._announce_cycle_records()
        devices = self.gpus.read()
        reason = self.gpus.unhealthy_reason(devices)
        if reason is not None:
            self.mark_unhealthy(reason, source="gpu", facts=self.gpus.unhealthy_facts(devices))
        self.uplink.liveness(self._liveness(devices=[d.as_dict() for d in devices], alive={p.pid for p in seen}))

    def _announce_runs(self) -> None:
        """`running` for each round of ranks as soon as its processes are up (run_reports.py)."""
        with self.lock:
            due = [(count, first) for count, (_, first) in self.state.rounds_seen.items()]
        for count, first in due:
            self.runs.ranks_up(count, first)

    def _announce_cycle_records(self) -> None:
        """NVRx's own record of each launcher cycle (written on the rendezvous host only): one `launcher_cycle` as the
        cycle starts (its active and standby nodes) and one as it ends."""
        for record in self.cycle_records.new():
            end = "end" if record.ended else "start"
            self.uplink.event(
                EventType.launcher_cycle,
                key=f"cycle_info:{self.config.job_id}:a{self.config.attempt}:{record.attempt_index}:c{record.cycle}:{end}",
                ts=(record.ended or record.started) or None,
                details=record.details(),
            )

    def _liveness(
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
            progress = "log" if self.runs.reads_progress else ("sdk" if self.state.sdk_ranks else "none")
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
        facts = self.output.feed(line)
        if not any(isinstance(fact, RankOutput) for fact in facts):
            self.logs.launcher_line(line.rstrip("\r\n"))
        for fact in facts:
            if isinstance(fact, RankOutput):
                self._rank_output(fact)
            elif isinstance(fact, RankFailed):
                cause = fact.failure.cause()
                if fact.failure.rank is not None:
                    with self.lock:
                        self.state.exits[fact.failure.rank] = {
                            k: cause[k] for k in ("exit_code", "signal") if k in cause
                        }
                self.failures.hold(fact, self._failure_facts(fact))  # reported with its tail (failure_context.py)
            elif isinstance(fact, NodeUnhealthy):
                self.mark_unhealthy(fact.reason, source="launcher")
            elif isinstance(fact, Verdict):
                with self.lock:
                    self.state.verdict = fact.reason
            elif isinstance(fact, CycleTimed):
                self.uplink.event(
                    EventType.launcher_cycle,
                    key=f"agent:{self.config.node}:a{self.config.attempt}:cycle{fact.cycle}",
                    ts=fact.began.isoformat(),
                    details={"cycle": fact.cycle, "phases": fact.phases, "source": "launcher"},
                )
            elif isinstance(fact, GroupRestarted):
                highest = self.runs.highest_step()  # of the round that ended: the step the job had reached
                self.failures.hold(fact, {"step": highest, "failed_step": highest} if highest is not None else None)
                self.runs.new_round()

    def _rank_output(self, output: RankOutput) -> None:
        text = self.logs.rank_line(output.rank, output.text)
        self.runs.rank_line(self.output.round, output.rank, text)

    def _failure_facts(self, fact: RankFailed) -> dict[str, Any]:
        """What the agent adds to a rank failure the launcher saw: whether it is a peer's consequence, and the last
        step the rank's output showed (and when: goodput's step time)."""
        with self.lock:
            crashed = self.state.injected.get(fact.round)
        facts: dict[str, Any] = application_xid_facts(self.gpus, fact.failure.local_rank)  # the program's Xids
        peer = consequence_of(self.output.failures, fact.failure, crashed[0] if crashed else None)
        if peer is not None:
            facts.update(consequence=True, consequence_of=peer)
        reached = self.runs.step_of(fact.failure.rank)
        if reached is not None:
            facts.update(step=reached[0], step_at=reached[1])
        return facts

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
            event = dict(message.event)
            with self.lock:
                self.state.sdk_heard_at = time.monotonic()
                if (crash := faults.crash_announced(event)) is not None:  # the rank kills itself next
                    self.state.injected[self.output.round] = crash
            self.runs.forward(event)
        elif isinstance(message, protocol.ExcludeNode):
            who = f"rank {message.rank}" if message.rank is not None else "a rank"
            self.mark_unhealthy(f"{who} asked to exclude this node: {message.reason}", source="rank")

    # ---- health and faults ----

    def mark_unhealthy(self, reason: str, *, source: str, facts: dict[str, Any] | None = None) -> None:
        """Report node_unhealthy once (with the `facts` of a GPU's failure: its Xids or new ECC errors), stop the
        launcher, and leave with NODE_UNHEALTHY."""
        with self.lock:
            if self.state.unhealthy is not None:
                return
            self.state.unhealthy = reason
        log.error("node %s is unhealthy: %s", self.config.node, reason)
        self.uplink.event(
            EventType.node_unhealthy,
            key=f"node_unhealthy:{self.config.node}:a{self.config.attempt}",
            details={
                **(facts or {}),
                "cause": reason,
                "cause_class": "node",
                "node": self.config.node,
                "source": source,
            },
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
        return faults.injected_crash_cause(*crashed)

    def _carry_out(self, directive: dict[str, Any], rank: int) -> None:
        kind = str(directive.get("kind"))
        with self.lock:
            process = self.state.ranks.get(rank)
        details = {"kind": kind, "fault_id": directive.get("id"), "source": "control_plane", "delivery": "agent"}
        if process is None or self.launcher is None:
            log.warning("fault %s: rank %s has no process on node %s", directive.get("id"), rank, self.config.node)
            return
        key = f"fault:{directive.get('id')}"
        if kind == "node_loss":
            self.uplink.event(EventType.fault_injected, rank=rank, key=key, details=details)
            self.uplink.event(
                EventType.node_failed,
                key=f"node_failed:{self.config.node}:a{self.config.attempt}",
                details={"cause": "node lost (injected)", "cause_class": "node", "node": self.config.node},
            )
            self.uplink.flush(2.0)  # what happened must outlive the node
            faults.lose_node(self.launcher.pid)
        elif not faults.inject_signal(self.uplink, process, kind, key, details):
            log.warning(
                "fault %s: rank %s's process %s has exited: not injected", directive.get("id"), rank, process.pid
            )
        elif kind == "crash":
            with self.lock:
                self.state.injected[self.output.round] = (rank, process.pid)
