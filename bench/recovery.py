"""Recovery benchmark: fault → first good step, for each rung of the recovery ladder.

A real `ftplane serve` (embedded defaults) runs the tiny trainer on 2 CPU ranks under real
ft_launcher. For each rung, one job takes N faults in a row through the control plane's
fault API, and the benchmark measures, per fault:

  detect   fault_injected → the restart event of that rung (or hang_detected for hangs)
  resume   fault_injected → the trainer's `running` event (training loop re-entered)
  recovery fault_injected → the first step completed after training resumed (rank 0's
           per-step metrics file written by the trainer: wall-clock time of each step)

Rungs: `inprocess` (exception, NVRx in-process restart), `injob` (SIGKILL of a rank,
ft_launcher restarts the workers), `hang` (SIGSTOP of a rank, detected by heartbeat
timeout, then restarted in-job), `job` (SIGKILL with no in-job budget: the control plane
starts a new attempt). Usage: `python -m bench.recovery [--faults 5] [--rungs inprocess,injob,hang,job]`.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ftplane.client import Client
from ftplane.devserver import ftplane_server
from tests.support.waiting import wait_for

SEED_FIGURES = {"inprocess": 10.0, "injob": 17.0}  # the seed article: in-process ~10 s, ft_launcher 17 s per fault
# ft_launcher's hang detection; an in-process restart sends no heartbeats while it runs, so that rung needs
# a timeout longer than the restart itself.
HEARTBEAT_TIMEOUT_S = 5.0


@dataclass
class Rung:
    name: str
    kind: str
    restart_event: str
    resiliency: dict[str, Any]
    rank: int = 1


RUNGS = {
    "inprocess": Rung(
        "inprocess",
        "exception",
        "inprocess_restart",
        {
            "inprocess": {"enabled": True, "soft_timeout_s": 20, "hard_timeout_s": 30, "max_iterations": 20},
            "heartbeat_timeout_s": 60,
        },
    ),
    "injob": Rung("injob", "crash", "injob_restart", {"max_in_job_restarts": 20}),
    "hang": Rung("hang", "hang", "injob_restart", {"max_in_job_restarts": 20}, rank=0),
    "job": Rung("job", "crash", "job_restart", {"max_in_job_restarts": 0, "max_job_restarts": 20}),
}


@dataclass
class Measurement:
    rung: str
    detect_s: float
    resume_s: float
    recovery_s: float


def wait(what: str, condition: Callable[[], Any], timeout: float = 180) -> Any:
    return wait_for(what, condition, timeout, interval=0.2)


def ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["ts"]).timestamp()


def steps_after(metrics: Path, t: float) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    return [m for m in lines if m["t"] > t]


def run_rung(api: Client, workdir: Path, rung: Rung, faults: int) -> list[Measurement]:
    metrics = workdir / rung.name / "metrics-{rank}.jsonl"
    steps = 40 + faults * 30
    spec = {
        "name": f"bench-{rung.name}",
        "command": [
            "python",
            "-m",
            "trainer",
            "--model",
            "tiny",
            "--batch-size",
            "4",
            "--steps",
            str(steps),
            "--step-delay-s",
            "0.1",
            "--metrics-file",
            str(metrics),
        ],
        "procs_per_node": 2,
        "env": {"OMP_NUM_THREADS": "1"},
        "checkpoint": {"dir": str(workdir / rung.name / "ckpt"), "interval_steps": 5, "engine": "async"},
        "resiliency": {
            "initial_heartbeat_timeout_s": 120,
            "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
            **rung.resiliency,
        },
    }
    job = api.submit(spec)
    job_id = job["id"]
    rank0 = Path(str(metrics).replace("{rank}", "0"))

    def events(type_: str, after: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        found = [e for e in api.all_events(job_id) if e["type"] == type_]
        return [e for e in found if after is None or e["id"] > after["id"]]

    def step() -> int:
        return max((r["step"] for r in api.ranks(job_id)), default=0)

    def injected(fault_id: str) -> list[dict[str, Any]]:
        return [e for e in events("fault_injected") if e["details"].get("fault_id") == fault_id]

    results: list[Measurement] = []
    passed = 8
    for i in range(faults):
        # Each fault comes after the job got past the previous one (else ftplane rightly calls it stuck).
        def past(at: int = passed) -> bool:
            return step() >= at and len(steps_after(rank0, time.time() - 1.5)) >= 3

        wait("progress", past)
        passed = step() + 8
        wait("a checkpoint", lambda: events("checkpoint_saved"))
        body: dict[str, Any] = {"kind": rung.kind, "rank": rung.rank}
        body.update({"at_step": step() + 2} if rung.kind == "exception" else {"now": True})
        fault_id = api.inject(job_id, body)["id"]
        fault = wait("fault_injected", functools.partial(injected, fault_id))[0]
        t0 = ts(fault)
        restart = wait(rung.restart_event, functools.partial(events, rung.restart_event, fault))[0]
        running = wait("running", functools.partial(events, "running", fault))[0]
        # Steps rank 0 completes before the failure reaches it are not recovery: count from the resume.
        first = wait("a step after the resume", functools.partial(steps_after, rank0, ts(running)))[0]
        detected = restart
        if rung.name == "hang":
            detected = wait("hang_detected", functools.partial(events, "hang_detected", fault))[0]
        results.append(Measurement(rung.name, ts(detected) - t0, ts(running) - t0, first["t"] - t0))
        m = results[-1]
        print(
            f"  {rung.name} fault {i + 1}/{faults}: detect {m.detect_s:.2f} s, "
            f"training resumed {m.resume_s:.2f} s, first good step {m.recovery_s:.2f} s",
            flush=True,
        )
    api.cancel(job_id)
    return results


def summarize(results: dict[str, list[Measurement]]) -> str:
    baseline = statistics.median(m.recovery_s for m in results["injob"]) if results.get("injob") else None
    lines = [
        "| rung | faults | detect median (s) | training resumed median (s) | first good step median (s) | min–max (s) "
        "| vs in-job | seed figure |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, items in results.items():
        rec = [m.recovery_s for m in items]
        median = statistics.median(rec)
        ratio = f"{median / baseline:.2f}×" if baseline else "-"
        seed = f"{SEED_FIGURES[name]:.0f} s" if name in SEED_FIGURES else "-"
        lines.append(
            f"| {name} | {len(items)} | {statistics.median(m.detect_s for m in items):.2f} "
            f"| {statistics.median(m.resume_s for m in items):.2f} | {median:.2f} | {min(rec):.2f}–{max(rec):.2f} "
            f"| {ratio} | {seed} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=5)
    parser.add_argument("--rungs", default="inprocess,injob,hang,job")
    parser.add_argument("--json", type=Path, help="also write the raw measurements here")
    parser.add_argument("--workdir", type=Path, help="keep state and logs here (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftplane-bench-", ignore_cleanup_errors=True) as tmp:
        workdir = args.workdir or Path(tmp)
        with ftplane_server(workdir) as server:
            api = Client(url=server.url, token=server.token)
            results = {}
            for name in args.rungs.split(","):
                print(f"rung {name}: {args.faults} faults", flush=True)
                results[name] = run_rung(api, workdir, RUNGS[name], args.faults)
    print()
    print(
        f"machine: {platform.node()} {platform.machine()}, {__import__('os').cpu_count()} cores, CPU + gloo, "
        f"2 ranks, tiny model, heartbeat timeout {HEARTBEAT_TIMEOUT_S:g} s"
    )
    print(summarize(results))
    if args.json:
        args.json.write_text(json.dumps({k: [vars(m) for m in v] for k, v in results.items()}, indent=2))


if __name__ == "__main__":
    main()
