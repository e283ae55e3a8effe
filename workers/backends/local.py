"""The local backend: each node of an attempt is a node agent on this machine, with its own ft_launcher (CPU + gloo).

A job of `nodes` > 1 runs as that many agents, joined in one rendezvous over loopback, so
multi-node behaviour (a node lost, a node blamed) runs for real on one machine. The node agent
(trainer/agent) reports everything about the ranks itself; this backend only starts the agents,
reads how each ended, and stops them.

State lives on disk under `FTPLANE_LOCAL_RUNS_DIR/<job>/a<attempt>/n<node>/`: `launch.json` (runner pid, start
time), `output.log` (the agent's own log), `agent/` (its socket, the launcher's own lines in
`agent/launcher.log` and each rank's in `agent/logs/`, read by the API's logs route:
api/services/logs/node_files.py) and `exit_code`, written by the runner when the agent ends; the attempt's
`stop.json` records a stop in progress (`LocalBackend.stop`). A worker that restarts reads them back, so
running jobs are re-adopted and stops carried on, not lost. The job's command runs in its `working_dir`, by
default `FTPLANE_LOCAL_RUNS_DIR/<job>/work/` (never the server's own directory): what a framework writes
beside it (Lightning's `lightning_logs/`) stays with the job, in one place across its restarts. The spec's
`env` reaches the ranks only (FTPLANE_RANK_ENV, set by the agent).

The spec's `secret_env` is honoured as on Kubernetes, where each entry is a container variable taken from a
Secret and the agent redacts its value from every line (FTPLANE_SECRET_ENV names it). This machine has no
Secrets: an entry's `key` names a variable of the environment the worker runs in (`ftplane serve`'s), whose
value the agent and the ranks get under the entry's name; `secret` is not read here. A variable that is not
set fails the launch, unless the entry is `optional`. The value never enters the database or `render`.

Every node runs on this one machine: a node blamed for a fault is recorded (the lifecycle
excludes it) but cannot be avoided here; the next attempt says so in its `submitted` event.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from api.core.config import get_settings
from api.schemas.causes import Cause, CauseClass, describe_exit
from api.schemas.spec import JobSpec
from ftplane import contract
from ftplane.trainer.agent.processes import descendants, process_start_time
from workers.backends.base import (
    AttemptPhase,
    AttemptReading,
    LaunchRequest,
    agent_environment,
    launcher_arguments,
)
from workers.backends.local_ports import reserve_port

log = logging.getLogger(__name__)

TERMINATE_GRACE_S = 15.0  # the agents pass SIGTERM on to their launchers, which stop the ranks
# A process that outlives its SIGKILL this long (stuck in the kernel, or not ours to kill) is left behind with a
# warning: a stop that never ended would hold a job's next attempt, or its cancellation, for ever.
KILLED_WAIT_S = 10.0


def node_name(index: int) -> str:
    return f"{socket.gethostname()}-n{index}"


def secret_values(spec: JobSpec, host: Mapping[str, str]) -> dict[str, str]:
    """The spec's `secret_env` here: each entry's value from the host variable its `key` names (see above)."""
    values = {}
    for name, ref in sorted(spec.secret_env.items()):
        value = host.get(ref.key)
        if value is not None:
            values[name] = value
        elif not ref.optional:
            raise ValueError(
                f"secret_env.{name}: on the local backend its value is the host variable {ref.key}, which is not set "
                "where the worker runs; set it there, or mark the entry optional"
            )
    return values


@dataclass(frozen=True)
class LocalNode:
    """The on-disk record of one node of one local attempt."""

    path: Path
    name: str

    @property
    def launch_file(self) -> Path:
        return self.path / "launch.json"

    @property
    def agent_dir(self) -> Path:
        return self.path / "agent"

    def launched(self) -> dict[str, object] | None:
        try:
            return dict(json.loads(self.launch_file.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def exit_code(self) -> int | None:
        try:
            return int((self.path / "exit_code").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def log_text(self) -> str:
        """The agent's log and the launcher's output (ranks' lines included)."""
        parts = []
        for path in (self.path / "output.log", self.agent_dir / "launcher.log"):
            with contextlib.suppress(FileNotFoundError):
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)

    def alive(self) -> bool:
        record = self.launched()
        if record is None:
            return False
        started = process_start_time(int(record["pid"]))  # type: ignore[call-overload]
        return started is not None and started == record.get("start_time")


def runner_of(state_dir: Path) -> int | None:
    """The live `local_runner` process of this node directory, if there is one."""
    wanted = [b"-m", b"workers.backends.local_runner", str(state_dir).encode()]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if args[1:4] == wanted and process_start_time(int(entry.name)) is not None:
            return int(entry.name)
    return None


def _write_json(path: Path, record: Mapping[str, object]) -> None:
    """Whole or not at all: a reader never sees half a record."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def node_outcome(node: LocalNode, code: int) -> tuple[AttemptPhase, Cause | None]:
    """What one node's agent ending with `code` means (the runner records a signal as its negative)."""
    if code == 0:
        return AttemptPhase.succeeded, None
    if code == contract.NODE_UNHEALTHY:
        text = f"node {node.name} reported itself unhealthy (its agent's node_unhealthy event says why)"
        return AttemptPhase.failed, Cause(CauseClass.node, text, {"node": node.name, "exit_code": code})
    if code == contract.VERDICT:
        text = f"ft_launcher on node {node.name} decided not to restart (exit {code}: no progress, or its attribution)"
        return AttemptPhase.failed, Cause(CauseClass.verdict, text, {"node": node.name, "exit_code": code})
    if code == -signal.SIGKILL:
        text = f"node {node.name} lost: its agent was killed"
        return AttemptPhase.failed, Cause(CauseClass.node, text, {"node": node.name, "exit_code": code})
    text = f"ft_launcher on node {node.name} exited with {describe_exit(code)}"
    return AttemptPhase.failed, Cause(CauseClass.crash, text, {"node": node.name, "exit_code": code})


class LocalBackend:
    name = "local"
    can_exclude_nodes = False

    def __init__(self, runs_dir: Path | None = None) -> None:
        self.runs_dir = runs_dir or get_settings().resolved_runs_dir

    def attempt_dir(self, job_id: str, attempt: int) -> Path:
        return self.runs_dir / job_id / f"a{attempt}"

    def working_dir(self, job_id: str, spec: JobSpec) -> Path:
        """Where the job's command runs: the spec's working_dir, else a directory of the job's own (every attempt
        and restart of the job runs there, so what the framework writes next to it stays in one place)."""
        return Path(spec.working_dir) if spec.working_dir else self.runs_dir / job_id / "work"

    def nodes(self, job_id: str, attempt: int, spec: JobSpec) -> list[LocalNode]:
        base = self.attempt_dir(job_id, attempt)
        return [LocalNode(base / f"n{i}", node_name(i)) for i in range(spec.nodes)]

    def command(self, request: LaunchRequest, node: LocalNode, index: int, port: int) -> list[str]:
        rdzv_id = f"{request.job_id[:12]}-a{request.attempt}"
        launcher = launcher_arguments(
            request.spec,
            nnodes=request.spec.nodes,
            rdzv_endpoint=f"127.0.0.1:{port}",
            rdzv_id=rdzv_id,
            log_dir=str(node.agent_dir / "ranks"),
            extra=[f"--rdzv-conf=is_host={'true' if index == 0 else 'false'}"],
        )
        return [sys.executable, "-P", "-m", "ftplane.trainer.agent", "--node", node.name, "--", *launcher]

    def node_environment(self, request: LaunchRequest, node: LocalNode) -> dict[str, str]:
        """What one node's agent is told (besides the host's own environment). The spec's `env` is for the ranks
        only: the agent passes it on to them, and runs with its own."""
        env = agent_environment(request)
        env.update(
            {
                contract.Env.TOKEN: request.token,
                contract.Env.NODE_NAME: node.name,
                contract.Env.AGENT_DIR: str(node.agent_dir),
                contract.Env.MASTER_ADDR: "127.0.0.1",
            }
        )
        return env

    def render(self, request: LaunchRequest) -> str:
        nodes = self.nodes(request.job_id, request.attempt, request.spec)
        env = agent_environment(request)
        env[contract.Env.TOKEN] = "<job token>"
        lines = [
            f"# job {request.job_id} attempt {request.attempt}: {len(nodes)} node agent(s) on this host, "
            "each starting its own ft_launcher",
            f"cd {shlex.quote(str(self.working_dir(request.job_id, request.spec)))}",
        ]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
        lines += [f'export {name}="${{{ref.key}}}"' for name, ref in sorted(request.spec.secret_env.items())]
        lines += [shlex.join(self.command(request, node, i, port=29500)) for i, node in enumerate(nodes)]
        return "\n".join(lines) + "\n"

    def launch(self, request: LaunchRequest) -> None:
        """Start every node's agent that is not started yet (idempotent, node by node)."""
        nodes = self.nodes(request.job_id, request.attempt, request.spec)
        port = reserve_port(*get_settings().local_port_range)
        bin_dir = str(Path(sys.executable).parent)
        if shutil.which("ft_launcher", path=bin_dir + os.pathsep + os.environ.get("PATH", "")) is None:
            raise RuntimeError("ft_launcher not found: install ftplane with the [trainer] extra")
        secrets = secret_values(request.spec, os.environ)
        workdir = self.working_dir(request.job_id, request.spec)
        workdir.mkdir(parents=True, exist_ok=True)
        if request.spec.checkpoint.dir:
            (workdir / request.spec.checkpoint.dir).mkdir(parents=True, exist_ok=True)
        for index, node in enumerate(nodes):
            if node.launched() is not None or self._adopt(node):
                continue
            node.path.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ)
            env.update(self.node_environment(request, node))
            env.update(secrets)
            env.update(
                {
                    "PATH": bin_dir + os.pathsep + env.get("PATH", ""),
                    "PYTHONUNBUFFERED": "1",
                }
            )
            command = self.command(request, node, index, port)
            runner = [sys.executable, "-P", "-m", "workers.backends.local_runner", str(node.path), "--", *command]
            process = subprocess.Popen(
                runner,
                env=env,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: it outlives the worker and dies as one on cancel
            )
            record = {
                "pid": process.pid,
                "start_time": process_start_time(process.pid),
                "port": port,
                "node": node.name,
                "launched_at": time.time(),
            }
            _write_json(node.launch_file, record)

    def _adopt(self, node: LocalNode) -> bool:
        """Record a launch whose own record was lost: a worker killed between starting the runner and
        writing launch.json. Launching again would run the node twice; the runner is adopted instead
        (or, if it has already ended, its log and exit code stand for it)."""
        pid = runner_of(node.path)
        if pid is None and not (node.path / "output.log").exists():
            return False  # nothing was started: launch
        started = process_start_time(pid) if pid is not None else None
        record = {
            "pid": pid or 0,
            "start_time": started if started is not None else -1,  # -1: never alive
            "port": None,
            "node": node.name,
            "launched_at": time.time(),
            "adopted": True,
        }
        _write_json(node.launch_file, record)
        return True

    def status(self, job_id: str, attempt: int, spec: JobSpec) -> AttemptReading:
        nodes = self.nodes(job_id, attempt, spec)
        if all(node.launched() is None for node in nodes):
            return AttemptReading(
                AttemptPhase.missing, cause=Cause(CauseClass.unknown, "no launch record for this attempt on this host")
            )
        failures: list[tuple[LocalNode, Cause]] = []
        running = 0
        for node in nodes:
            code = node.exit_code()
            if code is not None:
                phase, cause = node_outcome(node, code)
                if phase == AttemptPhase.failed and cause is not None:
                    failures.append((node, cause))
            elif node.alive():
                running += 1
            elif node.launched() is None:
                running += 1  # not launched yet: a launch in progress
            else:
                text = f"node {node.name} lost: its agent disappeared without an exit code (host restart or killed)"
                failures.append((node, Cause(CauseClass.node, text, {"node": node.name})))
        if failures:
            # The first blamed node (lost, unhealthy) over one whose launcher merely gave up after a peer failed.
            blamed = [f for f in failures if f[1].cause_class in (CauseClass.node, CauseClass.verdict)]
            node, cause = (blamed or failures)[0]
            failed_nodes = tuple(n.name for n, c in failures if c.cause_class == CauseClass.node)
            return AttemptReading(AttemptPhase.failed, cause=cause, failed_nodes=failed_nodes)
        if running:
            return AttemptReading(AttemptPhase.running)
        return AttemptReading(AttemptPhase.succeeded)

    def stop(self, job_id: str, attempt: int, spec: JobSpec) -> bool:
        """Ask the attempt to stop and return at once: True once none of its processes is left.

        The first call sends every node's processes SIGCONT (a stopped, hung rank cannot handle SIGTERM), then
        SIGTERM (each agent stops its launcher and ranks, then flushes its last reports), and records in the
        attempt's `stop.json` when, and which processes (pid and start time, so a recycled pid is never hit). A
        call TERMINATE_GRACE_S after that kills what is left, and one KILLED_WAIT_S later goes on without what
        even that left. The record is on disk, so any worker makes the next call."""
        stop_file = self.attempt_dir(job_id, attempt) / "stop.json"
        try:
            record = json.loads(stop_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            record = self._terminate(job_id, attempt, spec)
            if not record["groups"]:
                return True
            _write_json(stop_file, record)
        left = [(pgid, alive) for pgid, members in record["groups"] if (alive := _still_running(members))]
        if not left:
            return True
        waited = time.time() - record["requested_at"]
        if waited >= TERMINATE_GRACE_S + KILLED_WAIT_S:
            pids = ", ".join(str(pid) for _, alive in left for pid in alive)
            log.warning(
                "job %s attempt %d: process(es) %s outlived SIGKILL; going on without them", job_id, attempt, pids
            )
            return True
        if waited >= TERMINATE_GRACE_S:
            for pgid, alive in left:
                leader_alive = any(pid == pgid for pid in alive)  # else its group id may be another's by now
                self._signal_group(pgid if leader_alive else None, alive, signal.SIGKILL)
        return False

    def cancel(self, job_id: str, attempt: int, spec: JobSpec) -> None:
        """Stop the attempt and wait until nothing of it is left (at most TERMINATE_GRACE_S and a kill)."""
        while not self.stop(job_id, attempt, spec):
            time.sleep(0.1)

    def _terminate(self, job_id: str, attempt: int, spec: JobSpec) -> dict[str, object]:
        """SIGTERM every live node's process group; what was signalled, as `stop.json` records it."""
        groups: list[tuple[int, list[tuple[int, int]]]] = []
        for node in self.nodes(job_id, attempt, spec):
            record = node.launched()
            if record is None or not node.alive():
                continue
            pgid = int(record["pid"])  # type: ignore[call-overload]
            members = [(pid, started) for pid in (pgid, *descendants(pgid)) if (started := process_start_time(pid))]
            groups.append((pgid, members))
        for pgid, members in groups:
            pids = [pid for pid, _ in members]
            self._signal_group(pgid, pids, signal.SIGCONT)
            self._signal_group(pgid, pids, signal.SIGTERM)
        return {"requested_at": time.time(), "groups": groups}

    def delete_job_resources(self, job_id: str, spec: JobSpec) -> None:
        """Nothing outlives an attempt here but its logs and state, kept on disk for reading."""
        for attempt_dir in sorted((self.runs_dir / job_id).glob("a*")):
            self.cancel(job_id, int(attempt_dir.name[1:]), spec)

    @staticmethod
    def _signal_group(pgid: int | None, members: list[int], sig: signal.Signals) -> None:
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        for pid in members:  # launchers may start their own sessions; reach every descendant
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def _still_running(members: list[list[int]]) -> list[int]:
    """The pids among `members` ([pid, start time] pairs) that are still those processes."""
    return [pid for pid, started in members if process_start_time(pid) == started]
