"""The ground truth, from the simulator's own clock and records alone.

`Truth` labels the real time the simulator spent: it knows when it started each run, when each step and save
happened, when it injected each fault. What it cannot know by itself it observes from outside, as an operator would,
and notes the time on its own clock when it first saw it (`Observer`):

- a launch: the job's status leaves PENDING (polled), and the launched process writes the time it started into a
  file of the simulator's (`pod_started`);
- a detection: a `hang_detected` of the attempt appears in the job's events after those stored before the fault
  (polled, paged forward by event id: no filter on ftplane's timestamps);
- an escalation: the job's attempt number goes up (polled);
- the end: the job's status reads SUCCEEDED (polled).

Timestamps inside ftplane's answers are kept only to be reported next to the truth (`Seen.claimed`), never used to
build it. Observation costs up to one poll period (`Params.poll_s`) on each of these.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.scale.params import BUCKETS


def parse(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


@dataclass
class Truth:
    """Where the time went, as the simulator knows it: labelled wall-clock intervals."""

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


@dataclass
class Seen:
    at: float  # the simulator's clock when it first saw it
    claimed: float | None = None  # the time ftplane's answer gives it (reported, never used as truth)


@dataclass
class Fault:
    """The simulator's record of one fault."""

    kind: str
    rank: int
    node: int
    step: int
    injected: float
    resumed_from: int = 0
    detected: Seen | None = None  # a silent node: the first hang_detected seen; a crash reports itself
    escalated: Seen | None = None  # a silent node: the job's attempt went up
    pod_started: float | None = None  # a silent node: the new attempt's process started
    resumed: float | None = None  # the next run started


class Observer:
    """Polls the API with an admin token; every time it returns is the simulator's own clock."""

    def __init__(self, client: httpx.AsyncClient, job_id: str, poll_s: float, marks: Path) -> None:
        self.client = client
        self.job_id = job_id
        self.poll_s = poll_s
        self.marks = marks
        self.cursors: dict[str, int] = {}

    async def skip(self, type_: str, timeout: float = 60.0) -> None:
        """Look past every `type_` event stored so far (before a fault: an earlier event is not its detection)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            params = {"type": type_, "cursor": self.cursors.get(type_, 0), "limit": 1000}
            page = await self._get(f"/v1/jobs/{self.job_id}/events", params, soft=True)
            if page is None:  # the API did not answer: what it stored meanwhile is looked past next time
                await asyncio.sleep(self.poll_s)
                continue
            if page["items"]:
                self.cursors[type_] = int(page["items"][-1]["id"])
            if not page["next_cursor"]:
                return
        raise TimeoutError(f"the {type_} events could not be paged within {timeout:.0f} s")

    async def first_event(self, type_: str, attempt: int, timeout: float) -> Seen:
        """When a `type_` event of `attempt` was first seen. The events of each type are paged forward from where
        the last look ended (by event id), so an event stored earlier is never taken for a new one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while True:
                params = {"type": type_, "cursor": self.cursors.get(type_, 0), "limit": 1000}
                page = await self._get(f"/v1/jobs/{self.job_id}/events", params, soft=True)
                seen = time.time()
                if not page or not page["items"]:
                    break
                self.cursors[type_] = int(page["items"][-1]["id"])
                match = next((item for item in page["items"] if item["attempt"] == attempt), None)
                if match is not None:
                    return Seen(seen, parse(match["ts"]))
                if not page["next_cursor"]:
                    break
            await asyncio.sleep(self.poll_s)
        raise TimeoutError(f"no {type_} event (attempt {attempt}) within {timeout:.0f} s")

    async def job_until(self, what: str, check: Any, timeout: float) -> Seen:
        """When the job (GET /v1/jobs/{id}) first satisfied `check`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = await self._get(f"/v1/jobs/{self.job_id}", {}, soft=True)
            seen = time.time()
            if job is not None and check(job):
                return Seen(seen)
            await asyncio.sleep(self.poll_s)
        raise TimeoutError(f"the job was not {what} within {timeout:.0f} s")

    async def pod_started(self, attempt: int, timeout: float) -> float:
        """The time the attempt's launched process wrote when it started (its clock is this host's)."""
        path = self.marks / f"started-a{attempt}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and (text := path.read_text().strip()):
                return float(text)
            await asyncio.sleep(0.05)
        raise TimeoutError(f"attempt {attempt}'s process did not start within {timeout:.0f} s")

    async def _get(self, path: str, params: dict[str, Any], soft: bool = False) -> Any:
        try:
            response = await self.client.get(path, params=params)
        except httpx.TransportError:
            if soft:
                return None
            raise
        if soft and response.status_code != 200:
            return None
        response.raise_for_status()
        return response.json()


def launched_command(marks: Path, flag: Path) -> list[str]:
    """What the job's one real rank runs: it notes when it started (per attempt), then waits for the end."""
    script = (
        "import os, time\n"
        f"path = os.path.join({str(marks)!r}, 'started-a' + os.environ.get('FTPLANE_ATTEMPT', 'x'))\n"
        "open(path + '.tmp', 'w').write(repr(time.time()))\n"
        "os.replace(path + '.tmp', path)\n"
        f"while not os.path.exists({str(flag)!r}):\n"
        "    time.sleep(0.2)\n"
    )
    return ["python", "-c", script]
