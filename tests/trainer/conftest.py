"""Fixtures for the trainer: a stand-in control plane over real HTTP, and real jobs: the node agent
(`python -m ftplane.trainer.agent -- <ft_launcher command>`) starting real ft_launcher and the trainer.

`Receiver` is a threaded HTTP server that speaks the node's half of the contract: the node
agent's batched `POST /v1/jobs/{id}/reports` (the node's liveness, the ranks' heartbeats and
events; the reply carries fault directives), and the per-kind `POST .../events` and
`POST .../heartbeats`. It checks the bearer token, stores events once per idempotency key,
records every heartbeat, and can be taken down and brought back on the same port to play an
outage.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO
from tests.support.ports import free_port

BIN = Path(sys.executable).parent
FT_LAUNCHER = shutil.which("ft_launcher", path=str(BIN)) or "ft_launcher"
TOKEN = "test-token-7f3a9c"  # what the receiver expects; tests check it never shows up in logs


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
    reports: list[dict[str, Any]] = field(default_factory=list)  # node reports' `agent` part, with "node"
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
                with receiver.lock:  # recorded before the reply leaves: a client that has its answer finds it here
                    receiver.requests.append((self.path, status))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

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
                    stored, dupes = receiver.store_events(events)
                    if receiver.lose_reply():
                        return self._answer(503, {"detail": "stored, but the reply is lost"})
                    return self._answer(200, {"stored": stored, "duplicates": dupes})
                if what == "heartbeats":
                    beats = body.get("heartbeats") or []
                    receiver.store_heartbeats(beats, body.get("attempt"))
                    return self._answer(200, {"accepted": len(beats), "faults": receiver.faults_for(beats)})
                if what == "reports":
                    events, beats = body.get("events") or [], body.get("heartbeats") or []
                    stored, dupes = receiver.store_events(events)
                    receiver.store_heartbeats(beats, body.get("attempt"))
                    with receiver.lock:
                        receiver.reports.append(dict(body.get("agent") or {}, node=body.get("node")))
                    if events and receiver.lose_reply():
                        return self._answer(503, {"detail": "stored, but the reply is lost"})
                    reply = {"stored": stored, "duplicates": dupes, "accepted": len(beats), "faults": receiver.faults}
                    return self._answer(200, reply)
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

    # --- storing, as the control plane would ---

    def store_events(self, events: list[dict[str, Any]]) -> tuple[int, int]:
        """Store each event once per key (the first copy wins); returns (stored, duplicates)."""
        stored = dupes = 0
        with self.lock:
            for event in events:
                if event["key"] in self.events:
                    dupes += 1
                    self.duplicates += 1
                else:
                    self.events[event["key"]] = dict(event, received=time.monotonic())
                    self.event_order.append(event["key"])
                    stored += 1
        return stored, dupes

    def store_heartbeats(self, beats: list[dict[str, Any]], attempt: int | None) -> None:
        with self.lock:
            now = time.monotonic()
            self.heartbeats.extend(dict(b, attempt=attempt, received=now) for b in beats)

    def faults_for(self, beats: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The directives for the ranks that reported (asked again in every reply until the test drops them)."""
        ranks = {b.get("rank") for b in beats}
        with self.lock:
            return [f for f in self.faults if f.get("rank") in ranks]

    def lose_reply(self) -> bool:
        with self.lock:
            lose = self.lose_replies > 0
            self.lose_replies -= 1 if lose else 0
        return lose

    # --- queries ---

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        with self.lock:
            return [self.events[k] for k in self.event_order if self.events[k]["type"] == type_]

    def ranks_running(self) -> list[dict[str, Any]]:
        """The ranks' own `running` (not the node agent's), one per rank: a node's agent folds its ranks' `running` of
        one run into one event (`details.ranks`, each rank's process in `details.processes`)."""
        return [r for e in self.of_type("running") if e["details"].get("source") != "agent" for r in per_rank(e)]

    def types(self) -> list[str]:
        with self.lock:
            return [self.events[k]["type"] for k in self.event_order]

    def max_step(self, rank: int | None = None) -> int:
        with self.lock:
            steps = [b["step"] for b in self.heartbeats if rank is None or b["rank"] == rank]
        return max(steps, default=-1)


def per_rank(running: dict[str, Any]) -> list[dict[str, Any]]:
    """A `running` the agent folded, as its ranks' own: each with its rank and its process's details."""
    details = running["details"]
    if "ranks" not in details:
        return [running]
    processes = {p["rank"]: p for p in details.get("processes", [])}
    return [{**running, "rank": rank, "details": {**details, **processes.get(rank, {})}} for rank in details["ranks"]]


@pytest.fixture
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    r = Receiver(job_id=f"job-{request.node.name[:40]}".replace("[", "-").replace("]", "")).start()
    yield r
    r.stop()


NODE = "node-a"


def trainer_env(
    receiver: Receiver | None, checkpoint_dir: Path | None, *, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment a backend gives the node agent (which passes it on to the ranks, all but the
    token, adding its socket). Without a receiver: no control plane, the SDK's reports are no-ops."""
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
        env.update(
            {
                "FTPLANE_URL": receiver.url,
                "FTPLANE_JOB_ID": receiver.job_id,
                "FTPLANE_TOKEN": receiver.token,
                "FTPLANE_NODE_NAME": NODE,
                "FTPLANE_REPORT_INTERVAL_S": "0.5",
            }
        )
    if checkpoint_dir is not None:
        env["FTPLANE_CHECKPOINT_DIR"] = str(checkpoint_dir)
    env.update(extra or {})
    return env


def under_agent(command: list[str]) -> list[str]:
    """`command` started and supervised by a node agent, as every backend runs a node."""
    return [sys.executable, "-m", "ftplane.trainer.agent", "--", *command]


def launcher_command(
    trainer_args: list[str],
    *,
    program: list[str] | None = None,
    nproc: int = 2,
    max_restarts: int = 2,
    initial_heartbeat_timeout: float = 60,
    heartbeat_timeout: float = 30,
) -> list[str]:
    """The ft_launcher command line of the local backend (flags as in workers/backends/base.py), running
    `program` (default: the built-in trainer) with `trainer_args` on every rank."""
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
        "--tee=3",  # the node agent reads each rank's lines and the launcher's own from its output
        "--workers-stop-timeout=5",
        "--no-python",  # the trainer command is a full command line, as the backends run it
        *(program or [sys.executable, "-m", "ftplane.trainer"]),
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
    """Start a command under a node agent, in its own process group, output (the agent's log and the
    launcher's output, which it copies) to a log file; killed at teardown."""
    jobs: list[Job] = []
    agent_dirs: list[str] = []

    def start(command: list[str], env: dict[str, str], name: str = "job") -> Job:
        log_path = tmp_path / f"{name}-{len(jobs)}.log"
        agent_dirs.append(tempfile.mkdtemp(prefix="ftplane-agent-"))  # short: socket paths have a limit
        env = {**env, "FTPLANE_AGENT_DIR": agent_dirs[-1], "FTPLANE_AGENT_ECHO": "1"}
        log_file = open(log_path, "wb")  # noqa: SIM115 - owned by the child
        process = subprocess.Popen(
            under_agent(command),
            env=env,
            cwd=tmp_path,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log_file.close()
        job = Job(process, log_path)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.kill()
    for directory in agent_dirs:
        shutil.rmtree(directory, ignore_errors=True)
