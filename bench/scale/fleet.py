"""The simulated nodes of a job: each is an instance of the product's own agent reporting code (`AsyncUplink`, which
drives `ReportBuffer`), fed as the node agent feeds its `Uplink`.

Every report interval a node's agent hands its uplink the node's liveness (its `_observe`), and its ranks' newest
heartbeats reach the uplink when they made progress (the SDK sends a heartbeat only when a step was done); events
go at once. What a report carries, when it is sent, how it is retried and what a reply means are the product's
decisions, not this module's. This module only counts:

- node beats: each liveness handed to an uplink while the node is up (and not cut off, nor catching up after a
  cut) is one offered; it is delivered when a report carrying it is accepted, superseded when a newer one
  replaced it first (a report was late past an interval); the time from the hand-over to the acceptance is its
  age;
- each POST's outcome and duration (`on_settled`), split by whether it carried events;
- every event key handed to an agent, and which of them an accepted (or refused) report carried.

A node's network (`wire.Network`) is its own connection, with a switch that makes every request fail to connect (a
partition) until it is healed; a frozen node's agent is stopped where it stands.

The nodes live in `NodeGroup`s: one in this process, or one per simulator process (shards.py) when one event loop
cannot keep every node's timers on time. `Fleet` is what the story drives either way.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from api.core import heap
from bench.scale.counts import Ledger, Tally, keys_carried
from bench.scale.params import Params
from bench.scale.wire import Network
from ftplane.trainer.agent.report_buffer import Outcome, Report
from ftplane.trainer.agent.uplink import AsyncUplink

if TYPE_CHECKING:
    from bench.scale.shards import Shard


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


class SimNode:
    """One node: its agent's uplink, its interval timer and its ranks' heartbeats."""

    def __init__(self, fleet: NodeGroup, index: int, attempt: int) -> None:
        p = fleet.p
        self.fleet = fleet
        self.name = p.node_name(index)
        self.ranks = range(index * p.gpus_per_node, (index + 1) * p.gpus_per_node)
        self.network = Network(p.transport)
        self.uplink = AsyncUplink(
            fleet.url,
            fleet.job_id,
            attempt,
            fleet.token,
            self.name,
            interval_s=p.report_interval_s,
            on_settled=self._settled,
            client=self.network.client,
        )
        self.liveness = {
            "pid": 1000 + index,
            "launcher": {"pid": 2000 + index, "alive": True},
            "ranks": [
                {"rank": r, "local_rank": r % p.gpus_per_node, "pid": 3000 + r, "alive": True} for r in self.ranks
            ],
            "progress": "sdk",
            "interval_s": p.report_interval_s,
            "healthy": True,
        }
        self.handed: collections.deque[tuple[dict[str, Any], float, bool]] = collections.deque()
        self.beat_sent: Beat | None = None
        self.timer: asyncio.Task[None] | None = None
        self.frozen = False
        self.connected = False  # a report of this node was accepted: its HTTP connection is open
        self.disturbed = False  # cut off, until a report goes through again: its beats are not counted as offered

    def start(self, phase_s: float) -> None:
        self.uplink.start()
        self.timer = asyncio.get_running_loop().create_task(self._every_interval(phase_s))

    async def _every_interval(self, phase_s: float) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + phase_s
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            if self.fleet.tally.measuring:
                self.fleet.tally.lag_s.append(loop.time() - due)
            self.observe()
            due += self.fleet.p.report_interval_s

    def observe(self) -> None:
        """What the node agent does each interval: hand over the node's liveness; the ranks' newest heartbeats
        reach the uplink when they made progress since the last."""
        tally = self.fleet.tally
        status = dict(self.liveness)  # a new object: which report carried it is told by identity
        counted = tally.measuring and not self.disturbed
        tally.ticks += counted
        self.handed.append((status, time.monotonic(), counted))
        self.uplink.liveness(status)
        self.hand_over_beat()

    def hand_over_beat(self) -> None:
        """The ranks' newest heartbeats to the uplink, when they made progress since the last."""
        beat = self.fleet.beat
        if beat is not None and beat is not self.beat_sent and not self.frozen:
            self.beat_sent = beat
            for rank in self.ranks:
                self.uplink.heartbeat({**beat.fields, "rank": rank, "node": self.name})

    def _settled(self, report: Report, outcome: Outcome, seconds: float) -> None:
        tally, ledger = self.fleet.tally, self.fleet.ledger
        keys = [k for e in report.events for k in keys_carried(e)]
        if outcome.ok:
            if not self.connected:
                self.connected = True
                self.fleet.node_connected()
            ledger.accepted.update(keys)
            self._delivered(report.liveness)  # also after the window: a beat offered in it may be delivered later
            self.disturbed = self.network.cut
        elif outcome.liveness_taken:  # a busy server shed the events but took the liveness, and said so
            self._delivered(report.liveness, by_shed=True)
        elif not outcome.retry:
            ledger.refused.update(keys)
        reason = outcome.reason.split(":")[0].split(" from ")[0][:40]  # "HTTP 503", "ReadTimeout", ...
        tally.settled(time.time(), ("accepted" if outcome.ok else reason) + (" (events)" if keys else ""))
        if not tally.measuring:
            return
        tally.posts += 1
        if outcome.ok:
            tally.accepted += 1
            tally.rank_beats += len(report.heartbeats)
            (tally.post_events_s if keys else tally.post_s).append(seconds)
        else:
            tally.retried += outcome.retry
            tally.refused += not outcome.retry
            tally.reasons[reason] += 1

    def _delivered(self, status: dict[str, Any] | None, by_shed: bool = False) -> None:
        if not any(handed is status for handed, _, _ in self.handed):
            return
        now = time.monotonic()
        while self.handed:
            handed, at, counted = self.handed.popleft()
            if handed is status:
                self.fleet.tally.delivered += counted
                self.fleet.tally.delivered_by_shed += counted and by_shed
                if counted and self.fleet.tally.measuring:
                    self.fleet.tally.beat_age_s.append(now - at)
                return
            self.fleet.tally.superseded += counted

    def disturb(self) -> None:
        """The simulator cut this node off: beats it holds, and those until a report gets through again, are not
        counted as offered (they cannot arrive)."""
        self.disturbed = True
        uncounted = sum(counted for _, _, counted in self.handed)
        self.fleet.tally.ticks -= uncounted
        self.handed = collections.deque((status, at, False) for status, at, _ in self.handed)

    async def close(self, timeout: float, hold: bool) -> bool:
        if self.frozen:
            return True
        if self.timer is not None:
            self.timer.cancel()
        return await self.uplink.close(timeout, hold=hold)

    async def freeze(self) -> None:
        """The host stops dead: nothing more is sent; what its agent had queued dies with it."""
        self.frozen = True
        if self.timer is not None:
            self.timer.cancel()
        self.disturb()
        self.handed.clear()
        self.fleet.ledger.died.update(k for e in self.uplink.buffer.events for k in keys_carried(e))
        await self.uplink.stop()


@dataclass(frozen=True)
class Beat:
    """The ranks' newest step (every rank of the job is at the same step) and its heartbeat's fields."""

    step: int
    fields: dict[str, Any]


class NodeGroup:
    """Some of a job's simulated nodes (`indices`), all in this process's event loop."""

    def __init__(self, p: Params, url: str, job_id: str, token: str, indices: list[int]) -> None:
        self.p = p
        self.url = url
        self.job_id = job_id
        self.token = token
        self.indices = indices
        self.nodes: dict[int, SimNode] = {}
        self.beat: Beat | None = None
        self.connected = 0
        self.tally = Tally()
        self.ledger = Ledger()

    async def start(self, attempt: int) -> None:
        """The attempt's agents start, their intervals spread evenly over the whole job's nodes (as independent
        pods' would be)."""
        self.beat = None
        self.nodes = {i: SimNode(self, i, attempt) for i in self.indices}
        self.connected = 0
        heap.freeze()
        for k, (i, node) in enumerate(self.nodes.items()):
            node.start(self.p.report_interval_s * i / self.p.nodes)
            if k % 256 == 255:
                await asyncio.sleep(0)

    def node_connected(self) -> None:
        """2,048 agents' heaps in one process: a full collection here paused every node's timing for up to 250 ms,
        which real agents, each with its own small heap, never see. So the group's heap is frozen as the product's
        servers freeze theirs, once its nodes are built and again once every node's connection is open (not their
        young threshold: the HTTP clients here leave ~25 objects in cycles per POST, and collecting 50,000 of them
        at once paused this loop for 100-175 ms)."""
        self.connected += 1
        if self.connected == len(self.nodes):
            heap.freeze()

    def measure(self, on: bool) -> None:
        self.tally.measuring = on

    def set_beat(self, beat: Beat | None) -> None:
        if beat is None:  # the ranks exit: the agent has their last heartbeats (they came as the ranks stepped)
            for node in self.nodes.values():
                node.hand_over_beat()
        self.beat = beat

    def send(self, node: int, event: dict[str, Any]) -> None:
        self.nodes[node].uplink.forward_event(event)

    def send_events(self, events: list[tuple[int, dict[str, Any]]]) -> None:
        for node, event in events:
            self.nodes[node].uplink.forward_event(event)

    def send_to_all(self, event: dict[str, Any]) -> None:
        for node in self.nodes.values():
            node.uplink.forward_event(dict(event))

    async def freeze(self, node: int) -> None:
        await self.nodes[node].freeze()

    def partition(self, node: int, cut: bool) -> None:
        self.nodes[node].network.cut = cut
        self.nodes[node].disturb()

    async def close(self, timeout: float, hold: bool = False) -> int:
        """Stop every agent, flushing what it holds (bounded; with `hold`, as at the job's end: the agents' exit on
        their own); returns how many left something undelivered."""
        results = await asyncio.gather(*(node.close(timeout, hold) for node in self.nodes.values()))
        self.nodes = {}
        return sum(not ok for ok in results)

    async def pending_events(self) -> int:
        return sum(len(node.uplink.buffer.events) for node in self.nodes.values())


class Group(Protocol):
    """What `Fleet` drives: a `NodeGroup` here, or one in a process of its own (shards.Shard)."""

    async def start(self, attempt: int) -> None: ...
    def measure(self, on: bool) -> None: ...
    def set_beat(self, beat: Beat | None) -> None: ...
    def send(self, node: int, event: dict[str, Any]) -> None: ...
    def send_to_all(self, event: dict[str, Any]) -> None: ...
    async def freeze(self, node: int) -> None: ...
    def partition(self, node: int, cut: bool) -> None: ...
    async def close(self, timeout: float, hold: bool = False) -> int: ...
    async def pending_events(self) -> int: ...


class Fleet:
    """One job's simulated nodes: in this process's event loop (`processes` 1), or dealt round-robin over that many
    simulator processes of their own. Its `tally` and `ledger` hold every group's figures after `collect`."""

    def __init__(self, p: Params, url: str, job_id: str, token: str, processes: int = 1) -> None:
        self.p = p
        self.job_id = job_id
        self.measuring = False
        self.started = False
        self.tally = Tally()
        self.ledger = Ledger()
        self.loop_samples: list[tuple[float, float]] = []  # the simulator processes' LoopWatch samples
        self.shards: list[Shard] = []
        self.groups: list[Group] = []
        if processes > 1:
            from bench.scale.shards import Shard

            self.shards = [Shard(p, url, job_id, token, list(range(k, p.nodes, processes))) for k in range(processes)]
            self.groups = list(self.shards)
        else:
            local = NodeGroup(p, url, job_id, token, list(range(p.nodes)))
            self.tally, self.ledger = local.tally, local.ledger  # counted in place
            self.groups = [local]

    def _group(self, node: int) -> Group:
        return self.groups[node % len(self.groups)]

    async def start(self, attempt: int) -> None:
        await asyncio.gather(*(group.start(attempt) for group in self.groups))
        self.started = True

    def measure(self, on: bool) -> None:
        self.measuring = on
        for group in self.groups:
            group.measure(on)

    def stepped(self, step: int, at: float, step_time_s: float, total_steps: int | None = None) -> None:
        """Every rank finished `step` at `at` (wall clock)."""
        fields: dict[str, Any] = {"step": step, "ts": iso(at), "step_time_s": round(step_time_s, 6)}
        fields.update(throughput=round(4096 * 8 / step_time_s, 1), loss=round(2.0 + 1.0 / (1 + step), 4))
        if total_steps is not None:
            fields["total_steps"] = total_steps
        beat = Beat(step, fields)
        for group in self.groups:
            group.set_beat(beat)

    def ranks_done(self) -> None:
        """The ranks stopped stepping: no more heartbeats."""
        for group in self.groups:
            group.set_beat(None)

    def send(self, node: int, event: dict[str, Any]) -> None:
        """An event a rank (or the node's agent) made, queued on `node`'s uplink."""
        self.ledger.offered.setdefault(event["key"], event["ts"])
        self._group(node).send(node, event)

    def send_from_every_node(self, event: dict[str, Any]) -> None:
        """The same fact from every node's agent (one key: stored once), e.g. ft_launcher's in-job restart."""
        self.ledger.offered.setdefault(event["key"], event["ts"])
        for group in self.groups:
            group.send_to_all(event)

    async def freeze(self, node: int) -> None:
        await self._group(node).freeze(node)

    def partition(self, node: int, cut: bool) -> None:
        self._group(node).partition(node, cut)

    async def close(self, timeout: float = 30.0, hold: bool = False) -> int:
        """Stop every agent, flushing what it holds (bounded; with `hold`, as at the job's end: the agents' exit on
        their own); returns how many left something undelivered."""
        self.started = False
        return sum(await asyncio.gather(*(group.close(timeout, hold) for group in self.groups)))

    async def pending_events(self) -> int:
        return sum(await asyncio.gather(*(group.pending_events() for group in self.groups)))

    def processes(self) -> list[psutil.Process]:
        """The simulator's processes: this one and the fleet's own."""
        return [psutil.Process(), *(shard.process for shard in self.shards)]

    async def collect(self) -> None:
        """Every simulator process's figures into `tally`, `ledger` and `loop_samples`; those processes end."""
        for shard in self.shards:
            tally, ledger, samples = await shard.report()
            self.tally.add(tally)
            self.ledger.add(ledger)
            self.loop_samples += samples
            await shard.exit()
        self.shards = []


async def wait_quiet(fleet: Fleet, timeout: float) -> bool:
    """Until every queued event of `fleet` was accepted (or `timeout`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while await fleet.pending_events():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True
