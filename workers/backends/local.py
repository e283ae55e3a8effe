"""The local backend: each attempt is an `ft_launcher` process tree on this machine (CPU + gloo).

State lives on disk under `FTPLANE_LOCAL_RUNS_DIR/<job>/a<attempt>/`: `launch.json`
(runner pid, start time, command), `launcher.log`, the trainer token (mode 0600)
and `exit_code`, written by the runner when the launcher ends. A worker that
restarts reads it back, so running jobs are re-adopted, not lost.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from api.core.config import get_settings
from api.schemas.causes import Cause, CauseClass, describe_exit, signal_name
from api.schemas.spec import JobSpec
from api.services import lifecycle
from workers.backends.base import (
    AttemptPhase,
    AttemptStatus,
    FaultNotSupported,
    FaultRequest,
    LaunchRequest,
    ObservedEvent,
    launcher_arguments,
    trainer_environment,
)

RANK_EXIT = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
FINAL_FAILURE = re.compile(r"ProcessFailure\(local_rank=(\d+), pid=(\d+), exitcode=(-?\d+)")
# A rank monitor's log line when ft_launcher is about to kill its rank for silence; the monitor names the
# rank it serves (on one host, the local backend's only kind, the global rank is the local rank).
HEARTBEAT_TIMEOUT = re.compile(
    r"\[RankMonServer\d+@[^\]:]*:(\d+)\] Did not get (?:initial|subsequent) heartbeat\. Waited ([\d.]+) seconds"
)
GROUP_RESTART = re.compile(r"Worker group (\w+)\. (\d+)/(\d+) attempts left; will restart worker group")
LOG_TAIL_BYTES = 64 * 1024
TERMINATE_GRACE_S = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class RankExit:
    local_rank: int
    pid: int
    exit_code: int
    silent_s: float | None = None  # set when ft_launcher killed the rank for no heartbeat in this long

    @property
    def cause(self) -> Cause:
        """Why this rank ended, as the launcher saw it: killed for silence (a hang), or its exit."""
        facts: dict[str, object] = {"rank": self.local_rank, "exit_code": self.exit_code, "pid": self.pid}
        if self.exit_code < 0:
            facts["signal"] = signal_name(-self.exit_code)
        if self.silent_s is not None:
            facts["silent_s"] = self.silent_s
            text = f"{describe_exit(self.exit_code)} (ft_launcher: no heartbeat for {self.silent_s:g} s)"
            return Cause(CauseClass.hang, text, facts)
        return Cause(CauseClass.crash, describe_exit(self.exit_code), facts)


def parse_launcher_log(log: str) -> list[list[RankExit]]:
    """The rank failures of each round of the worker group; a new round starts at each in-job restart."""
    boundaries = [m.end() for m in GROUP_RESTART.finditer(log)]
    rounds: list[list[RankExit]] = [[] for _ in range(len(boundaries) + 1)]
    found = [(m.start(), RankExit(int(m[2]), int(m[3]), int(m[1]))) for m in RANK_EXIT.finditer(log)]
    found += [(m.start(), RankExit(int(m[1]), int(m[2]), int(m[3]))) for m in FINAL_FAILURE.finditer(log)]
    silent: dict[tuple[int, int], float] = {}  # (round, rank) -> the heartbeat timeout that elapsed
    for m in HEARTBEAT_TIMEOUT.finditer(log):
        silent.setdefault((bisect.bisect_left(boundaries, m.start()), int(m[1])), float(m[2]))
    seen: set[int] = set()
    for position, failure in sorted(found, key=lambda item: item[0]):
        if failure.pid not in seen:
            seen.add(failure.pid)
            round_ = bisect.bisect_left(boundaries, position)
            timeout = silent.get((round_, failure.local_rank)) if failure.exit_code < 0 else None
            rounds[round_].append(replace(failure, silent_s=timeout))
    return rounds


def root_cause(failures: list[RankExit]) -> Cause | None:
    """A rank killed for silence, else one killed by a signal, is the root cause; ranks that then exit 1 on a
    broken collective, or are killed as the worker group is torn down, are collateral."""
    if not failures:
        return None
    silent = [f for f in failures if f.silent_s is not None]
    signalled = [f for f in failures if f.exit_code < 0]
    first = (silent or signalled or failures)[0]
    cause = first.cause
    return cause.with_message(f"rank {first.local_rank} {cause.message}")


GROUP_FAILED = Cause(CauseClass.unknown, "worker group failed")


@dataclass(frozen=True)
class LocalAttempt:
    """The on-disk record of one local attempt."""

    path: Path

    @property
    def launch_file(self) -> Path:
        return self.path / "launch.json"

    @property
    def log_file(self) -> Path:
        return self.path / "launcher.log"

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

    def log_tail(self) -> str:
        try:
            with open(self.log_file, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_text(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def process_start_time(pid: int) -> int | None:
    """Start time in clock ticks since boot: tells a live process from a recycled pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie has ended
        return None
    return int(fields[19])


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def runner_of(state_dir: Path) -> int | None:
    """The live `local_runner` process of this attempt directory, if there is one."""
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


def _write_record(run: LocalAttempt, record: Mapping[str, object]) -> None:
    tmp = run.path / "launch.json.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, run.launch_file)


class LocalBackend:
    name = "local"

    def __init__(self, runs_dir: Path | None = None) -> None:
        self.runs_dir = runs_dir or get_settings().resolved_runs_dir

    def attempt_dir(self, job_id: str, attempt: int) -> LocalAttempt:
        return LocalAttempt(self.runs_dir / job_id / f"a{attempt}")

    def command(self, request: LaunchRequest, port: int) -> list[str]:
        rdzv_id = f"{request.job_id[:12]}-a{request.attempt}"
        return launcher_arguments(request.spec, nnodes=1, rdzv_endpoint=f"127.0.0.1:{port}", rdzv_id=rdzv_id)

    def render(self, request: LaunchRequest) -> str:
        env = trainer_environment(request)
        env["FTPLANE_TOKEN"] = "<job token>"
        lines = [f"# job {request.job_id} attempt {request.attempt}: one ft_launcher process tree on this host"]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
        lines.append(shlex.join(self.command(request, port=29500)))
        return "\n".join(lines) + "\n"

    def launch(self, request: LaunchRequest) -> None:
        run = self.attempt_dir(request.job_id, request.attempt)
        if run.launched() is not None or self._adopt(run):
            return
        run.path.mkdir(parents=True, exist_ok=True)
        port = free_port()
        command = self.command(request, port)
        bin_dir = str(Path(sys.executable).parent)
        launcher = shutil.which("ft_launcher", path=bin_dir + os.pathsep + os.environ.get("PATH", ""))
        if launcher is None:
            raise RuntimeError("ft_launcher not found: install ftplane with the [trainer] extra")
        command[0] = launcher
        env = dict(os.environ)
        env.update(trainer_environment(request))
        env.update(
            {
                "FTPLANE_TOKEN": request.token,
                "FTPLANE_MASTER_ADDR": "127.0.0.1",
                "PATH": bin_dir + os.pathsep + env.get("PATH", ""),
                "PYTHONUNBUFFERED": "1",
            }
        )
        if request.spec.checkpoint.dir:
            Path(request.spec.checkpoint.dir).mkdir(parents=True, exist_ok=True)
        runner = [sys.executable, "-m", "workers.backends.local_runner", str(run.path), "--", *command]
        process = subprocess.Popen(
            runner,
            env=env,
            cwd=os.getcwd(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: it outlives the worker and dies as one on cancel
        )
        record = {
            "pid": process.pid,
            "start_time": process_start_time(process.pid),
            "port": port,
            "command": command,
            "launched_at": time.time(),
        }
        _write_record(run, record)

    def _adopt(self, run: LocalAttempt) -> bool:
        """Record a launch whose own record was lost: a worker killed between starting the runner and
        writing launch.json. Launching again would run the attempt twice; the runner is adopted instead
        (or, if it has already ended, its log and exit code stand for it)."""
        pid = runner_of(run.path)
        if pid is None and not run.log_file.exists():
            return False  # nothing was started: launch
        started = process_start_time(pid) if pid is not None else None
        record = {
            "pid": pid or 0,
            "start_time": started if started is not None else -1,  # -1: never alive
            "port": None,
            "command": None,
            "launched_at": time.time(),
            "adopted": True,
        }
        _write_record(run, record)
        return True

    def _alive(self, record: dict[str, object]) -> bool:
        pid = int(record["pid"])  # type: ignore[call-overload]
        started = process_start_time(pid)
        return started is not None and started == record.get("start_time")

    def status(self, job_id: str, attempt: int, spec: JobSpec) -> AttemptStatus:
        run = self.attempt_dir(job_id, attempt)
        record = run.launched()
        if record is None:
            return AttemptStatus(
                AttemptPhase.missing, cause=Cause(CauseClass.unknown, "no launch record for this attempt on this host")
            )
        rounds = parse_launcher_log(run.log_text())
        node = socket.gethostname()
        events = [
            ObservedEvent(
                key=f"local:a{attempt}:pid{f.pid}:exit",
                type="rank_failed",
                rank=f.local_rank,
                node=node,
                details={**f.cause.details(), "source": "launcher"},
            )
            for failures in rounds
            for f in failures
        ]
        restarts = len(rounds) - 1
        causes = tuple(root_cause(r) or GROUP_FAILED for r in rounds[:-1])
        last_cause = next((root_cause(r) for r in reversed(rounds) if r), None)
        code = run.exit_code()
        if code is not None:
            if code == 0:
                return AttemptStatus(
                    AttemptPhase.succeeded, in_job_restarts=restarts, restart_causes=causes, events=events
                )
            text = f"ft_launcher exited with {describe_exit(code)}"
            cause = Cause(CauseClass.crash, text, {"exit_code": code})
            if last_cause:
                budget = lifecycle.budgets(spec).in_job
                text += f" after rank failure ({last_cause.message}); in-job restart budget ({budget}) spent"
                cause = last_cause.with_message(text)
            return AttemptStatus(
                AttemptPhase.failed, cause=cause, in_job_restarts=restarts, restart_causes=causes, events=events
            )
        if self._alive(record):
            return AttemptStatus(
                AttemptPhase.running, cause=last_cause, in_job_restarts=restarts, restart_causes=causes, events=events
            )
        return AttemptStatus(
            AttemptPhase.failed,
            cause=Cause(
                CauseClass.node, "the launcher process disappeared without an exit code (host restart or killed)"
            ),
            in_job_restarts=restarts,
            restart_causes=causes,
            events=events,
        )

    def rank_pids(self, job_id: str, attempt: int, rank: int) -> list[int]:
        """Worker processes of `rank` (not their own children, such as checkpoint writers)."""
        record = self.attempt_dir(job_id, attempt).launched()
        if record is None or not self._alive(record):
            return []
        tree = descendants(int(record["pid"]))  # type: ignore[call-overload]
        with_rank = {pid for pid in tree if environ_of(pid).get("RANK") == str(rank)}
        return sorted(pid for pid in with_rank if parent_of(pid) not in with_rank)

    def inject_fault(self, job_id: str, attempt: int, spec: JobSpec, fault: FaultRequest) -> None:
        signals = {"crash": signal.SIGKILL, "hang": signal.SIGSTOP}
        if fault.kind not in signals:
            raise FaultNotSupported(f"the local backend cannot inject {fault.kind!r} itself")
        pids = self.rank_pids(job_id, attempt, fault.rank)
        if not pids:
            raise RuntimeError(f"rank {fault.rank} of job {job_id} attempt {attempt} has no running process")
        for pid in pids:
            os.kill(pid, signals[fault.kind])

    def cancel(self, job_id: str, attempt: int, spec: JobSpec) -> None:
        run = self.attempt_dir(job_id, attempt)
        record = run.launched()
        if record is None or not self._alive(record):
            return
        pgid = int(record["pid"])  # type: ignore[call-overload]
        members = [pgid, *descendants(pgid)]
        self._signal_group(pgid, members, signal.SIGCONT)  # stopped (hung) ranks can't handle SIGTERM
        self._signal_group(pgid, members, signal.SIGTERM)
        deadline = time.monotonic() + TERMINATE_GRACE_S
        while time.monotonic() < deadline and any(process_start_time(p) for p in members):
            time.sleep(0.1)
        self._signal_group(pgid, members, signal.SIGKILL)

    def delete_job_resources(self, job_id: str, spec: JobSpec) -> None:
        """Nothing outlives an attempt here but its log and state, kept on disk for reading."""
        for attempt_dir in sorted((self.runs_dir / job_id).glob("a*")):
            self.cancel(job_id, int(attempt_dir.name[1:]), spec)

    @staticmethod
    def _signal_group(pgid: int, members: list[int], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        for pid in members:  # launchers may start their own sessions; reach every descendant
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
