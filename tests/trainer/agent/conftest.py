"""A real node agent, starting real ft_launcher, reporting to the real API on a real port."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ftplane.trainer.agent.processes import descendants
from tests.support.live_api import serve_in_thread
from tests.support.ports import free_port

BIN = Path(sys.executable).parent
FT_LAUNCHER = shutil.which("ft_launcher", path=str(BIN)) or "ft_launcher"

# A training script with no ftplane code: prints its progress, exits as told.
PLAIN = """
import os, sys, time
rank = int(os.environ["RANK"])
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
steps = int(os.environ.get("STEPS", "40"))
for step in range(1, steps + 1):
    time.sleep(float(os.environ.get("STEP_S", "0.1")))
    print(f"step {step} loss {1.0 / step:.3f}", flush=True)
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """SQLite only: what is under test here is the agent (the report route runs on PostgreSQL in tests/api)."""
    return f"sqlite:///{tmp_path / 'ftplane.db'}"


@pytest.fixture
def live(app: Any) -> Iterator[str]:
    with serve_in_thread(app) as url:
        yield url


@dataclass
class AgentRun:
    process: subprocess.Popen[bytes]
    job_id: str
    run_dir: Path
    log: Path

    def wait(self, timeout: float = 120) -> int:
        return self.process.wait(timeout=timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace") + (self.run_dir / "launcher.log").read_text(errors="replace")


def launcher_command(tmp_path: Path, *, nproc: int = 2, max_restarts: int = 1, script: str = PLAIN) -> list[str]:
    path = tmp_path / "plain.py"
    path.write_text(script)
    port = free_port()
    return [
        FT_LAUNCHER,
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--monitor-interval=1",
        "--ft-initial-rank-heartbeat-timeout=60",
        "--ft-rank-heartbeat-timeout=60",
        "--tee=3",
        "--no-python",
        sys.executable,
        str(path),
    ]


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., AgentRun]]:
    runs: list[AgentRun] = []

    def start(url: str | None, job: dict[str, Any] | None, command: list[str], **env: str) -> AgentRun:
        run_dir = tmp_path / f"agent{len(runs)}"
        log = tmp_path / f"agent{len(runs)}.log"
        environ = {k: v for k, v in os.environ.items() if not k.startswith("FTPLANE_")}
        environ.update(
            {
                "FTPLANE_AGENT_DIR": str(run_dir),
                "FTPLANE_NODE_NAME": "node-a",
                "FTPLANE_REPORT_INTERVAL_S": "0.5",
                "PATH": f"{BIN}{os.pathsep}{environ.get('PATH', '')}",
            }
        )
        if url and job:
            environ.update(
                {"FTPLANE_URL": url, "FTPLANE_JOB_ID": job["id"], "FTPLANE_ATTEMPT": "0", "FTPLANE_TOKEN": job["token"]}
            )
        environ.update(env)
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "ftplane.trainer.agent", "--", *command],
                env=environ,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        run = AgentRun(process, job["id"] if job else "", run_dir, log)
        runs.append(run)
        return run

    yield start
    for run in runs:
        if run.process.poll() is None:
            tree = descendants(run.process.pid)  # ft_launcher starts each rank in a session of its own
            os.killpg(run.process.pid, 9)
            for pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            run.process.wait(timeout=30)


def submitted_job(admin: TestClient, make_job: Callable[..., dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A job the API accepted, marked launched (as the launch duty would) without launching anything."""
    from api import models
    from api.core.db import session_scope
    from api.services import lifecycle

    job = make_job(**spec)
    with session_scope() as session:
        row = models.jobs.get(session, job["id"], for_update=True)
        assert row is not None
        lifecycle.attempt_launched(session, row, lifecycle.current_attempt(session, row))
    return job


def events(admin: TestClient, job_id: str, type_: str | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"limit": 1000}
    if type_:
        params["type"] = type_
    return list(admin.get(f"/v1/jobs/{job_id}/events", params=params).json()["items"])
