"""Straggler detection at scale: one rank of a 16,384-rank job slowed 20 %, found within the window? And a clean
run of the same length: how many false episodes?

What runs is the product's own code: every node's report goes through the node-report route's validation
(`NodeReport`) and its liveness writer (`LivenessWriter`, one flush per supervision pass, as the API's writer
coalesces), into a fresh PostgreSQL database migrated to head; the straggler duty
(`workers/supervision/detect_stragglers.run_once`) runs a pass every `--pass-interval` seconds over it, with the
job's spec as a user would write it (the default threshold, `--window`). Time is simulated: the duty is given
each pass's time (`now`) and the reports are dated on the same clock, so a 10-minute run takes the real time of
its passes only, and each pass is timed for real.

The ranks are the benchmark's: 2,048 nodes x 8 ranks (by default), each node reporting at the product's default
interval for that size (nodes / 256 s: 8 s) at its own phase, every rank's newest heartbeat carrying its last
step's own work (`compute_s`) and the job's step time (lockstep: the same for every rank). Own work per step:
1 s x a static per-rank spread (sd 1 %) x per-step noise (sd `--jitter`, 3 %) x a hiccup (x1.5) in `--hiccup`
(1 %) of steps; the slowed rank's x (1 + `--slow`) from `--slow-at` on. The ground truth is the benchmark's own
record of which rank it slowed and when; detection is read from the stored `straggler_detected` events.

    .venv/bin/python -m bench.stragglers            # ~6 min on 2 busy cores; --json OUT for the figures
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import fresh_database, machine, percentile, running_job, table

STEP_S = 1.5  # the job's wall seconds per step (lockstep), 1 s of it each rank's own work


@dataclass
class RunFigures:
    scenario: str
    ranks: int
    nodes: int
    report_interval_s: float
    window_s: float
    threshold: float
    passes: int
    simulated_s: float
    slowed_rank: int | None = None
    slowed_at_s: float | None = None
    detected_rank: int | None = None
    detection_s: float | None = None  # slowed -> straggler_detected (simulated seconds)
    false_episodes: int = 0  # straggler_detected of any other rank (or of the slowed rank before it was slowed)
    episodes: list[dict[str, Any]] = field(default_factory=list)
    pass_ms: list[float] = field(default_factory=list)
    ingest_ms: list[float] = field(default_factory=list)
    samples_max: int = 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=2048)
    p.add_argument("--procs", type=int, default=8, help="ranks per node")
    p.add_argument("--window", type=float, default=300.0, help="resiliency.stragglers.window_s (the default)")
    p.add_argument("--slow", type=float, default=0.2, help="the slowed rank's extra own work per step (0.2: 20 %%)")
    p.add_argument("--slow-at", type=float, default=300.0, help="simulated seconds before it is slowed")
    p.add_argument("--duration", type=float, default=600.0, help="simulated seconds of each run")
    p.add_argument("--pass-interval", type=float, default=2.0, help="seconds between passes (the product's default)")
    p.add_argument("--jitter", type=float, default=0.03, help="sd of each step's own work")
    p.add_argument("--hiccup", type=float, default=0.01, help="share of steps that take 1.5x")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--database-url", default=None, help="PostgreSQL to create the run's databases in")
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    print(f"machine: {machine()}", flush=True)
    runs = [simulate(args, slowed=False), simulate(args, slowed=True)]
    print(report(runs, args))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=2, default=str))
    slowed = runs[1]
    found = slowed.detected_rank == slowed.slowed_rank and slowed.detection_s is not None
    return 0 if found and slowed.detection_s <= args.window and all(r.false_episodes == 0 for r in runs) else 1


def simulate(args: argparse.Namespace, *, slowed: bool) -> RunFigures:
    from api.core.db import reset_caches

    before = os.environ.get("FTPLANE_DATABASE_URL")
    try:
        with fresh_database(args.database_url, prefix="ftplane_bench_stragglers") as url:
            return _simulate(url, args, slowed)
    finally:  # the settings of whoever called (the smoke test runs this in its own process)
        if before is None:
            os.environ.pop("FTPLANE_DATABASE_URL", None)
        else:
            os.environ["FTPLANE_DATABASE_URL"] = before
        reset_caches()


def _simulate(url: str, args: argparse.Namespace, slowed: bool) -> RunFigures:
    os.environ["FTPLANE_DATABASE_URL"] = url
    from api.core.db import get_sessionmaker, reset_caches

    reset_caches()
    from api.core.db import session_scope
    from api.database.tables import Event, StragglerSample
    from api.schemas.events import EventType, utcnow
    from api.schemas.reports import NodeReport
    from api.services.ingest.liveness_writer import LivenessWriter
    from workers.supervision import detect_stragglers

    rng = random.Random(args.seed + (1 if slowed else 0))
    job_id, spec = running_job(
        "stragglers-bench", args.nodes, args.procs, resiliency={"stragglers": {"window_s": args.window}}
    )
    world, interval = spec.world_size, spec.report_interval_s
    origin = utcnow() - timedelta(seconds=args.duration + 3600)  # the simulated clock, in the past: reports are
    spread = [rng.gauss(0, 0.01) for _ in range(world)]  # taken as sent (none is dated ahead of the server)
    phase = [rng.uniform(0, interval) for _ in range(args.nodes)]
    slow_rank = rng.randrange(world) if slowed else None
    figures = RunFigures(
        scenario="slowed" if slowed else "clean",
        ranks=world,
        nodes=args.nodes,
        report_interval_s=interval,
        window_s=args.window,
        threshold=spec.resiliency.stragglers.threshold,
        passes=0,
        simulated_s=args.duration,
        slowed_rank=slow_rank,
        slowed_at_s=args.slow_at if slowed else None,
    )
    writer = LivenessWriter(period_s=3600.0, database=get_sessionmaker())  # flushed by hand, once per pass
    t = 0.0
    while t <= args.duration:
        now = origin + timedelta(seconds=t)
        started = time.perf_counter()
        for node in range(args.nodes):
            due = phase[node] + interval * ((t - phase[node]) // interval)  # its latest report time
            if due >= 0 and t - args.pass_interval < due <= t:
                beats = [
                    _beat(args, rng, rank, spread[rank], node, due, origin, slow_rank)
                    for rank in range(node * args.procs, (node + 1) * args.procs)
                ]
                report = {"attempt": 0, "node": f"node-{node}", "agent": {"progress": "sdk"}, "heartbeats": beats}
                writer.add(job_id, NodeReport.model_validate(report))
        writer.flush()
        figures.ingest_ms.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        with session_scope() as session:
            detect_stragglers.run_once(session, now)
        figures.pass_ms.append((time.perf_counter() - started) * 1000)
        with session_scope() as session:
            figures.samples_max = max(figures.samples_max, session.query(StragglerSample).count())
        figures.passes += 1
        t += args.pass_interval
        if figures.passes % 50 == 0:
            print(f"  {figures.scenario}: {t:.0f} of {args.duration:.0f} simulated s", flush=True)
    writer.stop()
    with session_scope() as session:
        found = (
            session.query(Event)
            .filter(Event.job_id == job_id, Event.type == EventType.straggler_detected.value)
            .order_by(Event.ts)
            .all()
        )
        for event in found:
            at = (_aware(event.ts) - origin).total_seconds()
            figures.episodes.append({"rank": event.rank, "at_s": round(at, 1), "score": event.details.get("score")})
            if event.rank == slow_rank and at >= args.slow_at and figures.detected_rank is None:
                figures.detected_rank = event.rank
                figures.detection_s = round(at - args.slow_at, 1)
            else:
                figures.false_episodes += 1
    return figures


def _beat(
    args: argparse.Namespace,
    rng: random.Random,
    rank: int,
    spread: float,
    node: int,
    at: float,
    origin: datetime,
    slow_rank: int | None,
) -> dict[str, Any]:
    """The newest heartbeat of `rank` at simulated time `at`: its last step's own work."""
    own = (1.0 + spread) * (1.0 + rng.gauss(0, args.jitter))
    if rng.random() < args.hiccup:
        own *= 1.5
    slowed_now = slow_rank is not None and at >= args.slow_at
    if rank == slow_rank and slowed_now:
        own *= 1.0 + args.slow
    return {
        "rank": rank,
        "step": int(at / STEP_S),
        "ts": (origin + timedelta(seconds=at)).isoformat(),
        "node": f"node-{node}",
        "step_time_s": STEP_S + (args.slow if slowed_now else 0.0),  # lockstep: everyone waits for the slowest
        "compute_s": max(0.0, own),
    }


def _aware(ts: datetime) -> datetime:
    from datetime import UTC

    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


def report(runs: list[RunFigures], args: argparse.Namespace) -> str:
    rows = []
    for r in runs:
        rows.append(
            [
                r.scenario,
                f"{r.ranks:,}",
                r.passes,
                f"{r.report_interval_s:g}",
                f"{r.window_s:g}",
                "-" if r.slowed_rank is None else f"{r.slowed_rank} (+{args.slow:.0%} from {r.slowed_at_s:g} s)",
                "-" if r.detected_rank is None else str(r.detected_rank),
                "-" if r.detection_s is None else f"{r.detection_s:g}",
                r.false_episodes,
                statistics.median(r.pass_ms),
                percentile(r.pass_ms, 95),
                statistics.median(r.ingest_ms),
                r.samples_max,
            ]
        )
    header = [
        "run",
        "ranks",
        "passes",
        "report interval s",
        "window s",
        "slowed rank",
        "detected rank",
        "time to detection s",
        "false episodes",
        "duty pass ms p50",
        "p95",
        "ingest per pass ms p50",
        "sample rows max",
    ]
    return table(header, rows)


if __name__ == "__main__":
    sys.exit(main())
