"""Several jobs at once: `Params.jobs` simulated jobs of `nodes` nodes, every node reporting at the same per-node
interval, training steadily (no fault story). Their agents start a fraction of an interval apart, each job's start a
burst of every rank's `running` event at once (unless `start_events` is off: liveness and heartbeats only); once
those are stored (or after STARTUP_S) and two more intervals, `duration_s` seconds are measured.

Inside that window one node of each job is cut off the network (its agent's reports fail to connect and are retried
with the product's backoff) for a while past the heartbeat timeout (`cut_length`), staggered across the jobs, and
healed before the silence could escalate: the simulator times cut -> the first `hang_detected` it sees. The
worker's log gives every supervision duty's time, so whether a pass over all the jobs fits in its period is read,
not assumed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.scale.controlplane import ControlPlane, Window, job_spec
from bench.scale.fleet import Fleet, iso, wait_quiet
from bench.scale.loop import LoopWatch
from bench.scale.one_job import all_events, duty_figures, event_figures, ingest_figures
from bench.scale.params import Params
from bench.scale.simulator import ENDED
from bench.scale.truth import Observer, Seen
from ftplane import contract

STARTUP_S = 120.0  # at most this long for every job's start-up events to be stored before the window


@dataclass
class JobRun:
    index: int
    job_id: str
    fleet: Fleet
    observer: Observer
    workdir: Path
    cut: float | None = None
    healed: float | None = None
    detected: Seen | None = None
    error: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)


async def run_jobs(p: Params, cp: ControlPlane, workdir: Path, baseline: dict[str, Any]) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {cp.admin}"}
    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(base_url=cp.url, headers=headers, timeout=120, limits=limits) as client:
        watch = LoopWatch()
        watch.start()
        runs = [await submit(p, cp, client, workdir, k) for k in range(p.jobs)]
        await asyncio.gather(*(launched(run) for run in runs))
        stepping = asyncio.create_task(step_all(p, [run.fleet for run in runs]))
        started = time.monotonic()
        started_wall = time.time()
        for run in runs:  # each job's start, a fraction of an interval after the previous one's
            await run.fleet.start(0)
            if p.start_events:
                send_running(p, run.fleet)
            await asyncio.sleep(p.report_interval_s / p.jobs)
        quiet = await asyncio.gather(*(wait_quiet(run.fleet, STARTUP_S) for run in runs))
        startup: dict[str, Any] = {"seconds": time.monotonic() - started, "all_stored": all(quiet)}
        startup["events_pending"] = sum([await run.fleet.pending_events() for run in runs])
        startup_ended = time.time()
        await asyncio.sleep(2 * p.report_interval_s)

        window = Window(cp.meter({"simulator": lambda: simulator_processes(runs)}))
        window.begin()
        for run in runs:
            run.fleet.measure(True)
        spacing = max(0.0, p.duration_s - cut_length(p) - 10) / p.jobs
        silences = [asyncio.create_task(partition(p, run, 5 + k * spacing)) for k, run in enumerate(runs)]
        await asyncio.sleep(p.duration_s)
        for run in runs:
            run.fleet.measure(False)
        window.end()
        await asyncio.gather(*silences)
        stepping.cancel()

        ends = (run.fleet.close(contract.exit_flush_s(p.report_interval_s, held=True), hold=True) for run in runs)
        await asyncio.gather(*ends)
        for run in runs:
            await run.fleet.collect()
        shard_samples = [sample for run in runs for sample in run.fleet.loop_samples]
        startup["loop"] = watch.between(started_wall, startup_ended, shard_samples)
        loop_lag = watch.between(window.started_wall, window.started_wall + window.elapsed, shard_samples)
        for run in runs:
            (run.workdir / "training-done").touch()
        await asyncio.gather(*(ended(run) for run in runs))
        for run in runs:
            events = await all_events(client, run.job_id)
            hangs = [(run.cut, (run.healed or time.time()) + p.heartbeat_timeout_s)] if run.cut else []
            job = (await client.get(f"/v1/jobs/{run.job_id}")).json()
            run.figures = {
                "status": job["status"],
                "attempts": job["attempt"] + 1,
                "events": event_figures(run.fleet, events, 0.0, hangs),
                "ingest": ingest_figures(run.fleet, window, {}, p.nodes),  # the API's CPU is shared: no cost per job
            }
    total = merged(runs)
    return {
        "params": vars(p),
        "baseline": baseline,
        "cpu": window.cpu,
        "startup": startup,
        "loop": loop_lag,
        "cut_s": cut_length(p),
        "ingest": ingest_figures(total, window, baseline, p.nodes * p.jobs),
        "duties": duty_figures(cp.duty_durations(), p.supervise_interval_s, window),
        "jobs": [
            {
                "job": run.index,
                "cut_s": run.cut - window.started_wall if run.cut else None,
                "detected_s": run.detected.at - run.cut if run.detected and run.cut else None,
                "ftplane_hang_ts_s": run.detected.claimed - run.cut
                if run.detected and run.detected.claimed and run.cut
                else None,
                "error": run.error,
                **run.figures,
            }
            for run in runs
        ],
        "events": {"lost": sum(run.figures["events"]["lost"] for run in runs)},
    }


async def launched(run: JobRun) -> None:
    with contextlib.suppress(TimeoutError):  # a job the control plane did not launch still gets its agents
        await run.observer.pod_started(0, 300)


async def ended(run: JobRun) -> None:
    with contextlib.suppress(TimeoutError):
        await run.observer.job_until("ended", lambda job: job["status"] in ENDED, 120)


async def submit(p: Params, cp: ControlPlane, client: httpx.AsyncClient, workdir: Path, k: int) -> JobRun:
    home = workdir / f"job{k}"
    marks = home / "marks"
    marks.mkdir(parents=True, exist_ok=True)
    created = await client.post("/v1/jobs", json=job_spec(p, home, f"scale-{k}", marks))
    created.raise_for_status()
    job_id, token = created.json()["id"], created.json()["token"]
    fleet = Fleet(p, cp.url, job_id, token, p.simulator_processes)
    return JobRun(k, job_id, fleet, Observer(client, job_id, p.poll_s, marks), home)


def send_running(p: Params, fleet: Fleet) -> None:
    """Every rank's `running` as its loop starts (the goodput's run start)."""
    ts = iso(time.time())
    for rank in range(p.ranks):
        event = {"key": f"sim:run:a0:r0:i0:{rank}", "type": "running", "ts": ts, "rank": rank, "step": 0}
        fleet.send(p.node_of(rank), {**event, "details": {"restart_count": 0, "iteration": 0, "start_step": 0}})


async def step_all(p: Params, fleets: list[Fleet]) -> None:
    """Every job's ranks step together, one step each `step_sim_s` simulated seconds."""
    step_real = p.real(p.step_sim_s)
    step = 0
    while True:
        await asyncio.sleep(step_real)
        step += 1
        now = time.time()
        for fleet in fleets:
            if fleet.started:
                fleet.stepped(step, now, step_real)


def cut_length(p: Params) -> float:
    """Long enough that a pass sees the node silent past the timeout (the silence starts at its last delivered
    heartbeat, up to an interval before the cut); short enough that, with the backoff's 5 s cap and an interval of
    slack, the silence ends before it lasts twice the timeout (an escalation). Half way between the two."""
    detect = p.heartbeat_timeout_s + p.supervise_interval_s + 1
    escalate = 2 * p.heartbeat_timeout_s - p.report_interval_s - 6
    return (detect + escalate) / 2 if escalate > detect else detect


async def partition(p: Params, run: JobRun, delay: float) -> None:
    """Cut one node off the network after `delay` s and heal it after `cut_length`; meanwhile look for the first
    `hang_detected` (until the silence could have escalated)."""
    await asyncio.sleep(delay)
    node = (run.index * 257 + 11) % p.nodes
    try:
        await run.observer.skip("hang_detected")
    except TimeoutError as exc:
        run.error = str(exc)
    run.fleet.partition(node, True)
    run.cut = time.time()

    async def detect() -> None:
        try:
            run.detected = await run.observer.first_event("hang_detected", 0, 2 * p.heartbeat_timeout_s)
        except TimeoutError as exc:
            run.error = str(exc)

    looking = asyncio.create_task(detect())
    await asyncio.sleep(cut_length(p))
    run.fleet.partition(node, False)
    run.healed = time.time()
    await looking


def merged(runs: list[JobRun]) -> Fleet:
    """One fleet's worth of counts over every job (for the totals)."""
    total = Fleet(runs[0].fleet.p, "", "total", "")
    for run in runs:
        total.tally.add(run.fleet.tally)
    return total


def simulator_processes(runs: list[JobRun]) -> list[psutil.Process]:
    """This process and every job's simulator processes."""
    return [psutil.Process(), *(process for run in runs for process in run.fleet.processes()[1:])]
