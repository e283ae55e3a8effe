"""The silent-rank duty over a whole job's silence: how long one supervision pass takes at 131,072 ranks.

What runs is the product's own code: the job is submitted as a user would (kubernetes backend, never launched
here) and moved to RUNNING by the lifecycle; every rank's heartbeat goes through the node-report route's
validation (`NodeReport`) and the API's liveness writer (`LivenessWriter`) into a fresh PostgreSQL database
migrated to head; then the duty (`workers/supervision/detect_silent_ranks.run_once`, as the worker calls it)
runs `--passes` passes, each timed on this process's clock, each in its own transaction like the worker's, in a
process whose heap is settled as a started worker's (`api/core/heap.py`).

Two scenarios, each on its own database, every rank's last beat dated on the wall clock:
- `restarting`: every rank last beat the heartbeat timeout plus 5 s ago, and an in-job restart began 10 s ago: all
  131,072 ranks are quiet past the timeout but none is silent (they get the initial timeout from the restart, and
  none was silent for the timeout when it began). Expected: no event.
- `hung`: every rank last beat the heartbeat timeout plus 5 s ago (a collective hang: a lost peer blocks every
  rank at once). Expected: one `hang_detected` per node (16,384), at most `MAX_NEW_HANGS_PER_PASS` (1,000) a
  pass, none after the last of them; none escalates (that takes twice the timeout).

The ground truth is this benchmark's: what it wrote and when; the events are counted in the database after the
passes. The target is the supervision period (2 s) for the whole pass; the duty is one of several in a pass.

    .venv/bin/python -m bench.silent_ranks            # ~2 min; --json OUT for the figures
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path

from bench.common import fresh_database, machine, running_job, table
from workers.supervision.detect_silent_ranks import MAX_NEW_HANGS_PER_PASS

RESTART_AGO_S = 10.0
QUIET_PAST_TIMEOUT_S = 5.0


@dataclass
class ScenarioFigures:
    scenario: str
    ranks: int
    nodes: int
    timeout_s: float
    pass_s: list[float] = field(default_factory=list)
    events_after: list[int] = field(default_factory=list)  # hang_detected stored after each pass
    escalated: bool = False

    @property
    def events_after_first(self) -> int:
        return self.events_after[0]

    @property
    def events_after_all(self) -> int:
        return self.events_after[-1]

    def passes(self, storing: bool) -> list[float]:
        """The passes' times, of those that stored hangs or of the others."""
        stored = (after - before for before, after in zip([0, *self.events_after], self.events_after, strict=False))
        return [s for s, new in zip(self.pass_s, stored, strict=True) if (new > 0) == storing]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=16384)
    p.add_argument("--procs", type=int, default=8, help="ranks per node")
    p.add_argument("--passes", type=int, default=None, help="passes a scenario (default: 2 past the last hang's)")
    p.add_argument("--database-url", default=None, help="PostgreSQL to create the run's databases in")
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.passes is None:
        args.passes = -(-args.nodes // MAX_NEW_HANGS_PER_PASS) + 2
    print(f"machine: {machine()}", flush=True)
    runs = [run(args, "restarting"), run(args, "hung")]
    print(report(runs))
    if args.json is not None:
        args.json.write_text(json.dumps([as_json(r) for r in runs], indent=2))
    restarting, hung = runs
    first = min(args.nodes, MAX_NEW_HANGS_PER_PASS)
    stored = min(args.nodes, args.passes * MAX_NEW_HANGS_PER_PASS)
    expected = restarting.events_after_all == 0 and (hung.events_after_first, hung.events_after_all) == (first, stored)
    return 0 if expected and not any(r.escalated for r in runs) else 1


def run(args: argparse.Namespace, scenario: str) -> ScenarioFigures:
    from api.core.db import reset_caches

    before = os.environ.get("FTPLANE_DATABASE_URL")
    collector = gc.get_threshold()
    try:
        with fresh_database(args.database_url, prefix="ftplane_bench_silent") as url:
            os.environ["FTPLANE_DATABASE_URL"] = url
            reset_caches()
            return _run(args, scenario)
    finally:  # the settings of whoever called (the smoke test runs this in the suite's process)
        gc.unfreeze()
        gc.set_threshold(*collector)
        if before is None:
            os.environ.pop("FTPLANE_DATABASE_URL", None)
        else:
            os.environ["FTPLANE_DATABASE_URL"] = before
        reset_caches()


def _run(args: argparse.Namespace, scenario: str) -> ScenarioFigures:
    from api.core import heap
    from api.core.db import get_sessionmaker, session_scope
    from api.database.tables import Event, Job
    from api.schemas.events import EventIn, EventType, utcnow
    from api.schemas.reports import NodeReport
    from api.services.ingest import reporting
    from api.services.ingest.liveness_writer import LivenessWriter
    from workers.supervision import detect_silent_ranks

    job_id, spec = running_job("silent-ranks-bench", args.nodes, args.procs)
    timeout = spec.resiliency.heartbeat_timeout_s
    figures = ScenarioFigures(scenario, spec.world_size, args.nodes, timeout)
    now = utcnow()
    last_beat = now - timedelta(seconds=timeout + QUIET_PAST_TIMEOUT_S)
    writer = LivenessWriter(period_s=3600.0, database=get_sessionmaker())  # flushed by hand
    for node in range(args.nodes):
        beats = [
            {"rank": rank, "step": 100, "ts": last_beat.isoformat(), "node": f"node-{node}"}
            for rank in range(node * args.procs, (node + 1) * args.procs)
        ]
        writer.add(job_id, NodeReport.model_validate({"attempt": 0, "node": f"node-{node}", "heartbeats": beats}))
    writer.flush()
    writer.stop()
    if scenario == "restarting":
        restart = EventIn(
            key="bench:restart",
            type=EventType.injob_restart,
            attempt=0,
            ts=now - timedelta(seconds=RESTART_AGO_S),
            details={"cause": "bench: a rank failed"},
        )
        with session_scope() as session:
            reporting.record_events(session, session.get_one(Job, job_id), [restart])

    heap.settle()  # as a started worker does before its first task

    def hangs() -> int:
        with session_scope() as session:
            kind = EventType.hang_detected.value
            return session.query(Event).filter(Event.job_id == job_id, Event.type == kind).count()

    for number in range(args.passes):
        started = time.perf_counter()
        with session_scope() as session:
            detect_silent_ranks.run_once(session)
        figures.pass_s.append(round(time.perf_counter() - started, 3))
        figures.events_after.append(hangs())
        print(f"  {scenario}: pass {number + 1} {figures.pass_s[-1]:.3f} s", flush=True)
    with session_scope() as session:
        figures.escalated = session.get_one(Job, job_id).attempt != 0
    return figures


def as_json(r: ScenarioFigures) -> dict[str, object]:
    return {**asdict(r), "events_after_first": r.events_after_first, "events_after_all": r.events_after_all}


def report(runs: list[ScenarioFigures]) -> str:
    rows = []

    def spread(passes: list[float]) -> str:
        return f"{len(passes)}: {statistics.median(passes):.2f} / {max(passes):.2f}" if passes else "0"

    for r in runs:
        rows.append(
            [
                r.scenario,
                f"{r.ranks:,}",
                f"{r.timeout_s:g}",
                spread(r.passes(storing=True)),
                spread(r.passes(storing=False)),
                r.events_after_first,
                r.events_after_all,
                "yes" if r.escalated else "no",
            ]
        )
    header = [
        "scenario",
        "ranks",
        "timeout s",
        "passes storing hangs: n: s p50 / max",
        "the other passes",
        "hangs after the first",
        "after all",
        "escalated",
    ]
    return table(header, rows)


if __name__ == "__main__":
    sys.exit(main())
