"""A simulator process's event loop: how it runs (`run_loop`) and how late it runs (`LoopWatch`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopWatch:
    """How late this process's event loop runs a 50 ms timer. The agents' connect and read timeouts run on this
    loop: while it is late by more than a timeout, a POST can time out on the simulator's side, not the server's."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []  # (wall clock, seconds late)
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + 0.05
            await asyncio.sleep(0.05)
            self.samples.append((time.time(), loop.time() - due))

    def between(self, lo: float, hi: float, more: list[tuple[float, float]] | None = None) -> dict[str, float]:
        """How late the loop ran between `lo` and `hi` (wall clock), with `more` samples of other loops."""
        late = [s for t, s in [*self.samples, *(more or [])] if lo <= t <= hi]
        return {
            "p99_ms": sorted(late)[int(0.99 * (len(late) - 1))] * 1000 if late else float("nan"),
            "max_ms": max(late, default=float("nan")) * 1000,
            "over_2s_s": sum(0.05 + s for s in late if s > 2.0),  # time the loop spent more than 2 s behind
        }


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """A simulator process's one event loop: uvloop where installed (it comes with uvicorn[standard], as the API's
    loop does), asyncio's own otherwise. Every node's timers and POSTs share it, so its own cost is what keeps it on
    time."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
