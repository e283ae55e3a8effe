"""Fixtures for the trainer: a stand-in control plane over real HTTP, and real ft_launcher jobs.

`Receiver` is a threaded HTTP server that speaks the trainer's half of the
contract (`POST /v1/jobs/{id}/events`, `POST /v1/jobs/{id}/heartbeats`): it
checks the bearer token, stores events once per idempotency key, records every
heartbeat, hands out fault directives in heartbeat replies, and can be taken
down and brought back on the same port to play an outage.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FT_LAUNCHER = shutil.which("ft_launcher", path=str(BIN)) or "ft_launcher"
TOKEN = "test-token-7f3a9c"  # what the receiver expects; tests check it never shows up in logs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Receiver:
    """A stand-in control plane for one job."""

    job_id: str
    token: str = TOKEN
    port: int = field(default_factory=free_port)
    events: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> event, first copy kept
    event_order: list[str] = field(default_factory=list)  # keys in arrival order
    duplicates: int = 0
    heartbeats: list[dict[str, Any]] = field(default_factory=list)  # with "received" (monotonic)
    requests: list[tuple[str, int]] = field(default_factory=list)  # (path, status answered)
    faults: list[dict[str, Any]] = field(default_factory=list)  # directives returned in heartbeat replies
    fail_with: list[int] = field(default_factory=list)  # statuses to answer next, one per request
    retry_after: str | None = None
    lose_replies: int = 0  # store the next N event batches, then answer 503 as if the reply was lost
    delay_s: float = 0.0  # answer slowly
    lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
                with receiver.lock:
                    receiver.requests.append((self.path, status))

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                with receiver.lock:
                    injected = receiver.fail_with.pop(0) if receiver.fail_with else None
                if injected is not None:
                    headers = {"Retry-After": receiver.retry_after} if receiver.retry_after else None
                    return self._answer(injected, {"detail": "injected by the test"}, headers)
                if self.headers.get("Authorization") != f"Bearer {receiver.token}":
                    return self._answer(401, {"detail": "bad token"})
                prefix = f"/v1/jobs/{receiver.job_id}/"
                if not self.path.startswith(prefix):
                    return self._answer(404, {"detail": "no such job"})
                what = self.path[len(prefix) :]
                if what == "events":
                    events = body.get("events") or []
                    if not 1 <= len(events) <= 1000:
                        return self._answer(422, {"detail": "1..1000 events"})
                    stored = dupes = 0
                    with receiver.lock:
                        for event in events:
                            if event["key"] in receiver.events:
                                dupes += 1
                                receiver.duplicates += 1
                            else:
                                receiver.events[event["key"]] = dict(event, received=time.monotonic())
                                receiver.event_order.append(event["key"])
                                stored += 1
                    with receiver.lock:
                        lose = receiver.lose_replies > 0
                        receiver.lose_replies -= 1 if lose else 0
                    if lose:
                        return self._answer(503, {"detail": "stored, but the reply is lost"})
                    return self._answer(200, {"stored": stored, "duplicates": dupes})
                if what == "heartbeats":
                    beats = body.get("heartbeats") or []
                    with receiver.lock:
                        now = time.monotonic()
                        receiver.heartbeats.extend(dict(b, attempt=body.get("attempt"), received=now) for b in beats)
                        faults = list(receiver.faults)
                    return self._answer(200, {"accepted": len(beats), "faults": faults})
                return self._answer(404, {"detail": "no such route"})

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self._server = server
        threading.Thread(target=server.serve_forever, name="receiver", daemon=True).start()
        return self

    def stop(self) -> None:
        """Take the control plane down: connections are refused until `start()`."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # --- queries ---

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        with self.lock:
            return [self.events[k] for k in self.event_order if self.events[k]["type"] == type_]

    def types(self) -> list[str]:
        with self.lock:
            return [self.events[k]["type"] for k in self.event_order]

    def max_step(self, rank: int | None = None) -> int:
        with self.lock:
            steps = [b["step"] for b in self.heartbeats if rank is None or b["rank"] == rank]
        return max(steps, default=-1)


@pytest.fixture
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    r = Receiver(job_id=f"job-{request.node.name[:40]}".replace("[", "-").replace("]", "")).start()
    yield r
    r.stop()


def trainer_env(
    receiver: Receiver | None, checkpoint_dir: Path | None, *, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment a control-plane backend gives the trainer."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FTPLANE_", "TORCHELASTIC_", "MASTER_"))}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            "PYTHONWARNINGS": "ignore",
            "OMP_NUM_THREADS": "1",
            "FTPLANE_ATTEMPT": "0",
            "FTPLANE_CHECKPOINT_ENGINE": "sync",
            "FTPLANE_CHECKPOINT_INTERVAL": "5",
            "FTPLANE_CHECKPOINT_KEEP": "2",
            "FTPLANE_INPROCESS": "0",
            "FTPLANE_FAULTS": "[]",
        }
    )
    if receiver is not None:
        env.update({"FTPLANE_URL": receiver.url, "FTPLANE_JOB_ID": receiver.job_id, "FTPLANE_TOKEN": receiver.token})
    if checkpoint_dir is not None:
        env["FTPLANE_CHECKPOINT_DIR"] = str(checkpoint_dir)
    env.update(extra or {})
    return env


def launcher_command(
    trainer_args: list[str],
    *,
    nproc: int = 2,
    max_restarts: int = 2,
    initial_heartbeat_timeout: float = 60,
    heartbeat_timeout: float = 30,
) -> list[str]:
    """The ft_launcher command line of the local backend (flags as in workers/backends/base.py)."""
    return [
        FT_LAUNCHER,
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "--rdzv-id=test",
        f"--max-restarts={max_restarts}",
        f"--ft-initial-rank-heartbeat-timeout={initial_heartbeat_timeout}",
        f"--ft-rank-heartbeat-timeout={heartbeat_timeout}",
        "--ft-restart-policy=any-failed",
        "--monitor-interval=1",
        "--workers-stop-timeout=5",
        "--no-python",  # the trainer command is a full command line, as the backends run it
        sys.executable,
        "-m",
        "trainer",
        *trainer_args,
    ]


@dataclass
class Job:
    process: subprocess.Popen
    log_path: Path

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"job still running after {timeout} s; log tail:\n{self.tail()}") from None

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-n:])


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """Start a command in its own process group, output to a log file; killed at teardown."""
    jobs: list[Job] = []

    def start(command: list[str], env: dict[str, str], name: str = "job") -> Job:
        log_path = tmp_path / f"{name}-{len(jobs)}.log"
        log_file = open(log_path, "wb")  # noqa: SIM115 - owned by the child
        process = subprocess.Popen(
            command, env=env, cwd=tmp_path, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        log_file.close()
        job = Job(process, log_path)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.kill()
