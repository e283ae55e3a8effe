"""A big job's page: what one viewer of the dashboard costs the API, by the job's size.

The job page's live part (`GET /ui/jobs/{id}/live`) is drawn again every 2 s for each open page, and
`GET /v1/jobs/{id}` is what the CLI and internal tools poll; a tool lists the job's ranks all at once
(`GET /v1/jobs/{id}/ranks`) or a page at a time (`?limit=10000`, the client's page). For each size a fresh
PostgreSQL database holds one job as a user submits it (kubernetes backend, never launched here, moved to RUNNING
by the lifecycle) whose every node reported once through the report route's validation (`NodeReport`) and the API's
liveness writer; one node of each job has been silent past the heartbeat timeout and one rank is in an open
straggler episode, so a page has something that needs attention. The API runs under uvicorn as `ftplane serve`
runs it (one worker process); this benchmark asks for each page `--requests` times, one after the other as one
viewer would, timing each on its own clock, and meters the API's CPU over them (and over as many `GET /healthz`,
the same run's baseline).

    .venv/bin/python -m bench.job_page                     # 2,048 to 131,072 ranks, ~2 min; --json OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path

import httpx

from api.schemas.events import EventIn, EventType
from bench.common import CpuMeter, create_admin_token, fresh_database, machine, running_job, table, uvicorn_api

GPUS_PER_NODE = 8
HEALTHZ_TIMES = 50  # as many more /healthz as pages: the API's CPU is read in clock ticks (10 ms)


@dataclass
class PageFigures:
    ranks: int
    nodes: int
    request: str
    requests: int
    bytes: int
    p50_ms: float
    max_ms: float
    api_cpu_ms: float  # per request


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="256,2048,16384", help="job sizes in nodes of 8 ranks")
    p.add_argument("--requests", type=int, default=10, help="of each page, one after the other")
    p.add_argument("--database-url", default=None, help="PostgreSQL to create the run's databases in")
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    print(f"machine: {machine()}", flush=True)
    figures = [f for nodes in (int(n) for n in args.nodes.split(",")) for f in run(args, nodes)]
    print(
        table(
            ["ranks", "nodes", "request", "bytes", "p50 ms", "max ms", "API CPU ms per request"],
            [
                [f"{f.ranks:,}", f"{f.nodes:,}", f.request, f"{f.bytes:,}", f"{f.p50_ms:.1f}", f"{f.max_ms:.1f}"]
                + [f"{f.api_cpu_ms:.1f}"]
                for f in figures
            ],
        )
    )
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(f) for f in figures], indent=2))
    return 0


def run(args: argparse.Namespace, nodes: int) -> list[PageFigures]:
    from api.core.db import reset_caches

    before = os.environ.get("FTPLANE_DATABASE_URL")
    try:
        with fresh_database(args.database_url, prefix="ftplane_bench_page") as url:
            os.environ["FTPLANE_DATABASE_URL"] = url
            reset_caches()
            job_id = _job(nodes)
            admin = create_admin_token(url)
            with tempfile.TemporaryDirectory(prefix="ftplane-page-") as tmp, uvicorn_api(url, Path(tmp)) as server:
                meter = CpuMeter({"api": server.processes})
                headers = {"Authorization": f"Bearer {admin}"}
                with httpx.Client(base_url=server.url, headers=headers, timeout=120) as client:
                    pages = [
                        ("GET /healthz", "/healthz", args.requests * HEALTHZ_TIMES),
                        ("GET /v1/jobs/{id}", f"/v1/jobs/{job_id}", args.requests),
                        ("GET /ui/jobs/{id}/live", f"/ui/jobs/{job_id}/live", args.requests),
                        ("GET /v1/jobs/{id}/ranks", f"/v1/jobs/{job_id}/ranks", args.requests),
                        ("GET /v1/jobs/{id}/ranks?limit=10000", f"/v1/jobs/{job_id}/ranks?limit=10000", args.requests),
                    ]
                    return [_measure(client, meter, *page, nodes) for page in pages]
    finally:
        if before is None:
            os.environ.pop("FTPLANE_DATABASE_URL", None)
        else:
            os.environ["FTPLANE_DATABASE_URL"] = before
        reset_caches()


def _job(nodes: int) -> str:
    """The job, every node's report taken by the API's own liveness writer (node 0 silent past the timeout, rank 1
    straggling) and its start's `running`, one event a node, stored as the report route stores them."""
    from api.core.db import get_sessionmaker, session_scope
    from api.database.tables import Job, JobWatch
    from api.schemas.events import utcnow
    from api.schemas.reports import NodeReport
    from api.services.ingest import reporting
    from api.services.ingest.liveness_writer import LivenessWriter

    job_id, spec = running_job("page-bench", nodes, GPUS_PER_NODE)
    now = utcnow()
    silent = now - timedelta(seconds=spec.resiliency.heartbeat_timeout_s + 5)
    writer = LivenessWriter(period_s=3600.0, database=get_sessionmaker())  # flushed by hand
    for node in range(nodes):
        ranks = range(node * GPUS_PER_NODE, (node + 1) * GPUS_PER_NODE)
        at = (silent if node == 0 else now).isoformat()
        beats = [{"rank": r, "step": 100, "ts": at, "node": f"node-{node}", "step_time_s": 0.5} for r in ranks]
        agent = {"ranks": [{"rank": r, "local_rank": r % GPUS_PER_NODE, "alive": True} for r in ranks]}
        writer.add(
            job_id,
            NodeReport.model_validate({"attempt": 0, "node": f"node-{node}", "agent": agent, "heartbeats": beats}),
        )
    writer.flush()
    writer.stop()
    with session_scope() as session:
        session.add(JobWatch(job_id=job_id, stragglers={"open": {"1": {}}}, open_stragglers=1, anomalies={}))
        job = session.get(Job, job_id)
        assert job is not None
        reporting.record_events(session, job, [_running(node, now) for node in range(nodes)])
    return job_id


def _running(node: int, at: datetime) -> EventIn:
    """A node's ranks' `running`, folded into one event as its agent sends them at a start."""
    ranks = list(range(node * GPUS_PER_NODE, (node + 1) * GPUS_PER_NODE))
    processes = [{"rank": r, "pid": 1000 + r, "local_rank": r % GPUS_PER_NODE} for r in ranks]
    details = {"restart_count": 0, "start_step": 0, "ranks": ranks, "processes": processes}
    return EventIn(
        key=f"run:0:{ranks[0]}",
        type=EventType.running,
        ts=at,
        rank=ranks[0],
        node=f"node-{node}",
        step=0,
        details=details,
    )


def _measure(client: httpx.Client, meter: CpuMeter, name: str, path: str, requests: int, nodes: int) -> PageFigures:
    client.get(path).raise_for_status()  # its templates compiled, its caches warm
    took, size = [], 0
    meter.start()
    began = time.monotonic()
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(path)
        took.append(time.perf_counter() - started)
        response.raise_for_status()
        size = len(response.content)
    cpu_s = meter.stop()["api"] * (time.monotonic() - began)
    p50, longest = statistics.median(took) * 1000, max(took) * 1000
    return PageFigures(nodes * GPUS_PER_NODE, nodes, name, requests, size, p50, longest, cpu_s / requests * 1000)


if __name__ == "__main__":
    sys.exit(main())
