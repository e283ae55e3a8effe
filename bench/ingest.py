"""Ingest benchmark: node agents' reports into the API under uvicorn, against GET /healthz of the same server.

A fresh database (PostgreSQL, and the embedded SQLite default), `uvicorn api.main:create_served_app` (the
API alone, embedded broker), one job of 2,048 nodes x 8 ranks (kubernetes backend, never launched),
and a load generator in a separate process (aiohttp, closed loop, keep-alive, loopback) with the
job's own trainer token. Modes, one after the other against the same server:

  healthz     GET /healthz: the baseline, what the cheapest request of this server costs
  report      POST /v1/jobs/{id}/reports: one node agent's report (node liveness and its 8 ranks'
              heartbeats, no events), each from the next of the 2,048 nodes, fresh `ts` and `step`
  heartbeats  POST /v1/jobs/{id}/heartbeats with the same 8 heartbeats (the per-rank route, for reference)
  events      POST /v1/jobs/{id}/reports: the same report with its 8 ranks' `running` events (fresh keys),
              the event path, stored before the reply (what a node sent as a job started or restarted
              before its agent folded them)
  running     the same report with its ranks' `running` folded into one event, as the node agent sends
              them now (trainer/agent/report_buffer.py): a start's or a restart's burst, one report a node

Figures per mode: requests/s and rank-beats/s accepted, p50/p99 request latency, CPU of the API
and of PostgreSQL and the load generator in cores over the measured window only (the generator's
spawn, warm-up and exit excluded), and "other" (what else ran on this shared host meanwhile).
The goal (issue: cheap ingest): a report costs at most 2x a GET /healthz of the same server in the
same run, a throughput ratio report/healthz >= 0.5, with p99 under 50 ms at that load.

Usage: python -m bench.ingest [--workers 1] [--duration 15] [--concurrency 8] [--databases postgresql,sqlite]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy.engine import make_url

from bench.common import CpuMeter, create_admin_token, database_of_kind, machine, postgres_processes, table, uvicorn_api
from bench.load import Load, LoadResult, load_line, run_load
from ftplane.trainer.agent.report_buffer import fold_running

NODES = 2048
RANKS_PER_NODE = 8
GOAL_RATIO = 0.5
GOAL_P99_MS = 50.0


@dataclass(frozen=True)
class Mode:
    name: str
    method: str
    beats_per_request: int


MODES = {
    "healthz": Mode("healthz", "GET", 0),
    "report": Mode("report", "POST", RANKS_PER_NODE),
    "heartbeats": Mode("heartbeats", "POST", RANKS_PER_NODE),
    "events": Mode("events", "POST", RANKS_PER_NODE),
    "running": Mode("running", "POST", RANKS_PER_NODE),
}


@dataclass
class Outcome:
    database: str
    mode: Mode
    load: LoadResult
    cpu: dict[str, float]

    @property
    def requests_per_s(self) -> float:
        return len(self.load.latencies_ms) / self.load.elapsed_s

    @property
    def beats_per_s(self) -> float:
        return self.requests_per_s * self.mode.beats_per_request

    @property
    def api_ms_per_request(self) -> float:
        """The API's own CPU per request: what a request costs, whatever else the machine ran meanwhile."""
        return 1000 * self.cpu.get("api", 0.0) / self.requests_per_s if self.requests_per_s else 0.0


def beats(node: int) -> str:
    return ",".join(
        f'{{"rank":{r},"step":@STEP@,"ts":"@TS@","node":"node-{node:04d}","throughput":123456.7,"loss":2.5,'
        f'"step_time_s":0.42}}'
        for r in range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE)
    )


def running_events(node: int) -> str:
    """The node's ranks' `running` events, keyed afresh per request (@KEY@): each is stored, none a resend."""
    return ",".join(
        f'{{"key":"run:@KEY@:{r}","type":"running","ts":"@TS@","rank":{r},"node":"node-{node:04d}","step":0,'
        f'"details":{{"restart_count":0,"iteration":0,"start_step":0,"world_size":{NODES * RANKS_PER_NODE}}}}}'
        for r in range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE)
    )


def folded_running(node: int) -> str:
    """The node's ranks' `running` folded into one event by the agent's own code, keyed afresh per request."""
    ts = "2026-01-01T00:00:00+00:00"  # fold_running compares times; the template's @TS@ replaces it
    first, *rest = (
        {
            "key": f"run:@KEY@:{r}",
            "type": "running",
            "ts": ts,
            "rank": r,
            "node": f"node-{node:04d}",
            "step": 0,
            "details": {
                "restart_count": 0,
                "iteration": 0,
                "start_step": 0,
                "world_size": NODES * RANKS_PER_NODE,
                "pid": 1000 + r,
                "local_rank": r % RANKS_PER_NODE,
            },
        }
        for r in range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE)
    )
    for event in rest:
        fold_running(first, event)
    return json.dumps(first, separators=(",", ":")).replace(ts, "@TS@")


def report_bodies(events: Callable[[int], str] | None = None) -> list[bytes]:
    """One node agent's report per node, as trainer/agent/uplink.py sends it (no events, or `events(node)`)."""
    out = []
    for node in range(NODES):
        ranks = ",".join(
            f'{{"rank":{r},"local_rank":{r % RANKS_PER_NODE},"pid":{1000 + r},"alive":true}}'
            for r in range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE)
        )
        agent = f'{{"pid":1,"launcher":{{"pid":2,"alive":true}},"ranks":[{ranks}],"progress":"sdk","interval_s":8.0}}'
        body = (
            f'{{"attempt":0,"node":"node-{node:04d}","agent":{agent},"heartbeats":[{beats(node)}],'
            f'"events":[{events(node) if events else ""}]}}'
        )
        out.append(body.encode())
    return out


def heartbeat_bodies() -> list[bytes]:
    return [f'{{"attempt":0,"heartbeats":[{beats(node)}]}}'.encode() for node in range(NODES)]


def create_job(url: str, admin: str) -> tuple[str, str]:
    spec = {
        "name": "ingest-bench",
        "backend": "kubernetes",
        "image": "registry.example/trainer:bench",
        "command": ["python", "-m", "ftplane.trainer"],
        "nodes": NODES,
        "procs_per_node": RANKS_PER_NODE,
        "checkpoint": {"dir": "/checkpoints/bench", "interval_steps": 500, "engine": "async"},
    }
    response = httpx.post(f"{url}/v1/jobs", json=spec, headers={"Authorization": f"Bearer {admin}"}, timeout=30)
    response.raise_for_status()
    body = response.json()
    return body["id"], body["token"]


def run_database(kind: str, args: argparse.Namespace) -> list[Outcome]:
    """A fresh database and API; each mode in turn against the same job."""
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="ftplane-ingest-") as tmp:  # noqa: SIM117 - the next needs tmp
        with database_of_kind(kind, args.database_url, Path(tmp)) as db:
            admin = create_admin_token(db)
            database = make_url(db).database if kind == "postgresql" else None
            with uvicorn_api(db, Path(tmp), workers=args.workers) as server:
                job_id, token = create_job(server.url, admin)
                groups = {"api": server.processes}
                if database:
                    groups["postgres"] = lambda: postgres_processes(database)
                meter = CpuMeter(groups)
                paths = {
                    "healthz": ("/healthz", [b""]),
                    "report": (f"/v1/jobs/{job_id}/reports", report_bodies()),
                    "heartbeats": (f"/v1/jobs/{job_id}/heartbeats", heartbeat_bodies()),
                    "events": (f"/v1/jobs/{job_id}/reports", report_bodies(running_events)),
                    "running": (f"/v1/jobs/{job_id}/reports", report_bodies(folded_running)),
                }
                for name in args.modes.split(","):
                    mode = MODES[name]
                    path, bodies = paths[name]
                    load = Load(
                        url=server.url,
                        path=path,
                        token=token,
                        templates=bodies,
                        concurrency=args.concurrency,
                        duration_s=args.duration,
                        max_requests=args.max_requests,
                        warmup_s=args.warmup,
                        method=mode.method,
                    )
                    result, cpu = run_load(load, meter)
                    outcome = Outcome(kind, mode, result, cpu)
                    outcomes.append(outcome)
                    print(load_line(f"{kind} / {name}", outcome.requests_per_s, result, cpu), flush=True)
                    time.sleep(1)
    return outcomes


def report(outcomes: list[Outcome]) -> str:
    rows = []
    for o in outcomes:
        base = next(b for b in outcomes if b.database == o.database and b.mode.name == "healthz")
        share = o.requests_per_s / base.requests_per_s if base.requests_per_s else 0.0
        rows.append(
            [
                o.database,
                o.mode.name,
                f"{o.requests_per_s:,.0f}",
                f"{o.beats_per_s:,.0f}" if o.mode.beats_per_request else "—",
                f"{o.load.p(50):.1f}",
                f"{o.load.p(99):.1f}",
                f"{o.cpu.get('api', 0):.2f}",
                f"{o.cpu.get('postgres', 0):.2f}" if o.database == "postgresql" else "—",
                f"{o.cpu.get('other', 0):.2f}",
                f"{share:.2f}",
                o.load.errors,
            ]
        )
    header = [
        "database",
        "mode",
        "req/s",
        "beats/s",
        "p50 ms",
        "p99 ms",
        "API cores",
        "PG cores",
        "other",
        "÷ healthz",
        "errors",
    ]
    return table(header, rows)


def verdict(outcomes: list[Outcome]) -> list[str]:
    lines = []
    for o in outcomes:
        if o.mode.name != "report":
            continue
        base = next(b for b in outcomes if b.database == o.database and b.mode.name == "healthz")
        share = o.requests_per_s / base.requests_per_s
        # the kernel counts a process's CPU in 10 ms ticks: a short window on a busy machine may count none
        cost = (
            f"{o.api_ms_per_request / base.api_ms_per_request:.2f}x healthz"
            if base.api_ms_per_request > 0
            else "not measured (no CPU tick counted in healthz's window)"
        )
        met = share >= GOAL_RATIO and o.load.p(99) < GOAL_P99_MS and o.load.errors == 0
        lines.append(
            f"{o.database}: report/healthz throughput {share:.2f} (goal >= {GOAL_RATIO}), API CPU per request "
            f"{cost} (goal <= {1 / GOAL_RATIO:g}x), p99 {o.load.p(99):.1f} ms (goal < {GOAL_P99_MS:g}): "
            f"{'met' if met else 'NOT met'}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds measured per mode")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of unmeasured load before each mode")
    parser.add_argument("--max-requests", type=int, default=1_000_000, help="requests per mode, at most")
    parser.add_argument("--concurrency", type=int, default=8, help="connections, every mode")
    parser.add_argument("--modes", default="healthz,report,heartbeats")
    parser.add_argument("--databases", default="postgresql,sqlite")
    parser.add_argument("--database-url", default=None, help="PostgreSQL to create the bench database in")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args(argv)
    print(f"machine: {machine()}")
    outcomes: list[Outcome] = []
    for kind in args.databases.split(","):
        outcomes += run_database(kind, args)
    print()
    print(report(outcomes))
    for line in verdict(outcomes):
        print(line)
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "database": o.database,
                        "mode": o.mode.name,
                        "requests_per_s": o.requests_per_s,
                        "p50_ms": o.load.p(50),
                        "p99_ms": o.load.p(99),
                        "cpu": o.cpu,
                        "errors": o.load.errors,
                    }
                    for o in outcomes
                ],
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
