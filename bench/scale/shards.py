"""The simulated nodes over several processes: one event loop (one core at most) could not keep 16,384 nodes'
timers on time through a restart's burst of events, and a late simulator loop expires the agents' own connect and
read timeouts on its side, so that its failures are its own making (bench/RESULTS.md, scale, 2026-12-06).

A `Shard` is a `NodeGroup` in a process of its own (spawned: a clean interpreter, its own uvloop), driven over a
pipe, read on each side by a thread of its own (an event loop's reader would make the pipe non-blocking, and a
large message arrives in several reads). The story's commands go in order, batched per turn of the story's loop
(a restart's 131,072 `running` events are one message per shard, not one each); the few that need an answer
(pending events, the figures) wait for it. Each shard times its own loop (`LoopWatch`) and hands its tally,
ledger and loop samples back at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import psutil

from bench.scale.counts import Ledger, Tally
from bench.scale.fleet import Beat, NodeGroup
from bench.scale.loop import LoopWatch, run_loop
from bench.scale.params import Params

Command = tuple[int | None, str, tuple[Any, ...]]  # (the id an answer carries, or None; the method; its arguments)


class Shard:
    """A `NodeGroup` in a simulator process of its own."""

    def __init__(self, p: Params, url: str, job_id: str, token: str, indices: list[int]) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, theirs = context.Pipe()
        self._process = context.Process(
            target=serve, args=(theirs, p, url, job_id, token, indices), name=f"simulator-{indices[0]}", daemon=True
        )
        self._process.start()
        theirs.close()
        assert self._process.pid is not None
        self.process = psutil.Process(self._process.pid)
        self.outbox: list[Command] = []
        self.ids = itertools.count()
        self.answers: dict[int, asyncio.Future[Any]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.events: list[tuple[int, dict[str, Any]]] = []  # sends of this turn, one command at its flush
        self.flush_due = False  # a flush is scheduled for this turn's end

    # ---- the pipe ----

    def _tell(self, name: str, *args: Any) -> None:
        self._queue(None, name, args)

    async def _ask(self, name: str, *args: Any) -> Any:
        answer_id = next(self.ids)
        future = asyncio.get_running_loop().create_future()
        self.answers[answer_id] = future
        self._queue(answer_id, name, args)
        self._flush()
        return await future

    def _queue(self, answer_id: int | None, name: str, args: tuple[Any, ...]) -> None:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
            receive(self.conn, self.loop, self._answered, "simulator-answers")
        self._pack_events()  # in order: the sends before this command go first
        self._flush_soon()
        self.outbox.append((answer_id, name, args))

    def _pack_events(self) -> None:
        if self.events:
            self.outbox.append((None, "send_events", (self.events,)))
            self.events = []

    def _flush_soon(self) -> None:
        if not self.flush_due:
            self.flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_due = False
        self._pack_events()
        if self.outbox:
            self.conn.send(self.outbox)
            self.outbox = []

    def _answered(self, message: tuple[int, Any] | None) -> None:
        if message is None:  # the process ended: whoever waits hears it
            for future in self.answers.values():
                future.set_exception(RuntimeError("the simulator process ended"))
            self.answers.clear()
            return
        answer_id, value = message
        future = self.answers.pop(answer_id)
        if isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)

    # ---- what a NodeGroup does ----

    async def start(self, attempt: int) -> None:
        await self._ask("start", attempt)

    def measure(self, on: bool) -> None:
        self._tell("measure", on)

    def set_beat(self, beat: Beat | None) -> None:
        self._tell("set_beat", beat)

    def send(self, node: int, event: dict[str, Any]) -> None:
        self._flush_soon()
        self.events.append((node, event))

    def send_to_all(self, event: dict[str, Any]) -> None:
        self._tell("send_to_all", event)

    async def freeze(self, node: int) -> None:
        await self._ask("freeze", node)

    def partition(self, node: int, cut: bool) -> None:
        self._tell("partition", node, cut)

    async def close(self, timeout: float, hold: bool = False) -> int:
        return int(await self._ask("close", timeout, hold))

    async def pending_events(self) -> int:
        return int(await self._ask("pending_events"))

    async def report(self) -> tuple[Tally, Ledger, list[tuple[float, float]]]:
        return await self._ask("report")  # type: ignore[no-any-return]

    async def exit(self) -> None:
        self._tell("exit")
        self._flush()
        await asyncio.get_running_loop().run_in_executor(None, self._process.join, 30)
        self.conn.close()


def receive(conn: Connection, loop: asyncio.AbstractEventLoop, handle: Callable[[Any], None], name: str) -> None:
    """Every message from `conn`, handed to `handle` on `loop`'s thread; None when the other end is gone."""

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                message = None
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is left to hear it
                loop.call_soon_threadsafe(handle, message)
            if message is None:
                return

    threading.Thread(target=read, name=name, daemon=True).start()


# ---- in the simulator process ----


def serve(conn: Connection, p: Params, url: str, job_id: str, token: str, indices: list[int]) -> None:
    """A shard's process: its nodes, driven by what comes down `conn`, until told to exit."""
    logging.getLogger("ftplane.trainer.agent.uplink").setLevel(logging.ERROR)  # counted, not printed
    run_loop(_serve(conn, NodeGroup(p, url, job_id, token, indices)))


async def _serve(conn: Connection, group: NodeGroup) -> None:
    loop = asyncio.get_running_loop()
    watch = LoopWatch()
    watch.start()
    inbox: asyncio.Queue[list[Command]] = asyncio.Queue()

    def arrived(batch: list[Command] | None) -> None:
        inbox.put_nowait(batch if batch is not None else [(None, "exit", ())])  # None: the story's process is gone

    receive(conn, loop, arrived, "simulator-commands")
    while True:
        for answer_id, name, args in await inbox.get():
            if name == "exit":
                await group.close(5.0)
                return
            try:
                if name == "report":
                    value: Any = (group.tally, group.ledger, watch.samples)
                else:
                    value = getattr(group, name)(*args)
                    if asyncio.iscoroutine(value):
                        value = await value
            except Exception as exc:  # the story hears of it where it asked; a command's is logged here
                if answer_id is None:
                    logging.getLogger(__name__).exception("simulator command %s failed", name)
                value = exc
            if answer_id is not None:
                conn.send((answer_id, value))
