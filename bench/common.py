"""Shared benchmark helpers: a fresh PostgreSQL database, the API under uvicorn, CPU meters, percentiles and
tables (the load generator: bench/load.py).

Everything runs on loopback. Nothing here is part of `make test`.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from ftplane.devserver import wait_until_ready

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


# ---- the machine ---------------------------------------------------------------------------------


def machine() -> str:
    """What the figures were measured on, in words (no host names)."""
    gpu = "GPU" if Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") else "no GPU"
    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{os.cpu_count()} cores, {memory:.0f} GB RAM, {gpu}; {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---- PostgreSQL ----------------------------------------------------------------------------------


def base_database_url() -> str:
    return os.environ.get("FTPLANE_BENCH_DATABASE_URL") or os.environ.get("FTPLANE_TEST_DATABASE_URL") or DEFAULT_PG


@contextlib.contextmanager
def fresh_database(base: str | None = None, prefix: str = "ftplane_bench") -> Iterator[str]:
    """A new, empty PostgreSQL database (dropped afterwards), with the schema migrated to head."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from api.core.db import upgrade_to_head

    url = make_url(base or base_database_url())
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    target = url.set(database=name).render_as_string(hide_password=False)
    try:
        upgrade_to_head(url=target)
        yield target
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextlib.contextmanager
def sqlite_database(directory: Path) -> Iterator[str]:
    """A SQLite database file in `directory`, with the schema migrated to head."""
    from api.core.db import upgrade_to_head

    url = f"sqlite:///{directory / 'ftplane.db'}"
    upgrade_to_head(url=url)
    yield url


def database_of_kind(kind: str, base: str | None, directory: Path) -> contextlib.AbstractContextManager[str]:
    """A fresh database for a benchmark: PostgreSQL (`kind` "postgresql") or SQLite in `directory`."""
    return fresh_database(base) if kind == "postgresql" else sqlite_database(directory)


def running_job(name: str, nodes: int, procs_per_node: int, **spec: Any) -> tuple[str, Any]:
    """A job of the current database as a user submits it (kubernetes, never launched here), moved to RUNNING by
    the lifecycle: its id and its `JobSpec`."""
    from api.core.db import session_scope
    from api.models import jobs as job_store
    from api.schemas.spec import JobSpec
    from api.services import lifecycle

    validated = JobSpec.model_validate(
        {
            "name": name,
            "backend": "kubernetes",
            "image": "registry.example/trainer:bench",
            "command": ["python", "-m", "ftplane.trainer"],
            "nodes": nodes,
            "procs_per_node": procs_per_node,
            "checkpoint": {"engine": "none"},
            **spec,
        }
    )
    with session_scope() as session:
        job = job_store.create(session, validated)
        attempt = lifecycle.current_attempt(session, job)
        lifecycle.attempt_launched(session, job, attempt)
        lifecycle.attempt_running(attempt)
        lifecycle.transition(session, job, lifecycle.JobStatus.RUNNING)
        job_id = job.id
    return job_id, validated


def create_admin_token(database_url: str) -> str:
    from sqlalchemy.orm import Session

    from api.core.db import make_engine
    from api.models import tokens

    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            _, token = tokens.create_admin(session, "benchmark")
            session.commit()
    finally:
        engine.dispose()
    return token


# ---- the API under uvicorn -----------------------------------------------------------------------


@dataclass
class ApiServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def processes(self) -> list[psutil.Process]:
        """The uvicorn supervisor and its worker processes."""
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


def server_env(database_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTPLANE_")}
    env.update(
        PYTHONPATH=str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        FTPLANE_DATABASE_URL=database_url,
        FTPLANE_DATA_DIR=str(data_dir),
        FTPLANE_LOG_LEVEL="WARNING",
        **extra,
    )
    return env


@contextlib.contextmanager
def uvicorn_api(
    database_url: str,
    workdir: Path,
    *,
    workers: int = 1,
    ready_timeout: float = 180,
    env: Mapping[str, str] | None = None,
) -> Iterator[ApiServer]:
    """`uvicorn api.main:create_served_app` (the API as `ftplane serve` runs it, alone: no Celery worker, no beat) on
    a free loopback port. `ready_timeout` bounds a start that never ends, not a slow one: importing the API takes 4 s
    on an idle two-core machine, and a start took over 60 s in the test suite's ingest smoke while the suite's four
    workers and their end-to-end jobs shared its two cores."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    environment = server_env(database_url, workdir / ".ftplane", **(env or {}))
    log_path = workdir / "uvicorn.log"
    command = [sys.executable, "-m", "uvicorn", "api.main:create_served_app", "--factory", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--workers", str(workers), "--no-access-log", "--log-level", "warning"]
    command += ["--timeout-keep-alive", "75"]  # as ftplane serve: node agents keep their connection
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=environment, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, process, log_path, ready_timeout, "uvicorn")
        # every worker answers: a few more requests so each has imported and connected
        for _ in range(4 * workers):
            httpx.get(f"{url}/healthz", timeout=5)
        yield ApiServer(url, process, log_path)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


# ---- CPU -----------------------------------------------------------------------------------------


def postgres_processes(database: str | None = None) -> list[psutil.Process]:
    """The server's own processes (checkpointer, WAL writer, ...) and the backends serving `database`
    (all backends when None): PostgreSQL here may also serve other people's work."""
    out = []
    for p in psutil.process_iter(["name", "cmdline"]):
        name = p.info.get("name") or ""
        title = " ".join(p.info.get("cmdline") or [])
        if not (name.startswith("postgres") or title.startswith("postgres:")):
            continue
        backend = title.startswith("postgres: ") and "(" in title  # "postgres: 15/main: user db 127.0.0.1(port) ..."
        if database is None or not backend or f" {database} " in title:
            out.append(p)
    return out


class CpuMeter:
    """CPU time used by groups of processes over an interval, in cores (1.0 = one core busy).

    Each group is a function returning its processes, asked again at start (PostgreSQL forks a
    backend per connection). `machine` is every process on the host; `other` is the machine minus the
    groups and `extra` (what the caller measured itself, e.g. the load generator): other people's load.
    """

    def __init__(self, groups: Mapping[str, Callable[[], Sequence[psutil.Process]]]):
        self.groups = groups
        self.started = 0.0
        self.procs: dict[str, list[psutil.Process]] = {}
        self.before: dict[str, dict[int, float]] = {}
        self.machine_before = 0.0

    @staticmethod
    def _cpu(procs: Sequence[psutil.Process]) -> dict[int, float]:
        out = {}
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
        return out

    def start(self) -> None:
        self.procs = {name: list(fn()) for name, fn in self.groups.items()}
        self.before = {name: self._cpu(procs) for name, procs in self.procs.items()}
        self.machine_before = _busy_seconds()
        self.started = time.monotonic()

    def stop(self, extra: float = 0.0) -> dict[str, float]:
        elapsed = max(1e-9, time.monotonic() - self.started)
        out = {}
        for name, fn in self.groups.items():
            seen = {p.pid: p for p in [*self.procs[name], *fn()]}  # processes started meanwhile count from 0
            now = self._cpu(list(seen.values()))
            out[name] = sum(t - self.before[name].get(pid, 0.0) for pid, t in now.items()) / elapsed
        out["machine"] = (_busy_seconds() - self.machine_before) / elapsed
        out["other"] = max(0.0, out["machine"] - sum(out[n] for n in self.groups) - extra)
        return out


class CpuSteps:
    """Cores used by each of a meter's groups in each step of wall clock (`step_s`, steps aligned on its multiples),
    sampled by a thread until `stop`: where the load moved between the groups within a run. A process that ended
    within a step loses that step's share (its last reading is gone with it)."""

    def __init__(self, groups: Mapping[str, Callable[[], Sequence[psutil.Process]]], step_s: float) -> None:
        self.groups = groups
        self.step_s = step_s
        self.steps: dict[int, dict[str, float]] = {}  # step's start (s of wall clock) -> group -> cores
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-steps", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def _sample(self) -> dict[str, dict[int, float]]:
        return {name: CpuMeter._cpu(list(fn())) for name, fn in self.groups.items()}

    def _run(self) -> None:
        before, since = self._sample(), time.time()
        while True:
            stopped = self._stopped.wait(self.step_s - time.time() % self.step_s)
            now, at = self._sample(), time.time()
            # a sample on time ends its step; the last one, at `stop`, ends part of the step it began in
            index = math.floor(since / self.step_s) if stopped else round(at / self.step_s) - 1
            self.steps[int(index * self.step_s)] = {
                name: sum(t - before[name].get(pid, 0.0) for pid, t in now[name].items()) / max(at - since, 1e-9)
                for name in self.groups
            }
            if stopped:
                return
            before, since = now, at


def _busy_seconds() -> float:
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


# ---- numbers -------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "-" if math.isnan(v) else (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}")
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def ratio(value: float, baseline: float) -> str:
    if not baseline or math.isnan(value) or math.isnan(baseline):
        return "-"
    return f"{value / baseline:.1f}×"
