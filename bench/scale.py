"""Scale benchmark: a simulated 2,048-node x 8-GPU job (16,384 ranks) against the real control plane,
with faults at a published failure rate, time-compressed. The method is in bench/README.md.

Real: the control plane (uvicorn API with 2 workers, Celery worker + beat supervising every 2 s,
PostgreSQL, Redis), its HTTP ingest, silent-rank detection, job-level restarts, the local backend
launching each attempt under real ft_launcher, and the goodput API.
Simulated: the 16,384 ranks (no training), ft_launcher's and NVRx's recoveries, the faults, step and
checkpoint times. The simulator posts what the trainer and launcher would (rank_failed, injob_restart,
inprocess_restart, checkpoint_saved, checkpoint_loaded, a running event per rank per run) and keeps
the ground truth of where the time went.

Figures: ingest headroom (offered vs achieved rank-beats/s, POST latency, CPU of each server part),
detection latency under load (silent-node fault -> hang_detected -> job_restart), events lost
(every key the simulator sent must be in the API with its timestamp), and the ETTR the goodput API
reports against the simulator's ground truth, bucket by bucket.

Usage: python -m bench.scale [--sim-hours 3] [--compression 60] [--seed 2026] [--mix crash=0.6,...] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
from sqlalchemy.engine import make_url

from bench.common import (
    ROOT,
    CpuMeter,
    create_admin_token,
    fresh_database,
    machine,
    percentile,
    postgres_processes,
    server_env,
    table,
    uvicorn_api,
)

# Published: jobs of 1,024 GPUs see a mean time to failure of 7.9 h (Meta's research clusters,
# "Revisiting Reliability in Large-Scale Machine Learning Research Clusters", arXiv 2410.21680). Failures of
# independent parts add up, so MTTF scales as 1 / GPUs: 7.9 h x 1024 / 16384 = 29.6 min.
MTTF_1024_GPUS_H = 7.9
BUCKETS = ("productive", "initialization", "checkpoint_stall", "fault_detection", "restart", "recompute", "shutdown")


@dataclass
class Params:
    nodes: int = 2048
    gpus_per_node: int = 8
    rack_nodes: int = 128  # one aggregated heartbeat POST per rack of nodes per report interval
    compression: float = 60.0  # simulated seconds per real second
    sim_hours: float = 3.0
    mttf_1024_h: float = MTTF_1024_GPUS_H
    report_interval_s: float = 1.0  # real
    heartbeat_timeout_s: float = 10.0  # real (the spec's; 10 simulated minutes at 60x)
    supervise_interval_s: float = 2.0  # real, the product's default
    step_sim_s: float = 6.0
    checkpoint_interval_steps: int = 100
    checkpoint_blocking_sim_s: float = 6.0
    checkpoint_total_sim_s: float = 60.0
    checkpoint_load_sim_s: float = 30.0
    init_sim_s: float = 300.0  # first start at scale: pods, NCCL init, model build
    inprocess_sim_s: float = 30.0  # NVRx in-process restart
    injob_sim_s: float = 120.0  # ft_launcher in-job restart: teardown, restart, rendezvous
    job_restart_startup_sim_s: float = 300.0  # after ftplane's job_restart: new pods scheduled, started
    mix: tuple[tuple[str, float], ...] = (("crash", 0.60), ("silent_node", 0.25), ("transient", 0.15))
    seed: int = 2026
    api_workers: int = 2

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def mttf_sim_s(self) -> float:
        return self.mttf_1024_h * 3600 * 1024 / self.ranks

    def real(self, sim_s: float) -> float:
        return sim_s / self.compression


# ---- the control plane ---------------------------------------------------------------------------


@dataclass
class ControlPlane:
    url: str
    admin: str
    database: str
    api: Any
    worker: subprocess.Popen[bytes]
    beat: subprocess.Popen[bytes]


@contextlib.contextmanager
def control_plane(p: Params, workdir: Path, database_url: str | None, redis_url: str) -> Iterator[ControlPlane]:
    with fresh_database(database_url, prefix="ftplane_scale") as db:
        admin = create_admin_token(db)
        extra = {
            "FTPLANE_REDIS_URL": redis_url,
            "FTPLANE_QUEUE": f"ftplane-scale-{uuid.uuid4().hex[:8]}",  # the Redis may be shared
            "FTPLANE_SUPERVISE_INTERVAL_S": str(p.supervise_interval_s),
        }
        with uvicorn_api(db, workdir, workers=p.api_workers, env=extra) as api:
            extra["FTPLANE_PUBLIC_URL"] = api.url
            env = server_env(db, workdir / ".ftplane", **extra)
            logs = {part: (workdir / f"{part}.log").open("wb") for part in ("worker", "beat")}

            def serve(part: str, cwd: Path) -> subprocess.Popen[bytes]:
                command = [sys.executable, "-m", "ftplane.cli", "serve", "--only", part]
                return subprocess.Popen(command, env=env, cwd=cwd, stdout=logs[part], stderr=subprocess.STDOUT)

            worker = serve("worker", ROOT)
            beat = serve("beat", workdir)
            try:
                yield ControlPlane(api.url, admin, make_url(db).database or "", api, worker, beat)
            finally:
                for proc in (beat, worker):
                    proc.terminate()
                for proc in (beat, worker):
                    try:
                        proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                for log in logs.values():
                    log.close()


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


# ---- the node agents (their own process) ---------------------------------------------------------

# Shared with the agents: [beating (0/1), attempt, step, stop (0/1)]
BEATING, ATTEMPT, STEP, STOP = range(4)


@dataclass
class AgentStats:
    slots: int = 0  # (rack, interval) pairs while beating: what was offered
    late: int = 0  # slots missed because the rack's previous POST had not come back
    posts: int = 0
    errors: int = 0
    beats_offered: int = 0
    beats_accepted: int = 0
    beating_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    cpu_s: float = 0.0


def agents_main(url: str, path: str, token: str, p: Params, shared: Any, out: Any) -> None:
    started = time.process_time()
    stats = asyncio.run(_agents(url, path, token, p, shared))
    stats.cpu_s = time.process_time() - started
    out.put(stats)


def rack_template(p: Params, rack: int) -> bytes:
    first = rack * p.rack_nodes * p.gpus_per_node
    last = min(p.ranks, first + p.rack_nodes * p.gpus_per_node)
    beats = ",".join(
        f'{{"rank":{r},"step":@STEP@,"ts":"@TS@","node":"node-{r // p.gpus_per_node:04d}"}}' for r in range(first, last)
    )
    return ('{"attempt":@ATTEMPT@,"heartbeats":[' + beats + "]}").encode()


async def _agents(url: str, path: str, token: str, p: Params, shared: Any) -> AgentStats:
    import aiohttp

    stats = AgentStats()
    racks = math.ceil(p.nodes / p.rack_nodes)
    templates = [rack_template(p, r) for r in range(racks)]
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(url, headers=headers, timeout=timeout) as session:

        async def rack_loop(rack: int) -> None:
            # Racks report spread over the interval, as independent agents would.
            next_tick = time.monotonic() + p.report_interval_s * rack / racks
            while not shared[STOP]:
                await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
                next_tick += p.report_interval_s
                if not shared[BEATING]:
                    continue
                size = templates[rack].count(b'"rank"')
                stats.slots += 1
                stats.beats_offered += size
                body = (
                    templates[rack]
                    .replace(b"@STEP@", str(int(shared[STEP])).encode())
                    .replace(b"@ATTEMPT@", str(int(shared[ATTEMPT])).encode())
                    .replace(b"@TS@", datetime.now(UTC).isoformat().encode())
                )
                t = time.perf_counter()
                try:
                    async with session.post(path, data=body) as response:
                        await response.read()
                        status = response.status
                except (aiohttp.ClientError, TimeoutError):
                    status = 0
                stats.latencies_ms.append((time.perf_counter() - t) * 1000)
                stats.posts += 1
                stats.statuses[status] = stats.statuses.get(status, 0) + 1
                if status == 200:
                    stats.beats_accepted += size
                else:
                    stats.errors += 1
                while next_tick < time.monotonic():  # the POST outlived its interval: those slots are missed
                    next_tick += p.report_interval_s
                    if shared[BEATING]:
                        stats.late += 1
                        stats.slots += 1
                        stats.beats_offered += size

        async def clock() -> None:
            while not shared[STOP]:
                t = time.monotonic()
                await asyncio.sleep(0.1)
                if shared[BEATING]:
                    stats.beating_s += time.monotonic() - t

        await asyncio.gather(clock(), *(rack_loop(r) for r in range(racks)))
    return stats


# ---- events, as the trainer and launcher send them -----------------------------------------------


class EventSender:
    """Sends events in order, in batches of at most 1,000, retrying a batch with the same keys until
    it is accepted. Keeps every key it sent and the timestamp it gave."""

    def __init__(self, client: httpx.AsyncClient, job_id: str):
        self.client = client
        self.path = f"/v1/jobs/{job_id}/events"
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent: dict[str, str] = {}
        self.retries = 0
        self.refused: list[str] = []
        self.posts = 0
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    def send(self, event: dict[str, Any]) -> None:
        self.queue.put_nowait(event)

    async def _run(self) -> None:
        while True:
            batch = [await self.queue.get()]
            while len(batch) < 1000 and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            delay = 0.2
            while True:
                try:
                    response = await self.client.post(self.path, json={"events": batch})
                    status = response.status_code
                except httpx.TransportError:
                    status = 0
                self.posts += 1
                if status == 200:
                    self.sent.update({e["key"]: e["ts"] for e in batch})
                    break
                if 400 <= status < 500 and status not in (408, 429):
                    self.refused += [e["key"] for e in batch]
                    break
                self.retries += 1
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)
            for _ in batch:
                self.queue.task_done()

    async def drain(self) -> None:
        await self.queue.join()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def parse(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


# ---- the simulation ------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    at: float
    step: int
    rank: int
    resumed_from: int = 0
    detected_at: float | None = None  # hang_detected (silent nodes)
    job_restart_at: float | None = None
    resumed_at: float | None = None


@dataclass
class Truth:
    """Where the time went, as the simulator knows it: labelled real-time intervals."""

    intervals: list[tuple[float, float, str]] = field(default_factory=list)

    def add(self, start: float, end: float, bucket: str) -> None:
        if end > start:
            self.intervals.append((start, end, bucket))

    def totals(self, lo: float, hi: float) -> dict[str, float]:
        out = dict.fromkeys(BUCKETS, 0.0)
        for start, end, bucket in self.intervals:
            part = min(end, hi) - max(start, lo)
            if part > 0:
                out[bucket] += part
        return out


class Simulation:
    def __init__(self, p: Params, cp: ControlPlane, workdir: Path):
        self.p = p
        self.cp = cp
        self.workdir = workdir
        self.rng = random.Random(p.seed)
        self.truth = Truth()
        self.faults: list[Fault] = []
        self.attempt = 0
        self.restart_count = 0
        self.iteration = 0
        self.step = 0
        self.high = 0  # highest step completed
        self.saves: list[tuple[float, int]] = []  # (completed at, step)
        self.pending_save: tuple[float, int] | None = None  # (completes at, step)
        self.flag = workdir / "training-done"
        self.shared: Any = multiprocessing.get_context("spawn").RawArray("d", 4)
        self.run_starts: list[float] = []
        self.deck: list[str] = []
        self.run_saved: set[int] = set()

    # -- helpers --

    def now(self) -> float:
        return time.time()

    async def sleep_until(self, t: float) -> None:
        await asyncio.sleep(max(0.0, t - self.now()))

    def latest_checkpoint(self, at: float) -> int:
        done = [step for completed, step in self.saves if completed <= at]
        return max(done, default=0)

    def run_events(self, at: float, start_step: int) -> None:
        """What every rank reports when its training loop starts (and rank 0's checkpoint load before)."""
        if start_step > 0:
            load = self.p.real(self.p.checkpoint_load_sim_s)
            self.events.send(
                {
                    "key": f"sim:load:a{self.attempt}:r{self.restart_count}:i{self.iteration}",
                    "type": "checkpoint_loaded",
                    "ts": iso(at - 0.001),
                    "attempt": self.attempt,
                    "rank": 0,
                    "step": start_step,
                    "details": {"step": start_step, "load_s": round(load, 4)},
                }
            )
        details = {"restart_count": self.restart_count, "iteration": self.iteration, "start_step": start_step}
        for rank in range(self.p.ranks):
            self.events.send(
                {
                    "key": f"sim:run:a{self.attempt}:r{self.restart_count}:i{self.iteration}:{rank}",
                    "type": "running",
                    "ts": iso(at),
                    "attempt": self.attempt,
                    "rank": rank,
                    "node": f"node-{rank // self.p.gpus_per_node:04d}",
                    "step": start_step,
                    "details": {**details, "world_size": self.p.ranks},
                }
            )

    # -- the story --

    async def run(self, client: httpx.AsyncClient, job_id: str, token: str) -> dict[str, Any]:
        p = self.p
        self.client = client
        self.job_id = job_id
        self.events = EventSender(client, job_id)
        self.events.start()
        out: Any = multiprocessing.get_context("spawn").Queue()
        agents = multiprocessing.get_context("spawn").Process(
            target=agents_main, args=(self.cp.url, f"/v1/jobs/{job_id}/heartbeats", token, p, self.shared, out)
        )
        agents.start()
        self.agents_pid = agents.pid
        try:
            launched = await self.wait_for_event("submitted", 0, after=0.0, timeout=120)
            self.launch = launched
            end = launched + p.real(p.sim_hours * 3600)
            # initialization: processes start, NCCL initializes, the model is built
            start = max(self.now(), launched + p.real(p.init_sim_s))
            await self.sleep_until(start)
            self.truth.add(launched, start, "initialization")
            await self.train_from(start, 0, end)
            self.shared[STOP] = 1
            agents.join(timeout=30)
            stats: AgentStats = out.get(timeout=30)
        finally:
            self.shared[STOP] = 1
            self.flag.touch()
            if agents.is_alive():
                agents.kill()
        await self.events.drain()
        return {"agents": stats}

    async def train_from(self, start: float, start_step: int, end: float) -> None:
        """Runs until the end of the simulated time: training, faults and their recoveries."""
        p = self.p
        step_real = p.real(p.step_sim_s)
        while True:
            # A run starts: every rank reports `running`; heartbeats resume.
            self.step = start_step
            self.run_events(start, start_step)
            self.run_starts.append(start)
            self.shared[ATTEMPT] = self.attempt
            self.shared[STEP] = self.step
            self.shared[BEATING] = 1
            self.t = start
            self.fault_at = start + self.rng.expovariate(1.0 / p.real(p.mttf_sim_s))
            self.end_at = end
            saved_step = start_step  # the step resumed from is saved already
            self.run_saved = {start_step}
            while True:
                if self.step % p.checkpoint_interval_steps == 0 and self.step != saved_step:
                    saved_step = self.step
                    if not await self.save():
                        break
                bucket = "recompute" if self.step + 1 <= self.high else "productive"
                if not await self.advance(self.t + step_real, bucket):
                    break
                self.step += 1
                self.high = max(self.high, self.step)
                self.shared[STEP] = self.step
                self.complete_save(self.t)
            if self.t >= self.end_at and self.t < self.fault_at:
                await self.finish()
                return
            fault = self.new_fault(self.t)
            start, start_step = await self.recover(fault)

    async def advance(self, until: float, bucket: str) -> bool:
        """Spend time in `bucket` up to `until`; False when a fault or the end comes first (time stops there)."""
        stop = min(until, self.fault_at, self.end_at)
        self.truth.add(self.t, stop, bucket)
        self.t = stop
        await self.sleep_until(stop)
        return stop >= until

    async def save(self) -> bool:
        """A checkpoint of the current step: wait for the save in flight (one at a time), then block."""
        if self.pending_save is not None and self.pending_save[0] > self.t:
            if not await self.advance(self.pending_save[0], "checkpoint_stall"):
                return False
            self.complete_save(self.t)
        begin = self.t
        self.run_saved.add(self.step)
        if not await self.advance(begin + self.p.real(self.p.checkpoint_blocking_sim_s), "checkpoint_stall"):
            return False
        self.pending_save = (begin + self.p.real(self.p.checkpoint_total_sim_s), self.step)
        return True

    def complete_save(self, t: float) -> None:
        if self.pending_save is not None and self.pending_save[0] <= t:
            completed, step = self.pending_save
            self.pending_save = None
            self.saves.append((completed, step))
            self.events.send(
                {
                    "key": f"sim:ckpt:{step}:a{self.attempt}:r{self.restart_count}:i{self.iteration}",
                    "type": "checkpoint_saved",
                    "ts": iso(completed),
                    "attempt": self.attempt,
                    "rank": 0,
                    "step": step,
                    "details": {
                        "step": step,
                        "blocking_s": round(self.p.real(self.p.checkpoint_blocking_sim_s), 4),
                        "total_s": round(self.p.real(self.p.checkpoint_total_sim_s), 4),
                        "bytes": 16 * 10**9 * 12,
                        "engine": "async",
                    },
                }
            )

    def next_kind(self) -> str:
        """Kinds are dealt from a shuffled deck of 20 cards in the mix's proportions, so a run of a few
        faults still sees each kind about as often as the mix says (independent draws often would not)."""
        if not self.deck:
            total = sum(w for _, w in self.p.mix)
            for kind, weight in self.p.mix:
                self.deck += [kind] * max(1, round(20 * weight / total))
            self.rng.shuffle(self.deck)
        return self.deck.pop()

    def new_fault(self, at: float) -> Fault:
        kind = self.next_kind()
        fault = Fault(kind, at, self.step, self.rng.randrange(self.p.ranks))
        self.complete_save(at)
        if self.pending_save is not None and self.pending_save[0] > at:
            self.pending_save = None  # the save in flight never completes
        self.faults.append(fault)
        print(f"  {at - self.launch:7.1f} s  fault: {kind} at step {self.step} (rank {fault.rank})", flush=True)
        return fault

    async def recover(self, fault: Fault) -> tuple[float, int]:
        """Act out the recovery; returns (when the next run starts, its start step)."""
        p = self.p
        await self.sleep_until(fault.at)
        self.shared[BEATING] = 0
        resume = self.latest_checkpoint(fault.at)
        fault.resumed_from = resume
        if fault.kind in ("crash", "transient"):
            # The rank reports its own failure: onset and detection are the same moment.
            self.events.send(
                {
                    "key": f"sim:fail:{len(self.faults)}",
                    "type": "rank_failed",
                    "ts": iso(fault.at),
                    "attempt": self.attempt,
                    "rank": fault.rank,
                    "node": f"node-{fault.rank // p.gpus_per_node:04d}",
                    "step": fault.step,
                    "details": {
                        "cause": "RuntimeError: CUDA error: an illegal memory access was encountered"
                        if fault.kind == "crash"
                        else "RuntimeError: NCCL communicator was aborted",
                        "first_to_fail": True,
                        "iteration": self.iteration,
                        "inprocess": fault.kind == "transient",
                    },
                }
            )
            fault.detected_at = fault.at
            cost = p.real(p.injob_sim_s if fault.kind == "crash" else p.inprocess_sim_s)
            restarted = fault.at + 0.6 * cost  # the new processes (or the re-entered loop) start
            start = fault.at + cost
            if fault.kind == "crash":
                self.restart_count += 1
                self.iteration = 0
                restart = {
                    "key": f"injob_restart:{self.job_id}:{self.attempt}:{self.restart_count}",
                    "type": "injob_restart",
                    "details": {"restart_count": self.restart_count},
                }
            else:
                self.iteration += 1
                restart = {
                    "key": f"inprocess_restart:{self.job_id}:{self.attempt}:{self.restart_count}:{self.iteration}",
                    "type": "inprocess_restart",
                    "details": {"iteration": self.iteration, "restart_count": self.restart_count},
                }
            await self.sleep_until(restarted)
            self.events.send({**restart, "ts": iso(restarted), "attempt": self.attempt, "rank": 0})
            await self.sleep_until(start)
            self.truth.add(fault.at, start, "restart")
        else:
            # A silent node: nothing is reported; ftplane must notice the silence and restart the job.
            timeout = 2 * p.heartbeat_timeout_s + 4 * p.supervise_interval_s + 30
            fault.detected_at = await self.wait_for_event(
                "hang_detected", self.attempt, after=fault.at, timeout=timeout
            )
            fault.job_restart_at = await self.wait_for_event(
                "job_restart", self.attempt + 1, after=fault.at, timeout=timeout
            )
            await self.wait_for_event("submitted", self.attempt + 1, after=fault.at, timeout=60)
            self.attempt += 1
            self.restart_count = 0
            self.iteration = 0
            start = max(self.now(), fault.job_restart_at + p.real(p.job_restart_startup_sim_s))
            await self.sleep_until(start)
            self.truth.add(fault.at, fault.detected_at, "fault_detection")
            self.truth.add(fault.detected_at, start, "restart")
        fault.resumed_at = start
        print(
            f"  {start - self.launch:7.1f} s  resumed from step {resume} "
            f"(attempt {self.attempt}, restart {self.restart_count}, iteration {self.iteration})",
            flush=True,
        )
        return start, resume

    async def finish(self) -> None:
        """The end of the simulated time: the final save (the trainer always saves the final state), then
        the processes exit and the supervisor records `succeeded`."""
        self.fault_at = math.inf
        self.end_at = math.inf
        self.complete_save(self.t)
        if self.step not in self.run_saved:  # like the trainer: no second save of the same step
            if self.pending_save is not None:  # one save at a time: wait for the one in flight
                await self.advance(self.pending_save[0], "checkpoint_stall")
                self.complete_save(self.t)
            await self.save()
        self.shared[BEATING] = 0
        unblocked = self.t
        if self.pending_save is not None:
            await self.sleep_until(self.pending_save[0])
            self.complete_save(self.pending_save[0])
        self.flag.touch()  # the ranks exit; ft_launcher exits 0; the supervisor records `succeeded`
        succeeded = await self.wait_for_event("succeeded", None, after=0.0, timeout=120)
        self.truth.add(unblocked, succeeded, "shutdown")
        self.end = succeeded
        print(f"  {succeeded - self.launch:7.1f} s  succeeded at step {self.step}", flush=True)

    async def wait_for_event(self, type_: str, attempt: int | None, *, after: float, timeout: float) -> float:
        """The ts of the first `type_` event (of `attempt`, when given) after `after`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            response = await self.client.get(
                f"/v1/jobs/{self.job_id}/events", params={"type": type_, "since": iso(after), "limit": 10}
            )
            if response.status_code == 200:
                for item in response.json()["items"]:
                    if attempt is None or item["attempt"] == attempt:
                        return parse(item["ts"])
            await asyncio.sleep(0.25)
        raise TimeoutError(f"no {type_} event (attempt {attempt}) within {timeout:.0f} s")


# ---- checks after the run ------------------------------------------------------------------------


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


def false_hangs(events: list[dict[str, Any]], sim: Simulation, p: Params) -> int:
    """hang_detected events outside every silence the simulator caused (a lagging ingest would cause them)."""
    windows = []
    for f in sim.faults:
        windows.append((f.at, (f.resumed_at or f.at) + 2 * p.heartbeat_timeout_s))
    count = 0
    for e in events:
        if e["type"] == "hang_detected":
            t = parse(e["ts"])
            if not any(lo <= t <= hi for lo, hi in windows):
                count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sim-hours", type=float, default=Params.sim_hours)
    parser.add_argument("--compression", type=float, default=Params.compression)
    parser.add_argument("--nodes", type=int, default=Params.nodes)
    parser.add_argument("--rack-nodes", type=int, default=Params.rack_nodes)
    parser.add_argument("--mttf-1024-h", type=float, default=Params.mttf_1024_h)
    parser.add_argument("--report-interval", type=float, default=Params.report_interval_s)
    parser.add_argument("--heartbeat-timeout", type=float, default=Params.heartbeat_timeout_s)
    parser.add_argument("--seed", type=int, default=Params.seed)
    parser.add_argument(
        "--mix", default=",".join(f"{k}={w:g}" for k, w in Params.mix), help="fault kinds and their weights"
    )
    parser.add_argument("--database-url")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--workdir", type=Path, help="keep the logs and state here (default: a temporary directory)")
    args = parser.parse_args(argv)
    p = Params(
        nodes=args.nodes,
        rack_nodes=args.rack_nodes,
        compression=args.compression,
        sim_hours=args.sim_hours,
        mttf_1024_h=args.mttf_1024_h,
        report_interval_s=args.report_interval,
        heartbeat_timeout_s=args.heartbeat_timeout,
        seed=args.seed,
        mix=tuple((k, float(w)) for k, w in (item.split("=") for item in args.mix.split(","))),
    )
    print(f"machine: {machine()}")
    print(
        f"simulated job: {p.nodes} nodes x {p.gpus_per_node} GPUs = {p.ranks} ranks; MTTF {p.mttf_sim_s / 60:.1f} "
        f"simulated min ({p.mttf_1024_h:g} h at 1,024 GPUs, scaled); {p.sim_hours:g} simulated h at "
        f"{p.compression:g}x = {p.real(p.sim_hours * 3600):.0f} s; heartbeats: one POST per {p.rack_nodes} nodes "
        f"every {p.report_interval_s:g} s",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="ftplane-scale-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(run(p, workdir, args))
    print()
    print(result["report"])
    if args.json:
        args.json.write_text(json.dumps(result["figures"], indent=2, default=str))
    return 0 if result["figures"]["events_lost"] == 0 else 1


async def run(p: Params, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    with control_plane(p, workdir, args.database_url, args.redis_url) as cp:
        meter = CpuMeter(
            {
                "api": cp.api.processes,
                "worker": lambda: tree(cp.worker.pid),
                "beat": lambda: tree(cp.beat.pid),
                "postgres": lambda: postgres_processes(cp.database),
            }
        )
        headers = {"Authorization": f"Bearer {cp.admin}"}
        async with httpx.AsyncClient(base_url=cp.url, headers=headers, timeout=60) as client:
            sim = Simulation(p, cp, workdir)
            spec = {
                "name": "scale-sim",
                "command": [
                    "python",
                    "-c",
                    f"import os, time\nwhile not os.path.exists({str(sim.flag)!r}): time.sleep(0.5)",
                ],
                "procs_per_node": 1,
                "checkpoint": {
                    "dir": str(workdir / "checkpoints"),
                    "interval_steps": p.checkpoint_interval_steps,
                    "engine": "async",
                },
                "resiliency": {
                    "max_in_job_restarts": 10_000,
                    "max_job_restarts": 100,
                    "initial_heartbeat_timeout_s": 120,
                    "heartbeat_timeout_s": p.heartbeat_timeout_s,
                },
                "labels": {"bench": "scale", "simulated-ranks": str(p.ranks)},
            }
            created = await client.post("/v1/jobs", json=spec)
            created.raise_for_status()
            job_id, token = created.json()["id"], created.json()["token"]
            meter.start()
            controller_cpu = time.process_time()
            try:
                outcome = await sim.run(client, job_id, token)
            finally:
                sim.flag.touch()
            stats: AgentStats = outcome["agents"]
            elapsed = max(1e-9, time.monotonic() - meter.started)
            agents_cpu = stats.cpu_s / elapsed
            controller = (time.process_time() - controller_cpu) / elapsed
            cpu = meter.stop(extra=agents_cpu + controller)
            cpu["controller"] = controller
            t = time.perf_counter()
            goodput = (await client.get(f"/v1/jobs/{job_id}/goodput")).json()
            goodput_ms = (time.perf_counter() - t) * 1000
            t = time.perf_counter()
            events = await all_events(client, job_id)
            listing_s = time.perf_counter() - t
            job = (await client.get(f"/v1/jobs/{job_id}")).json()
    return evaluate(p, sim, stats, cpu, agents_cpu, goodput, goodput_ms, events, listing_s, job)


def evaluate(
    p: Params,
    sim: Simulation,
    stats: AgentStats,
    cpu: dict[str, float],
    agents_cpu: float,
    goodput: dict[str, Any],
    goodput_ms: float,
    events: list[dict[str, Any]],
    listing_s: float,
    job: dict[str, Any],
) -> dict[str, Any]:
    stored = {e["key"]: e for e in events}
    missing = [k for k in sim.events.sent if k not in stored]
    moved = [k for k, ts in sim.events.sent.items() if k in stored and abs(parse(stored[k]["ts"]) - parse(ts)) > 1e-3]
    lost = len(missing) + len(moved) + len(sim.events.refused)

    wall = sim.end - sim.launch
    truth = sim.truth.totals(sim.launch, sim.end)
    truth_ettr = truth["productive"] / wall
    measured = {"productive": goodput["productive_s"], **goodput["lost_s"]}
    silent = [f for f in sim.faults if f.kind == "silent_node"]
    detect = [f.detected_at - f.at for f in silent if f.detected_at]
    escalate = [f.job_restart_at - f.at for f in silent if f.job_restart_at]
    achieved = stats.beats_accepted / stats.beating_s if stats.beating_s else math.nan
    offered = stats.beats_offered / stats.beating_s if stats.beating_s else math.nan
    hangs = sum(1 for e in events if e["type"] == "hang_detected")
    figures = {
        "params": asdict(p),
        "job": {"id": job["id"], "status": job["status"], "attempts": job["attempt"] + 1},
        "wall_s": wall,
        "faults": [asdict(f) | {"at_s": f.at - sim.launch} for f in sim.faults],
        "ingest": {
            "offered_beats_per_s": offered,
            "achieved_beats_per_s": achieved,
            "posts": stats.posts,
            "late_slots": stats.late,
            "slots": stats.slots,
            "errors": stats.errors,
            "statuses": stats.statuses,
            "p50_ms": percentile(stats.latencies_ms, 50),
            "p99_ms": percentile(stats.latencies_ms, 99),
            "max_ms": max(stats.latencies_ms, default=math.nan),
            "cpu_cores": {**cpu, "agents": agents_cpu},
        },
        "detection": {"silent_faults": len(silent), "hang_detected_s": detect, "job_restart_s": escalate},
        "events": {
            "sent": len(sim.events.sent),
            "stored_for_job": len(events),
            "missing": len(missing),
            "timestamp_changed": len(moved),
            "refused": len(sim.events.refused),
            "retried_posts": sim.events.retries,
            "hang_detected": hangs,
            "false_hang_detected": false_hangs(events, sim, p),
            "listing_s": listing_s,
        },
        "events_lost": lost,
        "goodput": {
            "api_ms": goodput_ms,
            "ettr": goodput["ettr"],
            "truth_ettr": truth_ettr,
            "wall_s": goodput["wall_s"],
            "buckets": {b: {"ftplane": measured.get(b, 0.0), "truth": truth[b]} for b in BUCKETS},
            "failures": goodput["failures"],
            "advice": goodput["advice"],
        },
    }
    return {"figures": figures, "report": report(p, figures)}


def report(p: Params, f: dict[str, Any]) -> str:
    ing = f["ingest"]
    cpu = ing["cpu_cores"]
    lines = [f"job {f['job']['status']} after {f['wall_s']:.0f} s, {f['job']['attempts']} attempt(s)", ""]
    kinds: dict[str, int] = defaultdict(int)
    for fault in f["faults"]:
        kinds[fault["kind"]] += 1
    lines.append(
        f"faults: {len(f['faults'])} ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items())) or 'none'}); "
        f"expected {f['wall_s'] / (p.mttf_sim_s / p.compression):.1f} over the wall time"
    )
    lines.append("")
    lines.append("ingest (while the ranks were beating):")
    lines.append(
        table(
            [
                "offered beats/s",
                "achieved beats/s",
                "achieved/offered",
                "POSTs",
                "late slots",
                "errors",
                "p50 ms",
                "p99 ms",
                "max ms",
            ],
            [
                [
                    ing["offered_beats_per_s"],
                    ing["achieved_beats_per_s"],
                    f"{ing['achieved_beats_per_s'] / ing['offered_beats_per_s']:.3f}",
                    ing["posts"],
                    ing["late_slots"],
                    ing["errors"],
                    ing["p50_ms"],
                    ing["p99_ms"],
                    ing["max_ms"],
                ]
            ],
        )
    )
    lines.append("")
    lines.append("CPU over the run (cores; the machine has 2):")
    lines.append(
        table(
            [
                "API (uvicorn)",
                "Celery worker",
                "beat",
                "PostgreSQL",
                "agents",
                "simulator",
                "other on the host",
                "machine",
            ],
            [
                [
                    cpu["api"],
                    cpu["worker"],
                    cpu["beat"],
                    cpu["postgres"],
                    cpu["agents"],
                    cpu["controller"],
                    cpu["other"],
                    cpu["machine"],
                ]
            ],
        )
    )
    det = f["detection"]
    lines.append("")
    if det["hang_detected_s"]:
        d, e = det["hang_detected_s"], det["job_restart_s"]
        lines.append(
            f"silent-node faults: {det['silent_faults']}; fault -> hang_detected median {statistics.median(d):.2f} s, "
            f"max {max(d):.2f} s (timeout {p.heartbeat_timeout_s:g} s); fault -> job_restart median "
            f"{statistics.median(e):.2f} s, max {max(e):.2f} s (escalation at 2x the timeout)"
        )
    else:
        lines.append("silent-node faults: none in this run (try another --seed or longer --sim-hours)")
    ev = f["events"]
    lines.append(
        f"events: {ev['sent']:,} sent, {ev['missing']} missing, {ev['timestamp_changed']} with another ts, "
        f"{ev['refused']} refused, {ev['retried_posts']} POSTs retried -> events lost: {f['events_lost']}; "
        f"{ev['stored_for_job']:,} stored for the job (with the control plane's own); hang_detected "
        f"{ev['hang_detected']:,} ({ev['false_hang_detected']} outside a simulated silence); listing them all "
        f"took {ev['listing_s']:.1f} s"
    )
    g = f["goodput"]
    lines.append("")
    lines.append(
        f"goodput: ftplane ETTR {g['ettr']:.4f} vs ground truth {g['truth_ettr']:.4f} "
        f"(difference {g['ettr'] - g['truth_ettr']:+.4f}); GET /goodput took {g['api_ms']:.0f} ms"
    )
    rows = [[b, v["ftplane"], v["truth"], v["ftplane"] - v["truth"]] for b, v in g["buckets"].items()]
    lines.append(table(["bucket", "ftplane s", "truth s", "difference s"], rows))
    adv = g["advice"]
    if adv.get("optimal"):
        lines.append(
            f"advice: C {adv['checkpoint_blocking_s']:.3f} s, M {adv['mtbf_s']:.1f} s, "
            f"R {adv['restart_cost_s']:.1f} s -> "
            f"interval {adv['optimal']['interval_s']:.2f} s = {adv['optimal']['interval_steps']:.0f} steps "
            f"(predicted ETTR {adv['optimal']['predicted_ettr']:.3f}); current {p.checkpoint_interval_steps} steps "
            f"predicts {adv['current']['predicted_ettr']:.3f}"
        )
    else:
        lines.append(f"advice: {adv['note']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
