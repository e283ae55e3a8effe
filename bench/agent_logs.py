"""The node agent's cost while a rank prints 10,000 lines a second, and whether it slows the rank.

    python -m bench.agent_logs [--seconds 30] [--warmup 5] [--rate 10000] [--line-bytes 100]

One rank under real ft_launcher (NVRx on CPU, `--tee=3`, as the backends start it) prints `--rate` lines a
second of `--line-bytes` characters, paced by its own clock (a batch every 10 ms, each line its own `print`),
and counts what it printed. Two runs in one invocation:

- baseline: ft_launcher alone, its output to /dev/null: what the rank's printing costs without the agent;
- agent: the node agent (`python -m ftplane.trainer.agent`) starting the same launcher: it reads every
  line, redacts it, keeps it in the rank's file (default 64 MiB bound), and gives back ft_launcher's own
  copy as its tee reads it. It reports to no control plane (no FTPLANE_URL): `bench.agent` measures the
  reporting; this measures the logs.

From /proc, over `--seconds` after `--warmup`: each process's CPU (of one core) and the agent's peak RSS.
From the rank's own count: the lines it printed per second (the agent must not slow it). From the agent's
kept file: the last line's sequence number, against what the rank printed (none lost), and its files' size.
From ft_launcher's own copy of the rank's output: its disk use against its length (given back or not).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import free_port, machine, ratio, table
from ftplane import contract
from ftplane.trainer.agent.processes import rank_processes

RANK = """
import json, os, sys, time
rate, line_bytes, seconds, out = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
filler = "x" * max(0, line_bytes - 24)
batch = max(1, rate // 100)
open(out + ".started", "w").close()
start = time.monotonic()
printed = 0
while True:
    elapsed = time.monotonic() - start
    if elapsed >= seconds:
        break
    for _ in range(batch):
        print(f"line {printed:>12} {filler}")
        printed += 1
    ahead = printed / rate - (time.monotonic() - start)
    if ahead > 0:
        time.sleep(ahead)
elapsed = time.monotonic() - start
with open(out, "w") as f:
    json.dump({"printed": printed, "elapsed": elapsed}, f)
"""


def launcher_command(workdir: Path, args: argparse.Namespace, duration: float) -> list[str]:
    script = workdir / "rank.py"
    script.write_text(RANK)
    return [
        str(Path(sys.executable).parent / "ft_launcher"),
        "--nnodes=1",
        "--nproc-per-node=1",
        "--max-restarts=0",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "--monitor-interval=1",
        "--ft-initial-rank-heartbeat-timeout=600",
        "--ft-rank-heartbeat-timeout=600",
        "--tee=3",
        f"--log-dir={workdir / 'launcher-copies'}",
        "--no-python",
        sys.executable,
        str(script),
        str(args.rate),
        str(args.line_bytes),
        str(duration),
        str(workdir / "rank.json"),
    ]


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def run(workdir: Path, args: argparse.Namespace, *, with_agent: bool) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    duration = args.warmup + args.seconds + 2
    command = launcher_command(workdir, args, duration)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTPLANE_")}
    env.update(PYTHONUNBUFFERED="1", PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    if with_agent:
        env.update(FTPLANE_AGENT_DIR=str(workdir / "agent"), FTPLANE_NODE_NAME="bench-node")
        command = [sys.executable, "-m", "ftplane.trainer.agent", "--", *command]
    out = (workdir / "output.log").open("wb") if with_agent else subprocess.DEVNULL
    top = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    started = workdir / "rank.json.started"
    deadline = time.monotonic() + 120
    while not started.exists():
        if time.monotonic() > deadline or top.poll() is not None:
            raise RuntimeError(f"the rank did not start ({'agent' if with_agent else 'baseline'} run)")
        time.sleep(0.05)
    time.sleep(args.warmup)
    agent = psutil.Process(top.pid) if with_agent else None
    launcher = psutil.Process(top.pid).children()[0] if with_agent else psutil.Process(top.pid)
    rank = psutil.Process(rank_processes(launcher.pid)[0].pid)
    watched = {"launcher": launcher, "rank": rank, **({"agent": agent} if agent else {})}
    before = {name: cpu_s(p) for name, p in watched.items()}
    began, peak = time.monotonic(), 0
    while time.monotonic() - began < args.seconds:
        if agent is not None:
            peak = max(peak, agent.memory_info().rss)
        time.sleep(0.5)
    spent = time.monotonic() - began
    cores = {name: (cpu_s(p) - before[name]) / spent for name, p in watched.items()}
    top.wait(timeout=duration + 60)
    printed = json.loads((workdir / "rank.json").read_text())
    result = {"cores": cores, "peak_mb": peak / 2**20, "rate": printed["printed"] / printed["elapsed"]}
    result["printed"] = printed["printed"]
    (copy,) = (workdir / "launcher-copies").rglob("0/stdout.log")
    result["copy_bytes"], result["copy_disk"] = copy.stat().st_size, copy.stat().st_blocks * 512
    if with_agent:
        kept = workdir / "agent" / contract.LOG_DIR / contract.rank_log_name(0)
        last = contract.read_log_record(kept.read_text().splitlines()[-1])
        result["kept"] = (last["seq"] + 1) if last else 0
        result["kept_bytes"] = sum(p.stat().st_size for p in kept.parent.iterdir())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measuring window")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of printing before measuring")
    parser.add_argument("--rate", type=int, default=10_000, help="lines a second the rank prints")
    parser.add_argument("--line-bytes", type=int, default=100)
    args = parser.parse_args(argv)
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="ftplane-bench-agent-logs-") as tmp:
        base = run(Path(tmp) / "baseline", args, with_agent=False)
        agent = run(Path(tmp) / "agent", args, with_agent=True)
    print(f"\n## one rank printing {args.rate} lines/s of {args.line_bytes} bytes, {args.seconds:g} s measured")
    b, a = base["cores"], agent["cores"]
    rows = [
        ["rank lines/s (own count)", f"{base['rate']:.0f}", f"{agent['rate']:.0f}", ratio(agent["rate"], base["rate"])],
        ["rank CPU", pct(b["rank"]), pct(a["rank"]), ratio(a["rank"], b["rank"])],
        ["ft_launcher CPU", pct(b["launcher"]), pct(a["launcher"]), "—"],
        ["node agent CPU", "—", pct(a["agent"]), "—"],
        ["node agent peak RSS", "—", f"{agent['peak_mb']:.1f} MB", "—"],
        ["lines taken in (last one's number) / printed", "—", f"{agent['kept']} / {agent['printed']}", "—"],
        ["agent's kept files on disk (bound 64 MiB)", "—", f"{agent['kept_bytes'] / 2**20:.1f} MiB", "—"],
        ["ft_launcher's copy: on disk / its length", copy(base), copy(agent), "—"],
    ]  # fmt: skip
    print(table(["", "baseline: ft_launcher alone", "with the node agent", "ratio"], rows))
    return 0


def copy(result: dict[str, Any]) -> str:
    return f"{result['copy_disk'] / 2**20:.1f} / {result['copy_bytes'] / 2**20:.1f} MiB"


def pct(cores: float) -> str:
    return f"{cores * 100:.1f} %"


if __name__ == "__main__":
    sys.exit(main())
