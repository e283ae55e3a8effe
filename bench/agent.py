"""The node agent's own cost, and how fast a rank's crash reaches the control plane with its cause.

    python -m bench.agent [--seconds 60] [--ranks 8] [--kills 5]

`overhead`: one agent (`python -m ftplane.trainer.agent`) whose "launcher" starts `--ranks` rank processes;
each rank is a real SDK user (`ftplane.trainer.sdk`: `run.step()` ten times a second, heartbeats to the
agent every 0.5 s), and the agent reports every second to the real API (uvicorn, PostgreSQL). Once every
rank has reported and a `--warmup` has passed, the benchmark reads the agent process's own CPU time and
resident memory from /proc over `--seconds` (its children, the ranks, are not counted). Baseline, same
run: an idle Python interpreter (what any Python process costs before it does anything).

`crash`: one agent starting real ft_launcher (NVRx on CPU, gloo) with 2 ranks of a plain script.
`--kills` times, the benchmark SIGKILLs rank 1 itself and takes three times from its own clock: the
kill, the moment the launcher's output says it restarts the worker group (the benchmark tails the
agent's copy of that output), and the moment `GET /v1/jobs/{id}/events` first lists the new
`injob_restart` (polled every 20 ms). Goal: the event within 2 s of the group restart.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.common import (
    create_admin_token,
    free_port,
    fresh_database,
    machine,
    percentile,
    ratio,
    table,
    uvicorn_api,
)
from ftplane.trainer.agent.processes import descendants, rank_processes

RANK_SCRIPT = """
import os, time
from ftplane import sdk
run = sdk.init(total_steps=10**9)
run.start(0)
step = 0
while True:
    time.sleep(0.1)
    step += 1
    run.step(step, loss=1.0 / step, tokens=4096)
"""

LAUNCHER_SCRIPT = """
import os, subprocess, sys
ranks = int(sys.argv[1])
children = [
    subprocess.Popen([sys.executable, "-c", sys.argv[2]], env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r)})
    for r in range(ranks)
]
for child in children:
    child.wait()
"""

PLAIN = """
import os, time
for step in range(1, 10**6):
    time.sleep(0.05)
    if step % 20 == 0:
        print(f"step {step}", flush=True)
"""


def make_job(url: str, admin: str, nodes: int = 1, procs: int = 2) -> dict[str, Any]:
    spec = {"name": "bench-agent", "command": ["true"], "nodes": nodes, "procs_per_node": procs}
    response = httpx.post(f"{url}/v1/jobs", json=spec, headers={"Authorization": f"Bearer {admin}"}, timeout=10)
    response.raise_for_status()
    job = dict(response.json())
    return job


def start_agent(url: str, job: dict[str, Any], command: list[str], workdir: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTPLANE_")}
    env.update(
        {
            "FTPLANE_URL": url,
            "FTPLANE_JOB_ID": job["id"],
            "FTPLANE_ATTEMPT": "0",
            "FTPLANE_TOKEN": job["token"],
            "FTPLANE_NODE_NAME": "bench-node",
            "FTPLANE_AGENT_DIR": str(workdir / "agent"),
            "FTPLANE_REPORT_INTERVAL_S": "1.0",
            "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        }
    )
    workdir.mkdir(parents=True, exist_ok=True)
    log = (workdir / "agent.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "ftplane.trainer.agent", "--", *command],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    """The agent and everything under it (ft_launcher starts each rank in a session of its own)."""
    tree = descendants(process.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def measure(process: psutil.Process, seconds: float) -> tuple[float, float]:
    """(cores used on average, peak RSS in MB) of `process` alone over `seconds`."""
    start_cpu, start = cpu_s(process), time.monotonic()
    peak = 0
    while time.monotonic() - start < seconds:
        peak = max(peak, process.memory_info().rss)
        time.sleep(0.5)
    used = cpu_s(process) - start_cpu
    return used / (time.monotonic() - start), peak / 2**20


def overhead(url: str, admin: str, workdir: Path, *, ranks: int, seconds: float, warmup: float) -> list[list[Any]]:
    job = make_job(url, admin, procs=ranks)
    agent = start_agent(url, job, [sys.executable, "-c", LAUNCHER_SCRIPT, str(ranks), RANK_SCRIPT], workdir)
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    headers = {"Authorization": f"Bearer {admin}"}

    def every_rank_reported() -> bool:
        assert agent.poll() is None, (workdir / "agent.log").read_text()[-2000:]
        return len(httpx.get(f"{url}/v1/jobs/{job['id']}/ranks", headers=headers).json()) == ranks

    try:
        # The ranks start at the machine's pace; the warmup counts from when all of them report.
        _wait(every_rank_reported, poll=0.5)
        time.sleep(warmup)
        agent_cores, agent_mb = measure(psutil.Process(agent.pid), seconds)
        idle_cores, idle_mb = measure(psutil.Process(idle.pid), min(seconds, 10))
    finally:
        stop(agent)
        idle.kill()
        idle.wait()
    return [
        [f"agent, {ranks} ranks reporting", f"{agent_cores * 100:.2f} %", f"{agent_mb:.1f} MB"],
        ["idle Python interpreter (baseline)", f"{idle_cores * 100:.2f} %", f"{idle_mb:.1f} MB"],
        ["ratio", "—", ratio(agent_mb, idle_mb)],
    ]


def launcher(workdir: Path, kills: int) -> list[str]:
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "plain.py"
    script.write_text(textwrap.dedent(PLAIN))
    return [
        str(Path(sys.executable).parent / "ft_launcher"),
        "--nnodes=1",
        "--nproc-per-node=2",
        f"--max-restarts={kills + 1}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "--monitor-interval=1",
        "--ft-initial-rank-heartbeat-timeout=300",
        "--ft-rank-heartbeat-timeout=300",
        "--tee=3",
        "--no-python",
        sys.executable,
        str(script),
    ]


def crash(url: str, admin: str, workdir: Path, *, kills: int) -> list[list[Any]]:
    job = make_job(url, admin)
    agent = start_agent(url, job, launcher(workdir, kills), workdir)
    output = workdir / "agent" / "launcher.log"
    headers = {"Authorization": f"Bearer {admin}"}
    rows: list[list[Any]] = []
    to_restart: list[float] = []
    to_event: list[float] = []
    try:
        for n in range(1, kills + 1):
            victim = _wait_for_rank(agent.pid, 1, exclude=[r[0] for r in rows])
            time.sleep(3)  # a rank that has been training a while (the agent has seen it)
            restarts_before = output.read_text(errors="replace").count("will restart worker group")
            killed_at = time.time()
            os.kill(victim, signal.SIGKILL)
            restarted_at = _wait(functools.partial(_restarts_logged, output, restarts_before + 1), poll=0.01)
            seen_at = _wait(functools.partial(_restarts_stored, url, job["id"], headers, n), poll=0.02)
            events = _injob_restarts(url, job["id"], headers)
            cause = events[-1]["details"]["cause"]
            to_restart.append(restarted_at - killed_at)
            to_event.append(seen_at - restarted_at)
            rows.append([victim, f"{restarted_at - killed_at:.2f} s", f"{seen_at - restarted_at:.2f} s", cause])
    finally:
        stop(agent)
    summary = [
        ["median", f"{percentile(to_restart, 50):.2f} s", f"{percentile(to_event, 50):.2f} s", ""],
        ["max", f"{max(to_restart):.2f} s", f"{max(to_event):.2f} s", ""],
    ]
    return rows + summary


def _restarts_logged(output: Path, at_least: int) -> bool:
    return output.read_text(errors="replace").count("will restart worker group") >= at_least


def _injob_restarts(url: str, job_id: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/v1/jobs/{job_id}/events", params={"type": "injob_restart"}, headers=headers)
    return list(response.json()["items"])


def _restarts_stored(url: str, job_id: str, headers: dict[str, str], at_least: int) -> bool:
    return len(_injob_restarts(url, job_id, headers)) >= at_least


def _wait_for_rank(agent_pid: int, rank: int, exclude: list[int], timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(agent_pid).children():
            for process in rank_processes(child.pid):
                if process.rank == rank and process.pid not in exclude:
                    return process.pid
        time.sleep(0.05)
    raise TimeoutError(f"rank {rank} did not start")


def _wait(condition: Any, poll: float, timeout: float = 120) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return time.time()
        time.sleep(poll)
    raise TimeoutError("condition not met")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="overhead: measuring window")
    parser.add_argument(
        "--warmup", type=float, default=10.0, help="overhead: seconds from every rank reported to measuring"
    )
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--kills", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="ftplane-bench-agent-") as tmp, fresh_database() as database:
        workdir = Path(tmp)
        admin = create_admin_token(database)
        with uvicorn_api(database, workdir / "api") as api:
            print(f"\n## overhead: one agent, {args.ranks} SDK ranks, {args.seconds:g} s after {args.warmup:g} s")
            rows = overhead(
                api.url, admin, workdir / "overhead", ranks=args.ranks, seconds=args.seconds, warmup=args.warmup
            )
            print(table(["process", "CPU (of one core)", "peak RSS"], rows))
            print(f"\n## crash: rank 1 SIGKILLed {args.kills} times under ft_launcher (2 ranks)")
            rows = crash(api.url, admin, workdir / "crash", kills=args.kills)
            print(table(["pid killed", "kill → group restart", "group restart → injob_restart", "cause"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
