"""The control plane under test, started as an operator would: `ftplane serve --only api|worker|beat` on a fresh
PostgreSQL database with Redis as the broker (a queue name of its own: the Redis may be shared), supervising every
`supervise_interval_s`, at a lower CPU priority than the simulated nodes (`control_plane_nice`): on the real cluster
every agent has its host to itself, while here the simulator shares two cores with the control plane, and a simulator
starved of CPU runs its event loop late, so that the agents' own connect and read timeouts expire on its side and the
retries they send are the simulator's making, not the control plane's. PostgreSQL (a managed database on its own host
in the EKS deployment) keeps the machine's default priority too. Also: the CPU groups to meter, the same-run baseline
(GET /healthz on the same API), and each supervision duty's task durations as the Celery worker logs them."""

from __future__ import annotations

import contextlib
import functools
import re
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil
from sqlalchemy.engine import make_url

from bench.common import ROOT, CpuMeter, create_admin_token, free_port, fresh_database, postgres_processes, server_env
from bench.load import Load, LoadResult, run_load
from bench.scale.params import Params
from bench.scale.truth import launched_command
from ftplane.devserver import cancel_running_jobs, wait_until_ready
from workers.celery_app import DUTY_TASKS

LOCAL_RUNNER = "workers.backends.local_runner"


@dataclass
class ControlPlane:
    url: str
    admin: str
    database: str
    workdir: Path
    parts: dict[str, subprocess.Popen[bytes]]

    def tree(self, part: str) -> list[psutil.Process]:
        """The part's processes; the worker's without the jobs it launched (the `pods` group)."""
        try:
            root = psutil.Process(self.parts[part].pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        if part != "worker":
            return processes
        pods = {p.pid for p in self.pods()}
        return [p for p in processes if p.pid not in pods]

    def niceness(self) -> dict[str, int]:
        """Each part's CPU niceness, as the kernel has it."""
        return {part: psutil.Process(process.pid).nice() for part, process in self.parts.items()}

    def pods(self) -> list[psutil.Process]:
        """What the local backend launched: its runners, the real node agents, ft_launcher and the waiting ranks."""
        out: list[psutil.Process] = []
        try:
            children = psutil.Process(self.parts["worker"].pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return out
        for process in children:
            with contextlib.suppress(psutil.Error):
                if LOCAL_RUNNER in " ".join(process.cmdline()):
                    out += [process, *process.children(recursive=True)]
        return out

    def meter(self, extra: dict[str, Callable[[], Sequence[psutil.Process]]] | None = None) -> CpuMeter:
        groups: dict[str, Callable[[], Sequence[psutil.Process]]] = {
            part: functools.partial(self.tree, part) for part in self.parts
        }
        groups["pods"] = self.pods
        groups["postgres"] = lambda: postgres_processes(self.database)
        return CpuMeter({**groups, **(extra or {})})

    def healthz_baseline(
        self, seconds: float, connections: int = 16, rate_per_s: float = 0.0, spread: bool = False
    ) -> tuple[LoadResult, dict[str, float]]:
        """GET /healthz on the same API, metered as the run is: the same-run baseline, back to back (0) or paced at
        `rate_per_s`; `spread`, paced over `connections` each idle between its requests (bench/load.py)."""
        load = Load(
            self.url,
            "/healthz",
            self.admin,
            [b""],
            connections,
            seconds,
            10**9,
            method="GET",
            rate_per_s=rate_per_s,
            spread=spread,
        )
        return run_load(load, self.meter())

    def duty_durations(self) -> dict[str, list[tuple[datetime, float]]]:
        return duty_durations(self.workdir / "worker.log")


class Window:
    """A measured window: CPU by group (the meter's groups include the simulator's processes, as "simulator")."""

    def __init__(self, meter: CpuMeter) -> None:
        self.meter = meter
        self.started = 0.0
        self.started_wall = 0.0
        self.elapsed = 0.0
        self.cpu: dict[str, float] = {}
        self.simulator_cpu = 0.0

    def begin(self) -> None:
        self.meter.start()
        self.started = time.monotonic()
        self.started_wall = time.time()

    def end(self) -> None:
        self.elapsed = max(time.monotonic() - self.started, 1e-9)
        self.cpu = self.meter.stop()
        self.simulator_cpu = self.cpu["simulator"]


def job_spec(p: Params, workdir: Path, name: str, marks: Path) -> dict[str, object]:
    """What the control plane launches for one simulated job: a local-backend job of one node whose one real rank
    notes its start and waits for the end (the local backend runs at most 8 nodes, all on this host). Its report
    interval is set to the product's default for the simulated size, so the real node agent reports as the
    simulated ones do; the timeouts are the spec's floor for that interval unless given."""
    return {
        "name": name,
        "backend": "local",
        "command": launched_command(marks, workdir / "training-done"),
        "procs_per_node": 1,
        "checkpoint": {
            "dir": str(workdir / "checkpoints"),
            "interval_steps": p.checkpoint_interval_steps,
            "engine": "async",
        },
        "progress": {"report_interval_s": p.report_interval_s},
        "resiliency": {
            "max_in_job_restarts": 10_000,
            "max_job_restarts": 100,
            "initial_heartbeat_timeout_s": max(120.0, p.heartbeat_timeout_s),
            "heartbeat_timeout_s": p.heartbeat_timeout_s,
        },
        "labels": {"bench": "scale", "simulated-ranks": str(p.ranks)},
    }


@contextlib.contextmanager
def control_plane(p: Params, workdir: Path, database_url: str | None, redis_url: str) -> Iterator[ControlPlane]:
    with fresh_database(database_url, prefix="ftplane_scale") as db:
        admin = create_admin_token(db)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = server_env(
            db,
            workdir / ".ftplane",
            FTPLANE_HOST="127.0.0.1",
            FTPLANE_PORT=str(port),
            FTPLANE_PUBLIC_URL=url,
            FTPLANE_REDIS_URL=redis_url,
            FTPLANE_QUEUE=f"ftplane-scale-{uuid.uuid4().hex[:8]}",
            FTPLANE_SUPERVISE_INTERVAL_S=str(p.supervise_interval_s),
        )
        parts: dict[str, subprocess.Popen[bytes]] = {}
        logs = {part: (workdir / f"{part}.log").open("wb") for part in ("api", "worker", "beat")}
        try:
            for part in ("api", "worker", "beat"):
                command = ["nice", "-n", str(p.control_plane_nice), sys.executable, "-m", "ftplane.cli", "serve"]
                command += ["--only", part]
                if part == "api":
                    command += ["--workers", str(p.api_workers)]
                cwd = workdir if part == "beat" else ROOT  # beat keeps its schedule file in its directory
                parts[part] = subprocess.Popen(command, env=env, cwd=cwd, stdout=logs[part], stderr=subprocess.STDOUT)
            wait_until_ready(url, parts["api"], workdir / "api.log", 90, "ftplane serve --only api")
            yield ControlPlane(url, admin, make_url(db).database or "", workdir, parts)
        finally:
            if parts.get("api") is not None and parts["api"].poll() is None:
                cancel_running_jobs(url, admin, timeout=60)  # local jobs outlive their worker on purpose
            for proc in reversed(parts.values()):
                proc.terminate()
            for proc in reversed(parts.values()):
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            for log in logs.values():
                log.close()


# Celery's worker log (--loglevel=INFO, which `ftplane serve --only worker` passes):
# "[2026-12-03 10:00:00,123: INFO/MainProcess] Task ftplane.detect_silent_ranks[<id>] succeeded in 0.0123s: 1"
TASK_DONE = re.compile(
    r"^\[(?P<at>[\d-]+ [\d:,]+): \w+/\w+\] Task (?P<task>[\w.]+)\[[^\]]+\] succeeded in (?P<s>[\d.]+)s"
)


def duty_durations(log: Path) -> dict[str, list[tuple[datetime, float]]]:
    """Each supervision duty's task runs: (when it finished, seconds), from the worker's own log."""
    out: dict[str, list[tuple[datetime, float]]] = defaultdict(list)
    if not log.exists():
        return out
    for line in log.read_text(errors="replace").splitlines():
        match = TASK_DONE.match(line)
        if match and match["task"] in DUTY_TASKS:
            at = datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f")
            out[match["task"].removeprefix("ftplane.")].append((at, float(match["s"])))
    return out
