"""One simulated job with faults against the control plane, and the checks after it: ingest (node beats offered and
accepted, latency), CPU, supervision duty times, detection, events lost, and the goodput API against the ground
truth."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common import CpuSteps, percentile
from bench.load import LoadResult
from bench.scale.controlplane import ControlPlane, Window, job_spec
from bench.scale.counts import TIMELINE_S, keys_carried
from bench.scale.fleet import Fleet
from bench.scale.loop import LoopWatch
from bench.scale.params import BUCKETS, Params
from bench.scale.simulator import Simulation
from bench.scale.truth import parse


async def run_one_job(p: Params, cp: ControlPlane, workdir: Path, baseline: dict[str, Any]) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {cp.admin}"}
    async with httpx.AsyncClient(base_url=cp.url, headers=headers, timeout=60) as client:
        created = await client.post("/v1/jobs", json=job_spec(p, workdir, "scale-sim", workdir / "marks"))
        created.raise_for_status()
        job_id, token = created.json()["id"], created.json()["token"]
        watch = LoopWatch()
        watch.start()
        sim = Simulation(p, client, cp, job_id, token, workdir)
        cores = CpuSteps(sim.window.meter.groups, TIMELINE_S)
        cores.start()
        try:
            await sim.run()
        finally:
            sim.flag.touch()
            await sim.fleet.collect()
            cores.stop()
        window = sim.window
        t = time.perf_counter()
        goodput = (await client.get(f"/v1/jobs/{job_id}/goodput")).json()
        goodput_ms = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        events = await all_events(client, job_id)
        listing_s = time.perf_counter() - t
        job = (await client.get(f"/v1/jobs/{job_id}")).json()
    figures = {
        "params": vars(p),
        "baseline": baseline,
        "job": {"id": job["id"], "status": job["status"], "attempts": job["attempt"] + 1},
        "ingest": ingest_figures(sim.fleet, window, baseline, p.nodes),
        "cpu": window.cpu,
        "loop": watch.between(window.started_wall, window.started_wall + window.elapsed, sim.fleet.loop_samples),
        "duties": duty_figures(cp.duty_durations(), p.supervise_interval_s, window),
        "detection": detection_figures(sim),
        "events": event_figures(sim.fleet, events, listing_s, hang_windows(sim, p)),
        "aborted": sim.aborted,
        "goodput": goodput_figures(sim, goodput, goodput_ms) if sim.aborted is None else None,
        "faults": [vars(f) | {"at_s": f.injected - sim.launch} for f in sim.faults],
        "timeline": timeline_figures(sim.fleet, sim.launch, cores.steps),
    }
    return figures


async def all_events(client: httpx.AsyncClient, job_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = "0"
    while cursor:
        response = await client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000, "cursor": cursor})
        response.raise_for_status()
        page = response.json()
        items += page["items"]
        cursor = page["next_cursor"]
    return items


# ---- figures -------------------------------------------------------------------------------------


def ingest_figures(fleet: Fleet, window: Window, baseline: dict[str, Any], nodes: int) -> dict[str, Any]:
    """`nodes`: how many nodes the figures cover (the schedule asks nodes x window / interval node beats)."""
    tally = fleet.tally
    elapsed = max(window.elapsed, 1e-9)
    api_us = window.cpu.get("api", 0.0) * elapsed / max(tally.posts, 1) * 1e6
    scheduled = nodes * elapsed / fleet.p.report_interval_s
    return {
        "window_s": elapsed,
        "node_beats_scheduled": scheduled,
        "offered_of_scheduled": tally.ticks / scheduled,
        "node_beats_offered": tally.ticks,
        "node_beats_delivered": tally.delivered,
        "node_beats_delivered_by_shed": tally.delivered_by_shed,
        "node_beats_superseded": tally.superseded,
        # never carried by an accepted report, even by the agents' last flush: not delivered either
        "node_beats_unsettled": tally.ticks - tally.delivered - tally.superseded,
        "delivered_fraction": tally.delivered / tally.ticks if tally.ticks else float("nan"),
        "posts": tally.posts,
        "accepted": tally.accepted,
        "retried": tally.retried,
        "refused": tally.refused,
        "reasons": dict(tally.reasons),
        "reports_per_s": tally.accepted / elapsed,
        "rank_beats_per_s": tally.rank_beats / elapsed,
        "p50_ms": percentile(tally.post_s, 50) * 1000,
        "p99_ms": percentile(tally.post_s, 99) * 1000,
        "events_p50_ms": percentile(tally.post_events_s, 50) * 1000,
        "events_p99_ms": percentile(tally.post_events_s, 99) * 1000,
        "all_p99_ms": percentile(tally.post_s + tally.post_events_s, 99) * 1000,
        "max_ms": max(tally.post_s + tally.post_events_s, default=float("nan")) * 1000,
        "beat_age_p50_ms": percentile(tally.beat_age_s, 50) * 1000,
        "beat_age_p99_ms": percentile(tally.beat_age_s, 99) * 1000,
        "timer_lag_p99_ms": percentile(tally.lag_s, 99) * 1000,
        "api_us_per_report": api_us,
        "api_cost_vs_healthz": cost_ratio(api_us, baseline),
        "api_cost_vs_paced_healthz": cost_ratio(api_us, baseline.get("paced", {})),
        "api_cost_vs_per_node_healthz": cost_ratio(api_us, baseline.get("per_node", {})),
        "simulator_cores": window.simulator_cpu,
        "simulator_us_per_post": window.simulator_cpu * elapsed / max(tally.posts, 1) * 1e6,
    }


def cost_ratio(api_us: float, baseline: dict[str, Any]) -> float | None:
    """The API's CPU per report over its CPU per GET /healthz in `baseline` (None without one)."""
    return api_us / baseline["api_us_per_request"] if baseline.get("api_us_per_request") else None


def timeline_figures(fleet: Fleet, launch: float, cores: dict[int, dict[str, float]]) -> list[dict[str, Any]]:
    """What became of the agents' POSTs, step by step from the launch, and the cores each part used in the step:
    [{"at_s": s, what: count, ..., "cores": {part: cores}}]."""
    steps: dict[int, dict[str, Any]] = {}
    for (at, what), count in sorted(fleet.tally.timeline.items()):
        steps.setdefault(at, {"at_s": at - int(launch)})[what] = count
    for at, step in steps.items():
        step["cores"] = cores.get(at, {})
    return list(steps.values())


def baseline_figures(result: LoadResult, cpu: dict[str, float]) -> dict[str, Any]:
    done = len(result.latencies_ms)
    return {
        "requests_per_s": done / result.elapsed_s,
        "p50_ms": result.p(50),
        "p99_ms": result.p(99),
        "errors": result.errors,
        "api_cores": cpu.get("api", 0.0),
        "api_us_per_request": cpu.get("api", 0.0) * result.elapsed_s / max(done, 1) * 1e6,
        "loadgen_cores": result.cpu_cores,
        "other_cores": cpu.get("other", 0.0),
        "connections": result.connections,
    }


def duty_figures(durations: dict[str, list[tuple[datetime, float]]], period_s: float, window: Window) -> dict[str, Any]:
    """Per duty, over the runs that ended inside the window: runs, median, p99 and max seconds; and whole passes
    (every duty's run in one beat period, run one after another by the worker) against the period."""
    lo = datetime.fromtimestamp(window.started_wall)  # the worker logs local time
    hi = datetime.fromtimestamp(window.started_wall + window.elapsed)
    durations = {duty: [(at, s) for at, s in runs if lo <= at <= hi] for duty, runs in durations.items()}
    durations = {duty: runs for duty, runs in durations.items() if runs}
    out: dict[str, Any] = {"period_s": period_s, "duties": {}}
    passes: dict[int, float] = {}
    first = min((at for runs in durations.values() for at, _ in runs), default=None)
    for duty, runs in sorted(durations.items()):
        seconds = [s for _, s in runs]
        out["duties"][duty] = {
            "runs": len(seconds),
            "median_s": statistics.median(seconds),
            "p99_s": percentile(seconds, 99),
            "max_s": max(seconds),
        }
        for at, s in runs:
            assert first is not None
            cycle = int((at - first).total_seconds() // period_s)
            passes[cycle] = passes.get(cycle, 0.0) + s
    sums = list(passes.values())
    out["pass_p50_s"] = percentile(sums, 50)
    out["pass_p99_s"] = percentile(sums, 99)
    out["pass_max_s"] = max(sums, default=float("nan"))
    out["passes_over_period"] = sum(s > period_s for s in sums)
    out["passes"] = len(sums)
    return out


def detection_figures(sim: Simulation) -> dict[str, Any]:
    rows = []
    for f in sim.faults:
        if f.kind != "silent_node" or f.detected is None:
            continue
        rows.append(
            {
                "detected_s": f.detected.at - f.injected,
                "ftplane_hang_ts_s": (f.detected.claimed or f.injected) - f.injected,
                "escalated_s": f.escalated.at - f.injected if f.escalated else None,
                "pod_started_s": f.pod_started - f.injected if f.pod_started else None,
                "resumed_s": f.resumed - f.injected if f.resumed else None,
            }
        )
    return {"silent_nodes": rows, "timeout_s": sim.p.heartbeat_timeout_s, "interval_s": sim.p.report_interval_s}


def hang_windows(sim: Simulation, p: Params) -> list[tuple[float, float]]:
    """Where a hang_detected is called for: a silent node's silence, until its next run plus a timeout (the passes
    that were under way). A crash or transient fault reports itself; a hang around one is false."""
    end = sim.end or time.time()
    return [(f.injected, (f.resumed or end) + p.heartbeat_timeout_s) for f in sim.faults if f.kind == "silent_node"]


def event_figures(
    fleet: Fleet, events: list[dict[str, Any]], listing_s: float, silences: list[tuple[float, float]]
) -> dict[str, Any]:
    """Every key handed to an agent must be stored, with the ts it carried; refused ones count as lost."""
    ledger = fleet.ledger
    stored = {k: e for e in events for k in keys_carried(e)}
    expected = {k: ts for k, ts in ledger.offered.items() if k not in ledger.died}
    missing = [k for k in expected if k not in stored]
    moved = [k for k, ts in expected.items() if k in stored and abs(parse(stored[k]["ts"]) - parse(ts)) > 1e-3]
    hangs = [e for e in events if e["type"] == "hang_detected"]
    false = [e for e in hangs if not any(lo <= parse(e["ts"]) <= hi for lo, hi in silences)]
    return {
        "sent": len(expected),
        "died_with_a_frozen_node": len(ledger.died),
        "missing": len(missing),
        "missing_by_kind": dict(Counter(kind_of(k) for k in missing).most_common()),
        "timestamp_changed": len(moved),
        "refused": len(ledger.refused),
        "lost": len(missing) + len(moved) + len(ledger.refused & set(expected)),
        "stored_for_job": len(events),
        "hang_detected": len(hangs),
        "false_hang_detected": len(false),
        "listing_s": listing_s,
    }


def kind_of(key: str) -> str:
    """What an event key of the simulator's names, without its rank: `sim:run:a1:r0:i0:77` -> `sim:run:a1:r0:i0`."""
    parts = key.split(":")
    return ":".join(parts[:-1]) if parts[:2] == ["sim", "run"] else ":".join(parts[:2])


def goodput_figures(sim: Simulation, goodput: dict[str, Any], goodput_ms: float) -> dict[str, Any]:
    wall = sim.end - sim.launch
    truth = sim.truth.totals(sim.launch, sim.end)
    measured = {"productive": goodput["productive_s"], **goodput["lost_s"]}
    return {
        "api_ms": goodput_ms,
        "ettr": goodput["ettr"],
        "truth_ettr": truth["productive"] / wall,
        "wall_s": goodput["wall_s"],
        "truth_wall_s": wall,
        "buckets": {b: {"ftplane": measured.get(b, 0.0), "truth": truth[b]} for b in BUCKETS},
        "failures": goodput["failures"],
        "advice": goodput["advice"],
    }
