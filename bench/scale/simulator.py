"""The training story of one simulated job, time-compressed: runs of steps with checkpoints, faults at a published
rate, and the recoveries NVRx, ft_launcher and ftplane would carry out. The method is in bench/README.md.

Everything the ranks and the launcher would report reaches the control plane through the simulated nodes' agents
(fleet.py): each rank's `running` when its loop starts, rank 0's `checkpoint_saved` and `checkpoint_loaded`, the
failing rank's `rank_failed`, rank 0's `inprocess_restart`, every node's `injob_restart` (one key, as every node
agent reports it), and the heartbeats of ranks that make progress. The story keeps the ground truth (truth.py) as
it goes; what it waits for from ftplane (a launch, a detection, a job restart, the end) it observes from outside.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from pathlib import Path

import httpx

from bench.scale.controlplane import ControlPlane, Window
from bench.scale.fleet import Fleet, iso
from bench.scale.params import Params
from bench.scale.truth import Fault, Observer, Truth
from ftplane import contract
from ftplane.contract import EventType

CHECKPOINT_BYTES = 16 * 10**9 * 12  # an 8B-parameter model's weights and optimizer state
ENDED = ("SUCCEEDED", "FAILED", "CANCELLED")


class Simulation:
    def __init__(self, p: Params, client: httpx.AsyncClient, cp: ControlPlane, job_id: str, token: str, workdir: Path):
        self.p = p
        self.job_id = job_id
        self.fleet = Fleet(p, cp.url, job_id, token, p.simulator_processes)
        self.window = Window(cp.meter({"simulator": self.fleet.processes}))
        self.marks = workdir / "marks"
        self.marks.mkdir(parents=True, exist_ok=True)
        self.flag = workdir / "training-done"
        self.observer = Observer(client, job_id, p.poll_s, self.marks)
        self.rng = random.Random(p.seed)
        self.truth = Truth()
        self.faults: list[Fault] = []
        self.deck: list[str] = []
        self.attempt = 0
        self.restart_count = 0
        self.iteration = 0
        self.step = 0
        self.high = 0  # highest step completed
        self.saves: list[tuple[float, int]] = []  # (completed at, step)
        self.pending_save: tuple[float, int] | None = None  # (completes at, step)
        self.run_saved: set[int] = set()
        self.t = 0.0
        self.fault_at = math.inf
        self.end_at = math.inf
        self.launch = 0.0
        self.end = 0.0
        self.aborted: str | None = None  # why the story stopped before its end, if it did

    async def sleep_until(self, t: float) -> None:
        await asyncio.sleep(max(0.0, t - time.time()))

    def latest_checkpoint(self, at: float) -> int:
        return max((step for completed, step in self.saves if completed <= at), default=0)

    # ---- what the ranks report ----

    def run_events(self, at: float, start_step: int) -> None:
        """Every rank reports `running` when its loop starts (rank 0 its checkpoint load before)."""
        p, ts = self.p, iso(at)
        run = f"a{self.attempt}:r{self.restart_count}:i{self.iteration}"
        if start_step > 0:
            details = {"step": start_step, "load_s": round(p.real(p.checkpoint_load_sim_s), 4)}
            event = {"key": f"sim:load:{run}", "type": EventType.checkpoint_loaded, "ts": iso(at - 0.001), "rank": 0}
            self.fleet.send(0, {**event, "step": start_step, "details": details})
        details = {"restart_count": self.restart_count, "iteration": self.iteration, "start_step": start_step}
        for rank in range(p.ranks):
            event = {
                "key": f"sim:run:{run}:{rank}",
                "type": EventType.running,
                "ts": ts,
                "rank": rank,
                "step": start_step,
            }
            self.fleet.send(p.node_of(rank), {**event, "details": {**details, "world_size": p.ranks}})

    def checkpoint_saved(self, completed: float, step: int) -> None:
        p = self.p
        details = {
            "step": step,
            "blocking_s": round(p.real(p.checkpoint_blocking_sim_s), 4),
            "total_s": round(p.real(p.checkpoint_total_sim_s), 4),
            "bytes": CHECKPOINT_BYTES,
            "engine": "async",
        }
        key = f"sim:ckpt:{step}:a{self.attempt}:r{self.restart_count}:i{self.iteration}"
        event = {"key": key, "type": EventType.checkpoint_saved, "ts": iso(completed), "rank": 0, "step": step}
        self.fleet.send(0, {**event, "details": details})

    # ---- the story ----

    async def run(self) -> None:
        p = self.p
        launched = await self.observer.job_until("launched", lambda job: job["status"] != "PENDING", 120)
        self.launch = launched.at
        pod = await self.observer.pod_started(0, 120)
        await self.fleet.start(0)  # the node agents start with their pods
        self.fleet.measure(True)
        self.window.begin()
        start = max(time.time(), pod + p.real(p.init_sim_s))  # processes start, NCCL initializes, the model is built
        # The story lasts its simulated hours from the launch, of which the first start takes init_sim_s; a pod that
        # came late (a busy machine) lengthens the start, not shortens the training: it still trains for the rest.
        end = max(self.launch + p.real(p.sim_hours * 3600), start + p.real(p.sim_hours * 3600 - p.init_sim_s))
        await self.sleep_until(start)
        self.truth.add(self.launch, start, "initialization")
        try:
            await self.train_from(start, 0, end)
        except TimeoutError as exc:  # the control plane did not do what the story waits for: stop, keep the figures
            self.aborted = str(exc)
            print(f"  {time.time() - self.launch:7.1f} s  story stopped: {exc}", flush=True)
            await self.stop()

    async def stop(self) -> None:
        """End early: the agents stop (flushing what they can), the real process exits, the end is noted."""
        if self.fleet.measuring:
            self.fleet.measure(False)
            self.window.end()
        await self.fleet.close(contract.exit_flush_s(self.p.report_interval_s))
        self.flag.touch()
        try:
            seen = await self.observer.job_until("ended", lambda job: job["status"] in ENDED, 60)
            self.end = seen.at
        except TimeoutError:
            self.end = time.time()

    async def train_from(self, start: float, start_step: int, end: float) -> None:
        """Runs until the end of the simulated time: training, faults and their recoveries."""
        p = self.p
        step_real = p.real(p.step_sim_s)
        while True:
            self.step = start_step
            self.run_events(start, start_step)
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
                self.fleet.stepped(self.step, self.t, step_real)
                self.complete_save(self.t)
            if self.t >= self.end_at and self.t < self.fault_at:
                await self.finish()
                return
            start, start_step = await self.recover(self.new_fault(self.t))

    async def advance(self, until: float, bucket: str) -> bool:
        """Spend time in `bucket` up to `until`; False when a fault or the end comes first (time stops there)."""
        stop = max(self.t, min(until, self.fault_at, self.end_at))  # an end that passed during a recovery: now
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
            self.checkpoint_saved(completed, step)

    def next_kind(self) -> str:
        """Kinds are dealt from a shuffled deck of 20 cards in the mix's proportions, so a run of a few faults
        still sees each kind about as often as the mix says (independent draws often would not)."""
        if not self.deck:
            total = sum(w for _, w in self.p.mix)
            for kind, weight in self.p.mix:
                self.deck += [kind] * max(1, round(20 * weight / total))
            self.rng.shuffle(self.deck)
        return self.deck.pop()

    def new_fault(self, at: float) -> Fault:
        rank = self.rng.randrange(self.p.ranks)
        fault = Fault(self.next_kind(), rank, self.p.node_of(rank), self.step, at)
        self.complete_save(at)
        if self.pending_save is not None and self.pending_save[0] > at:
            self.pending_save = None  # the save in flight never completes
        self.faults.append(fault)
        print(f"  {at - self.launch:7.1f} s  fault: {fault.kind} at step {self.step} (rank {rank})", flush=True)
        return fault

    async def recover(self, fault: Fault) -> tuple[float, int]:
        """Act out the recovery; returns (when the next run starts, its start step)."""
        await self.sleep_until(fault.injected)
        fault.resumed_from = self.latest_checkpoint(fault.injected)
        if fault.kind == "silent_node":
            start = await self.job_restart(fault)
        else:
            start = await self.restart_in_job(fault)
        fault.resumed = start
        print(
            f"  {start - self.launch:7.1f} s  resumed from step {fault.resumed_from} "
            f"(attempt {self.attempt}, restart {self.restart_count}, iteration {self.iteration})",
            flush=True,
        )
        return start, fault.resumed_from

    async def restart_in_job(self, fault: Fault) -> float:
        """A crash (ft_launcher restarts the workers) or a transient fault (NVRx restarts in-process). The rank
        reports its own failure: onset and detection are the same moment."""
        p = self.p
        cause = (
            "RuntimeError: CUDA error: an illegal memory access was encountered"
            if fault.kind == "crash"
            else "RuntimeError: NCCL communicator was aborted"
        )
        details = {
            "cause": cause,
            "first_to_fail": True,
            "iteration": self.iteration,
            "inprocess": fault.kind != "crash",
        }
        event = {"key": f"sim:fail:{len(self.faults)}", "type": EventType.rank_failed, "ts": iso(fault.injected)}
        self.fleet.send(fault.node, {**event, "rank": fault.rank, "step": fault.step, "details": details})
        cost = p.real(p.injob_sim_s if fault.kind == "crash" else p.inprocess_sim_s)
        restarted = fault.injected + 0.6 * cost  # the new processes (or the re-entered loop) start
        start = fault.injected + cost
        await self.sleep_until(restarted)
        if fault.kind == "crash":
            self.restart_count += 1
            self.iteration = 0
            key = contract.injob_restart_key(self.job_id, self.attempt, self.restart_count)
            details = {"restart_count": self.restart_count, "source": "launcher"}
            restart = {
                "key": key,
                "type": EventType.injob_restart,
                "ts": iso(restarted),
                "rank": None,
                "details": details,
            }
            self.fleet.send_from_every_node(restart)
        else:
            self.iteration += 1
            key = contract.inprocess_restart_key(self.job_id, self.attempt, self.restart_count, self.iteration)
            details = {"iteration": self.iteration, "restart_count": self.restart_count}
            self.fleet.send(
                0,
                {"key": key, "type": EventType.inprocess_restart, "ts": iso(restarted), "rank": 0, "details": details},
            )
        await self.sleep_until(start)
        self.truth.add(fault.injected, start, "restart")
        return start

    async def job_restart(self, fault: Fault) -> float:
        """A silent node: the host stops dead and every other rank blocks in its next collective, so nothing more
        is reported but the other agents' liveness. ftplane must notice the silence (hang_detected) and restart
        the job (a new attempt, launched by the real backend); the new pods then start up."""
        p = self.p
        await self.observer.skip("hang_detected")  # a false hang of a lagging ingest is not this fault's detection
        await self.fleet.freeze(fault.node)
        patience = 2 * p.heartbeat_timeout_s + 2 * p.report_interval_s + 4 * p.supervise_interval_s + 60
        fault.detected = await self.observer.first_event("hang_detected", self.attempt, patience)
        fault.escalated = await self.observer.job_until(
            "restarted", lambda job, a=self.attempt: job["attempt"] > a, patience
        )
        await self.fleet.close(5.0)  # the old pods are deleted: their agents flush and exit
        self.attempt += 1
        self.restart_count = 0
        self.iteration = 0
        fault.pod_started = await self.observer.pod_started(self.attempt, 120)
        await self.fleet.start(self.attempt)
        start = max(time.time(), fault.pod_started + p.real(p.job_restart_startup_sim_s))
        await self.sleep_until(start)
        self.truth.add(fault.injected, fault.detected.at, "fault_detection")
        self.truth.add(fault.detected.at, start, "restart")
        return start

    async def finish(self) -> None:
        """The end of the simulated time: the final save (the trainer always saves the final state), then the
        processes exit and the supervisor records `succeeded`."""
        self.fault_at = math.inf
        self.end_at = math.inf
        self.complete_save(self.t)
        if self.step not in self.run_saved:  # like the trainer: no second save of the same step
            if self.pending_save is not None:  # one save at a time: wait for the one in flight
                await self.advance(self.pending_save[0], "checkpoint_stall")
                self.complete_save(self.t)
            await self.save()
        self.fleet.ranks_done()
        unblocked = self.t
        if self.pending_save is not None:
            await self.sleep_until(self.pending_save[0])
            self.complete_save(self.pending_save[0])
        self.fleet.measure(False)
        self.window.end()
        # the ranks exit; each agent sends what it has left as the product's agent does when its launcher ends
        await self.fleet.close(contract.exit_flush_s(self.p.report_interval_s, held=True), hold=True)
        self.flag.touch()  # the real process exits; ft_launcher exits 0; the supervisor records `succeeded`
        seen = await self.observer.job_until("SUCCEEDED", lambda job: job["status"] == "SUCCEEDED", 120)
        self.truth.add(unblocked, seen.at, "shutdown")
        self.end = seen.at
        print(f"  {self.end - self.launch:7.1f} s  succeeded at step {self.step} (seen)", flush=True)
