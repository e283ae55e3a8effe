"""Scale benchmark: simulated 2,048-node x 8-GPU jobs (16,384 ranks each), every node reporting through the
product's own agent reporting code, against a real `ftplane serve` (API, Celery worker and beat) on PostgreSQL and
Redis. The method is in bench/README.md.

  one job (default)   the training story: faults at a published rate, time-compressed, with recoveries; ingest,
                      detection, events lost and the goodput API against the simulator's own ground truth
  --jobs N            N jobs of 2,048 ranks (256 nodes) at once, every node at the one big job's interval,
                      training steadily, each with one node partitioned for a while: what breaks first, and
                      whether a supervision pass over all of them fits in its period (--steady: the same for
                      one job)

Both measure a same-run baseline first: GET /healthz on the same API.

Usage: python -m bench.scale [--jobs 8] [--nodes N] [--sim-hours 3] [--seed 2026] [--json F] [--workdir D]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from api.schemas.spec import default_report_interval
from bench.common import ROOT, machine
from bench.scale.controlplane import control_plane
from bench.scale.jobs import run_jobs
from bench.scale.loop import run_loop
from bench.scale.one_job import baseline_figures, run_one_job
from bench.scale.params import Params
from bench.scale.report import jobs_report, one_job_report
from bench.scale.wire import TRANSPORTS

JOBS_NODES = 256  # --jobs N > 1: jobs of 2,048 ranks (8 GPUs a node) each


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    d = Params()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1, help="more than 1: that many jobs at once (steady)")
    parser.add_argument("--steady", action="store_true", help="the several-jobs scenario even for --jobs 1")
    parser.add_argument(
        "--nodes", type=int, help=f"nodes per job (default {d.nodes}; with --jobs N > 1: {JOBS_NODES}, 2,048 ranks)"
    )
    parser.add_argument(
        "--gpus-per-node",
        type=int,
        default=d.gpus_per_node,
        help="ranks per simulated node (past 16,384 nodes, the most a job may have, the size doubles by this)",
    )
    parser.add_argument(
        "--report-interval",
        type=float,
        default=0.0,
        help="0: the product's default for --nodes (with --jobs N > 1: for a 2,048-node job, the one-job run's)",
    )
    parser.add_argument("--heartbeat-timeout", type=float, default=0.0, help="0: the spec's floor (3 intervals)")
    parser.add_argument("--supervise-interval", type=float, default=d.supervise_interval_s)
    parser.add_argument("--api-workers", type=int, default=d.api_workers)
    parser.add_argument("--sim-hours", type=float, default=d.sim_hours)
    parser.add_argument("--compression", type=float, default=d.compression)
    parser.add_argument("--mttf-1024-h", type=float, default=d.mttf_1024_h)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--mix", default=",".join(f"{k}={w:g}" for k, w in d.mix), help="fault kinds and weights")
    parser.add_argument("--duration", type=float, default=d.duration_s, help="--jobs: seconds measured")
    parser.add_argument("--transport", choices=TRANSPORTS, default=d.transport, help="the nodes' transport (wire.py)")
    parser.add_argument(
        "--no-start-events",
        action="store_true",
        help="--jobs/--steady: no `running` event burst at the jobs' start (liveness and heartbeats only)",
    )
    parser.add_argument(
        "--simulator-processes",
        type=int,
        default=d.simulator_processes,
        help="more than 1: each job's simulated nodes dealt over that many processes (bench/scale/shards.py)",
    )
    parser.add_argument(
        "--control-plane-nice",
        type=int,
        default=d.control_plane_nice,
        help="the niceness of ftplane serve's processes (the simulator and PostgreSQL keep the default; 0: equal)",
    )
    parser.add_argument("--baseline", type=float, default=5.0, help="seconds of GET /healthz before the run")
    parser.add_argument("--database-url")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--workdir", type=Path, help="keep the logs and state here (default: a temporary directory)")
    return parser.parse_args(argv)


def params(args: argparse.Namespace) -> Params:
    several = args.jobs > 1
    nodes = args.nodes or (JOBS_NODES if several else Params.nodes)
    # Several jobs of 2,048 ranks report at the per-node interval of the one 16,384-rank job: the same load in all
    interval = args.report_interval or (default_report_interval(Params.nodes) if several else 0.0)
    return Params(
        nodes=nodes,
        gpus_per_node=args.gpus_per_node,
        jobs=args.jobs,
        report_interval_s=interval,
        heartbeat_timeout_s=args.heartbeat_timeout,
        supervise_interval_s=args.supervise_interval,
        api_workers=args.api_workers,
        compression=args.compression,
        sim_hours=args.sim_hours,
        mttf_1024_h=args.mttf_1024_h,
        seed=args.seed,
        mix=tuple((k, float(w)) for k, w in (item.split("=") for item in args.mix.split(","))),
        duration_s=args.duration,
        transport=args.transport,
        start_events=not args.no_start_events,
        simulator_processes=args.simulator_processes,
        control_plane_nice=args.control_plane_nice,
    )


def commit() -> str:
    """The commit measured: git's HEAD (and whether api/ or workers/ differ from it), or, in an exported snapshot
    of a commit, what FTPLANE_BENCH_COMMIT says."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        return os.environ.get("FTPLANE_BENCH_COMMIT", "unknown (not a git checkout)")
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "api", "workers"], cwd=ROOT, capture_output=True)
    return done.stdout.strip() + (" (api/ or workers/ modified)" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    p = params(args)
    steady = args.steady or p.jobs > 1
    print(f"machine: {machine()}; commit {commit()}")
    print(
        f"{p.jobs} job(s) of {p.nodes} nodes x {p.gpus_per_node} GPUs = {p.ranks} ranks; every node reports every "
        f"{p.report_interval_s:g} s (the product's default for {p.nodes} nodes unless set); heartbeat timeout "
        f"{p.heartbeat_timeout_s:g} s; supervision every {p.supervise_interval_s:g} s; the control plane at niceness "
        f"{p.control_plane_nice} (the simulator and PostgreSQL at the default)",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="ftplane-scale-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        with control_plane(p, workdir, args.database_url, args.redis_url) as cp:
            result, cpu = cp.healthz_baseline(args.baseline)
            baseline = baseline_figures(result, cpu)
            # per request, a server answering a few hundred a second pays wakeups that one at saturation shares
            rate = p.jobs * p.nodes / p.report_interval_s
            result, cpu = cp.healthz_baseline(args.baseline, rate_per_s=rate)
            baseline["paced"] = baseline_figures(result, cpu)
            # and one answering each on a connection idle since its last, as the nodes' reports come, pays that too
            result, cpu = cp.healthz_baseline(args.baseline, connections=p.jobs * p.nodes, rate_per_s=rate, spread=True)
            baseline["per_node"] = baseline_figures(result, cpu)
            run = run_jobs if steady else run_one_job
            with quiet_uplinks():
                figures = run_loop(run(p, cp, workdir, baseline))
            figures["niceness"] = cp.niceness()
    figures["cores"] = os.cpu_count()
    figures["commit"] = commit()
    print()
    print(jobs_report(figures) if steady else one_job_report(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    return 0 if lost(figures) == 0 else 1


@contextlib.contextmanager
def quiet_uplinks() -> Iterator[None]:
    """Thousands of uplinks in one process: their retry and close warnings would drown the output; the figures
    count every failed and refused report by cause instead. The level is put back: a caller in the same process
    (the smoke test's worker) keeps its logging."""
    uplink_log = logging.getLogger("ftplane.trainer.agent.uplink")
    level = uplink_log.level
    uplink_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        uplink_log.setLevel(level)


def lost(figures: dict[str, Any]) -> int:
    return int(figures["events"]["lost"])


if __name__ == "__main__":
    sys.exit(main())
