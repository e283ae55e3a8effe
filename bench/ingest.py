"""Ingest benchmark: heartbeats into the API under uvicorn on PostgreSQL.

A fresh PostgreSQL database, `uvicorn api.main:create_app` (the API alone, embedded broker), one
job of 2,048 nodes x 8 ranks (kubernetes backend, never launched: nothing consumes the broker), and
a load generator in a separate process (aiohttp, closed loop, keep-alive, loopback) posting with the
job's own trainer token. Each request carries fresh `ts` and `step` values, so every beat is a real
update of its rank's liveness row.

Modes, each bounded by --duration and --max-requests:
  single   1 beat per POST       (the baseline: what one rank's reporter sends)
  node     8 beats per POST      (one node agent, one POST per report interval)
  batch    N beats per POST      (an aggregating agent; N = --batch)

Figures per mode: rank-beats/s accepted, requests/s, p50/p99 request latency, CPU used by the
API, PostgreSQL (the backends of the bench database and the server's own processes) and the load
generator, in cores, and what else ran on the machine meanwhile ("other": this host is shared),
all over the measured window only (the load generator's spawn, its warm-up and its exit excluded);
CPU microseconds per beat (API, PostgreSQL); the ratio to the single-beat baseline. With
--fillfactor N, the batch mode once more on a database whose rank_liveness has that fillfactor
(room for HOT updates: a schema change the project does not make), to measure what it would give.

Target: >= 50,000 rank-beats/s batched with p99 < 50 ms on 2 cores.

Usage: python -m bench.ingest [--workers 2] [--duration 15] [--batch 1024] [--modes single,node,batch]
                              [--fillfactor 50]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench.common import (
    CpuMeter,
    Load,
    LoadResult,
    create_admin_token,
    fresh_database,
    machine,
    postgres_processes,
    ratio,
    run_load,
    table,
    uvicorn_api,
)

NODES = 2048
RANKS_PER_NODE = 8
TARGET_BEATS_PER_S = 50_000
TARGET_P99_MS = 50.0


@dataclass
class Mode:
    name: str
    beats_per_request: int
    concurrency: int


@dataclass
class Outcome:
    label: str
    mode: Mode
    load: LoadResult
    cpu: dict[str, float]

    @property
    def beats_per_s(self) -> float:
        return len(self.load.latencies_ms) * self.mode.beats_per_request / self.load.elapsed_s

    @property
    def requests_per_s(self) -> float:
        return len(self.load.latencies_ms) / self.load.elapsed_s

    def us_per_beat(self, group: str) -> float:
        return self.cpu[group] / self.beats_per_s * 1e6 if self.beats_per_s else math.nan

    @property
    def projected(self) -> float:
        """Beats/s if the API and PostgreSQL had the 2 cores to themselves (CPU per beat as measured)."""
        per_beat = (self.cpu["api"] + self.cpu["postgres"]) / self.beats_per_s if self.beats_per_s else math.nan
        return 2.0 / per_beat if per_beat else math.nan

    @property
    def met(self) -> bool:
        return self.beats_per_s >= TARGET_BEATS_PER_S and self.load.p(99) < TARGET_P99_MS


def templates(beats_per_request: int, ranks: int) -> list[bytes]:
    """Bodies covering every rank in turn; @STEP@ and @TS@ are filled in per request."""
    out = []
    for first in range(0, ranks, beats_per_request):
        beats = [
            f'{{"rank":{r},"step":@STEP@,"ts":"@TS@","node":"node-{r // RANKS_PER_NODE:04d}",'
            f'"throughput":123456.7,"loss":2.5}}'
            for r in range(first, min(ranks, first + beats_per_request))
        ]
        out.append(('{"attempt":0,"heartbeats":[' + ",".join(beats) + "]}").encode())
    return out


def create_job(url: str, admin: str) -> tuple[str, str]:
    spec = {
        "name": "ingest-bench",
        "backend": "kubernetes",
        "image": "registry.example/trainer:bench",
        "command": ["python", "-m", "trainer"],
        "nodes": NODES,
        "procs_per_node": RANKS_PER_NODE,
        "checkpoint": {"dir": "/checkpoints/bench", "interval_steps": 500, "engine": "async"},
    }
    response = httpx.post(f"{url}/v1/jobs", json=spec, headers={"Authorization": f"Bearer {admin}"}, timeout=30)
    response.raise_for_status()
    body = response.json()
    return body["id"], body["token"]


def set_fillfactor(database_url: str, fillfactor: int) -> None:
    engine = create_engine(database_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text(f"ALTER TABLE rank_liveness SET (fillfactor = {int(fillfactor)})"))
    engine.dispose()


def run_config(label: str, modes: list[Mode], args: argparse.Namespace, fillfactor: int | None) -> list[Outcome]:
    """A fresh database and API; each mode in turn against the same job."""
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="ftplane-ingest-") as tmp, fresh_database(args.database_url) as db:
        if fillfactor:
            set_fillfactor(db, fillfactor)
        admin = create_admin_token(db)
        database = make_url(db).database
        with uvicorn_api(db, Path(tmp), workers=args.workers) as server:
            job_id, token = create_job(server.url, admin)
            meter = CpuMeter({"api": server.processes, "postgres": lambda: postgres_processes(database)})
            for mode in modes:
                print(
                    f"{label} / {mode.name}: {mode.beats_per_request} beat(s) per POST, {mode.concurrency} connections"
                )
                load = Load(
                    url=server.url,
                    path=f"/v1/jobs/{job_id}/heartbeats",
                    token=token,
                    templates=templates(mode.beats_per_request, NODES * RANKS_PER_NODE),
                    concurrency=mode.concurrency,
                    duration_s=args.duration,
                    max_requests=args.max_requests,
                    warmup_s=args.warmup,
                )
                result, cpu = run_load(load, meter)  # the load generator's spawn and warm-up are not metered
                outcome = Outcome(label, mode, result, cpu)
                outcomes.append(outcome)
                print(
                    f"  {outcome.beats_per_s:,.0f} rank-beats/s, {outcome.requests_per_s:,.0f} req/s, "
                    f"p50 {result.p(50):.1f} ms, p99 {result.p(99):.1f} ms, errors {result.errors}, "
                    f"other load {outcome.cpu['other']:.2f} cores",
                    flush=True,
                )
                time.sleep(1)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds measured per mode")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of unmeasured load before each mode")
    parser.add_argument("--max-requests", type=int, default=1_000_000, help="requests per mode, at most")
    parser.add_argument("--batch", type=int, default=1024, help="beats per POST in the batch mode")
    parser.add_argument("--batch-concurrency", type=int, default=2, help="connections in the batch mode")
    parser.add_argument("--concurrency", type=int, default=32, help="connections in the single and node modes")
    parser.add_argument("--modes", default="single,node,batch")
    parser.add_argument(
        "--fillfactor", type=int, default=0, help="also run batch with this rank_liveness fillfactor (0: no)"
    )
    parser.add_argument("--database-url", help="PostgreSQL server to create the fresh databases on")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    modes = {
        "single": Mode("single", 1, args.concurrency),
        "node": Mode("node", RANKS_PER_NODE, args.concurrency),
        "batch": Mode("batch", args.batch, args.batch_concurrency),
    }
    chosen = [modes[m] for m in args.modes.split(",")]
    print(f"machine: {machine()}")
    print(
        f"API: uvicorn, {args.workers} worker(s); PostgreSQL, fresh database; job of {NODES} x {RANKS_PER_NODE} ranks"
    )
    outcomes = run_config("schema as is", chosen, args, None)
    if args.fillfactor and "batch" in args.modes.split(","):
        outcomes += run_config(f"fillfactor {args.fillfactor}", [modes["batch"]], args, args.fillfactor)
    print()
    print(report(outcomes))
    batch = next((o for o in outcomes if o.mode.name == "batch"), None)
    if batch is not None:
        print(
            f"\ntarget >= {TARGET_BEATS_PER_S:,} rank-beats/s batched with p99 < {TARGET_P99_MS:.0f} ms: "
            f"{'met' if batch.met else 'missed'} ({batch.beats_per_s:,.0f} rank-beats/s, p99 {batch.load.p(99):.0f} ms)"
        )
    if args.json:
        args.json.write_text(json.dumps([summary(o) for o in outcomes], indent=2))
    return 0


def summary(o: Outcome) -> dict[str, object]:
    return {
        "config": o.label,
        "mode": o.mode.name,
        "beats_per_request": o.mode.beats_per_request,
        "concurrency": o.mode.concurrency,
        "requests": len(o.load.latencies_ms),
        "errors": o.load.errors,
        "beats_per_s": o.beats_per_s,
        "requests_per_s": o.requests_per_s,
        "p50_ms": o.load.p(50),
        "p99_ms": o.load.p(99),
        "cpu_cores": {**o.cpu, "loadgen": o.load.cpu_cores},
        "us_per_beat": {"api": o.us_per_beat("api"), "postgres": o.us_per_beat("postgres")},
        "projected_beats_per_s_on_2_dedicated_cores": o.projected,
    }


def report(outcomes: list[Outcome]) -> str:
    base = next((o for o in outcomes if o.mode.name == "single"), None)
    rows = [
        [
            o.label,
            o.mode.name,
            o.mode.beats_per_request,
            o.mode.concurrency,
            len(o.load.latencies_ms),
            o.load.errors,
            o.beats_per_s,
            o.requests_per_s,
            o.load.p(50),
            o.load.p(99),
            o.cpu["api"],
            o.cpu["postgres"],
            o.load.cpu_cores,
            o.cpu["other"],
            o.us_per_beat("api"),
            o.us_per_beat("postgres"),
            o.projected,
            ratio(o.beats_per_s, base.beats_per_s) if base else "-",
        ]
        for o in outcomes
    ]
    header = [
        "config",
        "mode",
        "beats/POST",
        "conns",
        "requests",
        "errors",
        "rank-beats/s",
        "req/s",
        "p50 ms",
        "p99 ms",
        "API cores",
        "PG cores",
        "loadgen cores",
        "other cores",
        "API µs/beat",
        "PG µs/beat",
        "beats/s on 2 free cores (projected)",
        "beats/s vs single",
    ]
    return table(header, rows)


if __name__ == "__main__":
    sys.exit(main())
