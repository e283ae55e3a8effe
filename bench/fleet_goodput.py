"""Fleet goodput at scale: `GET /v1/goodput` over 10,000 jobs and 10 million events on PostgreSQL.

What it builds, in a fresh database migrated to head: `--jobs` jobs made by the product's own job store
(`models.jobs.create` from a validated `JobSpec`), over the last `--days` days (5 % of them still running), 20
teams (`team` label), sizes from 1 to 512 nodes of 8 GPUs (a tenth of them CPU jobs); for each, a history of
events as the node agents, ranks and supervisor store them: `submitted`, `running` from every rank of each run,
rank 0's `checkpoint_saved` every 10 to 30 minutes, failures (a rank's crash and the in-job restart after it, a
hang found on every silent rank, a lost node and the job-level restart to a new attempt; one every 6 to 60 hours),
straggler episodes, the end. The most ranks that speak per run is fitted so that the events come to `--events`
(about 1,000 a job by default: the ranks' `running` are most of them, as in a real fleet). The
events are bulk-loaded with COPY (the table's secondary indexes dropped during the load and built again after,
as they were), then the product's summarizer (`workers/supervision/summarize_goodput.run_once`, pass after
pass, with `--batch` jobs a pass) summarizes every job; its time is measured.

Then the API under uvicorn (`bench/common.uvicorn_api`, as `ftplane serve` runs it) answers `GET /v1/goodput`
`--calls` times per query shape, timed by this script's own clock around each HTTP call (the first call of each
shape reported apart): the goal's shape (7 days, `group_by=label:team`, `bucket=1d`), 30 days by team per day,
and 7 days per hour without groups. A spot check: for a few finished jobs inside the window, the fleet's group of
that one job (a `bench-job` label) against the job's own `GET /v1/jobs/{id}/goodput`.

    .venv/bin/python -m bench.fleet_goodput                 # 10,000 jobs, 10M events; --json OUT for the figures
    .venv/bin/python -m bench.fleet_goodput --jobs 50 --events 20000 --calls 2    # seconds (the smoke test's)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import httpx

from bench.common import create_admin_token, fresh_database, machine, percentile, table, uvicorn_api

TEAMS = 20
SHAPES = {  # name -> query
    "7d by team per day (goal)": {"window": "7d", "group_by": "label:team", "bucket": "1d"},
    "30d by team per day": {"window": "30d", "group_by": "label:team", "bucket": "1d"},
    "7d per hour": {"window": "7d", "bucket": "1h"},
}
GOAL = "7d by team per day (goal)"
INDEXES = (  # the events table's secondary indexes, as the migrations make them (dropped for the load)
    ("ix_events_job_ts", "CREATE INDEX ix_events_job_ts ON events (job_id, ts)"),
    ("ix_events_job_type", "CREATE INDEX ix_events_job_type ON events (job_id, type)"),
)
UNIQUE = "ALTER TABLE events ADD CONSTRAINT uq_events_job_key UNIQUE (job_id, key)"


@dataclass
class Figures:
    jobs: int = 0
    running_jobs: int = 0
    events: int = 0
    ranks_cap: int = 0  # the most ranks that said `running` per run (fitted so the events come to --events)
    build_s: float = 0.0  # jobs and generated events
    copy_s: float = 0.0  # COPY and the indexes built again
    summarize_s: float = 0.0
    summarize_passes: int = 0
    segments: int = 0
    hours: int = 0
    faults: int = 0
    calls: dict[str, list[float]] = field(default_factory=dict)  # shape -> ms per call (the first one included)
    checks: list[dict[str, Any]] = field(default_factory=list)
    machine: str = ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--calls", type=int, default=10, help="timed calls per query shape")
    parser.add_argument("--batch", type=int, default=1000, help="jobs per summarizer pass")
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--workdir", type=Path, default=Path(".ftplane/bench-fleet"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from api.core.db import reset_caches

    before = {k: os.environ.get(k) for k in ("FTPLANE_DATABASE_URL", "FTPLANE_GOODPUT_BATCH")}
    try:
        with fresh_database(args.database_url, prefix="ftplane_bench_fleet") as url:
            figures = run(url, args)
    finally:  # the settings of whoever called (the smoke test runs this in its own process)
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        reset_caches()
    print(report(figures, args))
    if args.json:
        args.json.write_text(json.dumps(asdict(figures), indent=2, default=str))
    agree = all(c["agree"] for c in figures.checks)
    return 0 if agree and figures.checks else 1


def run(url: str, args: argparse.Namespace) -> Figures:
    os.environ["FTPLANE_DATABASE_URL"] = url
    os.environ["FTPLANE_GOODPUT_BATCH"] = str(args.batch)
    from api.core.db import reset_caches

    reset_caches()
    figures = Figures(machine=machine())
    now = datetime.now(UTC)
    started = time.perf_counter()
    jobs = make_jobs(args, now)
    rng = random.Random(args.seed)
    figures.ranks_cap = fit_cap(jobs, args.seed, args.events, now)
    args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile("w+", dir=args.workdir) as rows:  # the COPY text, on disk (gigabytes at 10M)
        for job in jobs:
            figures.events += write_history(rows, job, args.seed, figures.ranks_cap, now)
        figures.build_s = time.perf_counter() - started
        started = time.perf_counter()
        bulk_load(url, rows)
        figures.copy_s = time.perf_counter() - started
    figures.jobs = len(jobs)
    figures.running_jobs = sum(1 for j in jobs if j["end"] is None)
    started = time.perf_counter()
    figures.summarize_passes = summarize_all()
    figures.summarize_s = time.perf_counter() - started
    count_rows(figures)
    with uvicorn_api(url, args.workdir) as api:
        token = create_admin_token(url)
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=api.url, headers=headers, timeout=120) as client:
            for name, params in SHAPES.items():
                figures.calls[name] = [timed(client, params) for _ in range(max(1, args.calls) + 1)]
            figures.checks = spot_checks(client, jobs, now, rng)
    return figures


def make_jobs(args: argparse.Namespace, now: datetime) -> list[dict[str, Any]]:
    """The jobs, through the product's job store; each with its life the histories follow."""
    from api import models
    from api.core.db import session_scope
    from api.schemas.spec import JobSpec

    rng = random.Random(args.seed)
    out = []
    with session_scope() as session:
        for i in range(args.jobs):
            nodes = rng.choice([1, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
            cpu = rng.random() < 0.1
            hours = rng.uniform(2, 48)
            running = rng.random() < 0.05
            if running:
                start = now - timedelta(hours=rng.uniform(0.5, 47))
                end = None
            else:
                start = now - timedelta(days=rng.uniform(0, args.days)) - timedelta(hours=hours)
                end = start + timedelta(hours=hours)
            spec = JobSpec.model_validate(
                {
                    "name": f"bench-{i}",
                    "backend": "kubernetes",
                    "image": "registry.example/trainer:bench",
                    "namespace": "training",
                    "command": ["python", "-m", "trainer"],
                    "nodes": nodes,
                    "procs_per_node": 2 if cpu else 8,
                    "resources": {"gpus_per_node": 0 if cpu else 8},
                    "checkpoint": {"dir": "/checkpoints/bench", "interval_steps": 500},
                    "labels": {"team": f"team-{i % TEAMS:02d}", "bench-job": str(i)},
                }
            )
            job = models.jobs.create(session, spec)
            job.status = "RUNNING" if running else rng.choice(["SUCCEEDED"] * 9 + ["FAILED"])
            ranks = nodes * spec.procs_per_node
            out.append({"id": job.id, "start": start, "end": end, "status": job.status, "index": i, "ranks": ranks})
            if i % 1000 == 999:
                session.commit()
    return out


def write_history(rows: IO[str] | None, job: dict[str, Any], seed: int, cap: int, now: datetime) -> int:
    """One job's events as COPY text lines (none with `rows` None: counted only); returns how many. Each rank of a
    run says `running` (up to `cap` of them: what the benchmark fits to `--events`), rank 0 reports each save, a
    hang is found on every silent rank (up to `cap`)."""
    rng = random.Random(seed * 1_000_003 + job["index"])
    start, end = job["start"], job["end"] or now
    wall = (end - start).total_seconds()
    speaking = max(1, min(job["ranks"], cap))
    events: list[tuple[float, int, str, int | None, str | None, int | None, str]] = []

    def add(
        t: float,
        attempt: int,
        kind: str,
        details: dict[str, Any],
        rank: int | None = None,
        step: int | None = None,
        node: str | None = None,
    ) -> None:
        text = json.dumps(details, separators=(",", ":")) if rows is not None else ""
        events.append((min(t, wall - 0.001), attempt, kind, rank, node, step, text))

    mtbf = rng.uniform(6, 60) * 3600
    failures = sorted(rng.uniform(600, wall - 300) for _ in range(int(wall / mtbf))) if wall > 1200 else []
    save_every = rng.uniform(10, 30) * 60
    step_s = rng.uniform(0.5, 3.0)
    attempt, restart, step = 0, 0, 0
    run_start = rng.uniform(60, 600)
    last_saved = base = 0  # the newest saved step; the step the current run resumed from
    add(0.0, 0, "submitted", {})

    def running(at: float, start_step: int) -> None:
        for rank in range(speaking):
            details = {"restart_count": restart, "iteration": 0, "start_step": start_step}
            add(at + rank * 1e-4, attempt, "running", details, rank=rank, step=start_step)

    running(run_start, 0)
    pending = list(failures)
    next_save = run_start + save_every
    while True:
        fail_at = pending[0] if pending else wall
        if next_save < min(fail_at, wall):
            step = int((next_save - run_start) / step_s) + base
            blocking = rng.uniform(2, 20)
            add(next_save, attempt, "checkpoint_saved", {"step": step, "blocking_s": blocking, "total_s": blocking * 3},
                rank=0, step=step)  # fmt: skip
            last_saved = step
            next_save += save_every
            continue
        if not pending:
            break
        at = pending.pop(0)
        failed_step = int((at - run_start) / step_s) + base
        kind = rng.random()
        if kind < 0.6:  # a rank's crash, the launcher restarts the workers
            crash = {"cause": "exit code 1", "cause_class": "crash", "exit_code": 1}
            add(at, attempt, "rank_failed", crash, rank=speaking - 1, step=failed_step)
            restart += 1
            again = {"restart_count": restart, "failed_step": failed_step, "cause_class": "crash"}
            add(at + 30, attempt, "injob_restart", again)
            resume = at + rng.uniform(60, 300)
        elif kind < 0.85:  # a hang: every silent rank found in one pass
            for rank in range(speaking):
                silent = {"silent_s": 300.0, "cause_class": "hang"}
                add(at, attempt, "hang_detected", silent, rank=rank, step=failed_step)
            restart += 1
            add(at + 20, attempt, "injob_restart", {"restart_count": restart, "failed_step": failed_step})
            resume = at + rng.uniform(120, 600)
        else:  # a lost node: a new attempt
            node = f"node-{rng.randrange(4096)}"
            add(at, attempt, "node_failed", {"cause": f"{node} lost", "cause_class": "node"}, node=node)
            attempt += 1
            restart = 0
            add(at + 60, attempt, "job_restart", {"from_attempt": attempt - 1, "cause_class": "node"})
            resume = at + rng.uniform(300, 1200)
        if resume >= wall - 60:
            break
        base = last_saved
        run_start = resume
        running(resume, last_saved)
        next_save = resume + save_every
    if rng.random() < 0.1 and wall > 7200:
        at = rng.uniform(1800, wall - 3600)
        add(at, attempt, "straggler_detected", {"episode": "e1", "lost_fraction": 0.2, "onset_s": 60.0}, rank=0)
        add(at + 1800, attempt, "straggler_cleared", {"episode": "e1", "recovered_s": 30.0}, rank=0)
    if job["end"] is not None:
        ending = "succeeded" if job["status"] == "SUCCEEDED" else "failed"
        add(wall, attempt, ending, {"final_step": step} if ending == "succeeded" else {"cause_class": "crash"})
    if rows is None:
        return len(events)
    received = now.isoformat()
    for n, (t_s, at_attempt, type_, at_rank, at_node, at_step, text) in enumerate(events):
        ts = (start + timedelta(seconds=max(0.0, t_s))).isoformat()
        rows.write(
            f"{job['id']}\t{at_attempt}\t{type_}\t{ts}\t{received}\t{_null(at_rank)}\t{_null(at_node)}\t"
            f"{_null(at_step)}\t{text}\tk{n}\n"
        )
    return len(events)


def fit_cap(jobs: list[dict[str, Any]], seed: int, target: int, now: datetime) -> int:
    """The most ranks that speak per run for which the events come closest to `target` from below. A history's
    count is F + min(ranks, cap) x M (its random draws do not depend on the cap): two counts of each give F, M."""
    shapes = []
    for job in jobs:
        one = write_history(None, job, seed, 1, now)
        world = job["ranks"]
        many = write_history(None, job, seed, world, now) if world > 1 else one
        per_rank = (many - one) // (world - 1) if world > 1 else 0
        shapes.append((one - per_rank, per_rank, world))

    def total(cap: int) -> int:
        return sum(fixed + min(world, cap) * per_rank for fixed, per_rank, world in shapes)

    lo, hi = 1, max(world for _, _, world in shapes)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if total(mid) <= target else (lo, mid - 1)
    return lo


def _null(value: object) -> str:
    return "\\N" if value is None else str(value)


def bulk_load(url: str, rows: IO[str]) -> None:
    """COPY the events in, with the events table's secondary indexes dropped meanwhile and built again after."""
    import psycopg
    from sqlalchemy.engine import make_url

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, _ in INDEXES:
            conn.execute(f"DROP INDEX {name}")
        conn.execute("ALTER TABLE events DROP CONSTRAINT uq_events_job_key")
        columns = "job_id, attempt, type, ts, received_at, rank, node, step, details, key"
        with conn.cursor() as cur, cur.copy(f"COPY events ({columns}) FROM STDIN") as copy:
            rows.seek(0)
            while chunk := rows.read(1 << 22):
                copy.write(chunk)
        for _, create in INDEXES:
            conn.execute(create)
        conn.execute(UNIQUE)
        conn.execute("ANALYZE events")
        conn.execute("ANALYZE jobs")


def summarize_all() -> int:
    """The summarizer's passes until it picks nothing; how many."""
    from api.core.db import session_scope
    from workers.supervision import summarize_goodput

    passes = 0
    while True:
        with session_scope() as session:
            done = summarize_goodput.run_once(session)
        passes += 1
        if done == 0:
            break
        print(f"summarizer pass {passes}: {done} jobs", file=sys.stderr, flush=True)
    from sqlalchemy import text

    from api.core.db import get_engine

    with get_engine().connect() as conn:
        conn.execute(text("ANALYZE goodput_segments"))
        conn.execute(text("ANALYZE goodput_hours"))
        conn.execute(text("ANALYZE goodput_summaries"))
        conn.commit()
    return passes


def count_rows(figures: Figures) -> None:
    from sqlalchemy import text

    from api.core.db import get_engine

    with get_engine().connect() as conn:
        figures.segments = int(conn.execute(text("SELECT count(*) FROM goodput_segments")).scalar_one())
        figures.hours = int(conn.execute(text("SELECT count(*) FROM goodput_hours")).scalar_one())
        figures.faults = int(conn.execute(text("SELECT count(*) FROM goodput_faults")).scalar_one())


def timed(client: httpx.Client, params: dict[str, str]) -> float:
    began = time.perf_counter()
    response = client.get("/v1/goodput", params=params)
    elapsed = (time.perf_counter() - began) * 1000
    response.raise_for_status()
    return elapsed


def spot_checks(
    client: httpx.Client, jobs: list[dict[str, Any]], now: datetime, rng: random.Random
) -> list[dict[str, Any]]:
    """A few finished jobs inside the last 7 days: the fleet's group of that one job against its own goodput."""
    inside = [j for j in jobs if j["end"] is not None and j["start"] > now - timedelta(days=6)]
    out = []
    for job in rng.sample(inside, min(3, len(inside))):
        own = client.get(f"/v1/jobs/{job['id']}/goodput").json()
        params = {"label": f"bench-job={job['index']}", "window": "7d"}
        fleet = client.get("/v1/goodput", params=params).json()["total"]
        gpus = round(fleet["wall_gpu_hours"] / fleet["wall_hours"]) if fleet["wall_hours"] else 0
        expected = own["wall_s"] * gpus / 3600
        lost = sum(fleet["lost_gpu_hours"].values())
        agree = (
            abs(fleet["wall_gpu_hours"] - expected) <= 1e-6 * max(1.0, expected)
            and abs(lost - sum(own["lost_s"].values()) * gpus / 3600) <= 1e-6 * max(1.0, expected)
            and fleet["faults_total"] == own["failures"]
        )
        out.append({"job": job["id"], "wall_s": own["wall_s"], "gpus": gpus, "faults": own["failures"], "agree": agree})
    return out


def report(f: Figures, args: argparse.Namespace) -> str:
    lines = [
        f"# fleet goodput: {f.jobs:,} jobs ({f.running_jobs:,} running), {f.events:,} events over {args.days:g} days",
        f"machine: {f.machine}",
        f"built {f.build_s:.0f} s, COPY + indexes {f.copy_s:.0f} s, summarizer {f.summarize_s:.0f} s "
        f"({f.summarize_passes} passes of up to {args.batch} jobs; {f.summarize_s / max(1, f.jobs) * 1000:.1f} ms a "
        f"job): {f.segments:,} segments, {f.hours:,} job-hours, {f.faults:,} faults",
        "",
    ]
    rows = []
    for name, ms in f.calls.items():
        rest = ms[1:]
        rows.append([name, ms[0], percentile(rest, 50), max(rest), len(rest)])
    lines.append(table(["query", "first ms", "p50 ms", "max ms", "calls"], rows))
    lines.append("")
    agree = sum(1 for c in f.checks if c["agree"])
    lines.append(f"spot checks (a group of one job = its own goodput): {agree} of {len(f.checks)} agree")
    goal = f.calls.get(GOAL, [0.0])[1:]
    lines.append(
        f"goal (7 days, by team, per day, under 1 s): p50 {percentile(goal, 50):.0f} ms, max {max(goal):.0f} ms"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
