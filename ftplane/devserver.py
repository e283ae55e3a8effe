"""Run a complete `ftplane serve` (API + worker + beat, embedded defaults) as a child process.

Used by `make demo`, the end-to-end tests and the benchmarks: the real thing, in a
directory of its own, torn down on exit.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port(preferred: int | None = None) -> int:
    for port in (preferred, 0):
        if port is None:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise RuntimeError("no free port")


@dataclass(frozen=True)
class RunningServer:
    url: str
    token: str
    workdir: Path
    log: Path
    env: dict[str, str]


def wait_until_ready(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float, what: str) -> None:
    """Poll /readyz until it answers 200; fail early with the log's tail if the process dies."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not ready in {timeout:.0f} s; see {log}")
        time.sleep(0.2)


def cancel_running_jobs(url: str, token: str, timeout: float = 30) -> None:
    """Local jobs outlive their worker on purpose (it re-adopts them); a throwaway server ends them."""
    headers = {"Authorization": f"Bearer {token}"}
    active = ["PENDING", "SUBMITTED", "RUNNING", "RECOVERING"]
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=10) as api:
            for job in api.get("/v1/jobs", params={"status": active, "limit": 500}).json()["items"]:
                api.post(f"/v1/jobs/{job['id']}/cancel")
            deadline = time.monotonic() + timeout
            while api.get("/v1/jobs", params={"status": active, "limit": 1}).json()["items"]:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.3)
    except (httpx.HTTPError, KeyError, ValueError):
        pass  # best effort: the server is going away anyway


@contextmanager
def ftplane_server(
    workdir: Path, *, port: int | None = None, ready_timeout: float = 90, log: Path | None = None, **extra_env: str
) -> Iterator[RunningServer]:
    """Serve from `workdir` (state in workdir/.ftplane unless FTPLANE_DATA_DIR is given)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port(port)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTPLANE_")}
    env.update(
        PYTHONPATH=str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        FTPLANE_PORT=str(port),
        FTPLANE_URL=f"http://127.0.0.1:{port}",
        # Every supervision pass is a Celery message per duty: at 0.5 s an idle server spent 18 % of a core on
        # them, at 1 s 11 % (2 s, the product's default: 7 %).
        FTPLANE_SUPERVISE_INTERVAL_S="1",
        FTPLANE_FLEET_INTERVAL_S="2",
        COLUMNS="200",
    )
    env.update(extra_env)  # a caller may override the defaults above (e.g. the supervision period)
    data_dir = Path(env.get("FTPLANE_DATA_DIR", workdir / ".ftplane"))
    if not data_dir.is_absolute():
        data_dir = workdir / data_dir
    log_path = log or workdir / "serve.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log_file:
        server = subprocess.Popen(
            [sys.executable, "-P", "-m", "ftplane.cli", "serve"],
            env=env,
            cwd=workdir,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until_ready(env["FTPLANE_URL"], server, log_path, ready_timeout, "ftplane serve")
        token = (data_dir / "admin-token").read_text().strip()
        env["FTPLANE_TOKEN"] = token
        yield RunningServer(url=env["FTPLANE_URL"], token=token, workdir=workdir, log=log_path, env=env)
    finally:
        if server.poll() is None and "FTPLANE_TOKEN" in env:
            cancel_running_jobs(env["FTPLANE_URL"], env["FTPLANE_TOKEN"])
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
