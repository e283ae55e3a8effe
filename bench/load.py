"""The benchmarks' load generator: requests from a process of its own (its CPU is not the caller's), closed loop or
paced, metered over the measured window alone.

Everything runs on loopback. Nothing here is part of `make test`.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from bench.common import CpuMeter, percentile
from bench.scale.wire import Connection, request_head
from ftplane.trainer.agent.uplink import client_options


@dataclass
class Load:
    """Closed loop: `concurrency` connections, each posting back to back, until `duration_s` or
    `max_requests`; with `rate_per_s`, request i goes no earlier than i / rate_per_s after the start (paced: at
    that rate while the connections keep up). Body i is `template` with b"@STEP@" and b"@TS@" filled in (fresh
    per request), and b"@KEY@" with a fresh unique id."""

    url: str
    path: str
    token: str
    templates: list[bytes]
    concurrency: int
    duration_s: float
    max_requests: int
    warmup_s: float = 1.0
    method: str = "POST"  # GET sends no body
    rate_per_s: float = 0.0  # 0: back to back
    # paced GET only: each of the `concurrency` connections opened (and used once) before the window, request i on
    # connection i % concurrency, so that each is idle between its requests, as a node agent's is between reports
    spread: bool = False


@dataclass
class LoadResult:
    requests: int
    errors: int
    elapsed_s: float
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    cpu_cores: float = 0.0
    connections: int = 0  # that carried the measured requests (closed loop or paced: at most)

    def p(self, q: float) -> float:
        return percentile(self.latencies_ms, q)


def run_load(load: Load, meter: CpuMeter | None = None) -> tuple[LoadResult, dict[str, float]]:
    """Run `load` in a child process (so the generator's CPU is not the caller's); returns its result
    and `meter`'s figures (empty without one).

    The meter covers the measured window alone: it starts after the child has spawned and imported
    and after the warm-up, and stops when the load ends, before the child shuts down. The result's
    `cpu_cores` is the generator's own CPU over the same window (the meter's `extra`).
    """
    ctx = multiprocessing.get_context("spawn")
    queue: Any = ctx.Queue()
    child = ctx.Process(target=_load_child, args=(load, queue))
    child.start()
    cpu: dict[str, float] = {}
    try:
        started = queue.get(timeout=load.warmup_s + 120)
        assert started == _MEASURING, started
        if meter is not None:
            meter.start()
        result: LoadResult = queue.get(timeout=load.duration_s + 120)
        if meter is not None:
            cpu = meter.stop(extra=result.cpu_cores)
    finally:
        child.join(timeout=30)
    return result, cpu


_MEASURING = "measuring"


def load_line(label: str, requests_per_s: float, result: LoadResult, cpu: dict[str, float]) -> str:
    """One measured mode as a benchmark prints it while it runs."""
    return (
        f"{label}: {requests_per_s:,.0f} req/s, p50 {result.p(50):.1f} ms, p99 {result.p(99):.1f} ms, "
        f"errors {result.errors} {result.statuses}, API {cpu.get('api', 0):.2f} cores, other {cpu.get('other', 0):.2f}"
    )


def _load_child(load: Load, queue: Any) -> None:
    asyncio.run(_drive_spread(load, queue.put) if load.spread else _drive(load, queue.put))


async def _drive(load: Load, report: Callable[[Any], None]) -> LoadResult:
    import aiohttp

    headers = {"Authorization": f"Bearer {load.token}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=load.concurrency, force_close=False)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    counter = 0
    errors = 0
    async with aiohttp.ClientSession(load.url, connector=connector, headers=headers) as session:

        async def one(i: int) -> tuple[float, int]:
            body = load.templates[i % len(load.templates)]
            body = body.replace(b"@STEP@", str(i).encode()).replace(b"@TS@", _now_iso().encode())
            if b"@KEY@" in body:
                body = body.replace(b"@KEY@", uuid.uuid4().hex.encode())
            t = time.perf_counter()
            data = body if load.method != "GET" else None
            async with session.request(load.method, load.path, data=data) as response:
                await response.read()
                return (time.perf_counter() - t) * 1000, response.status

        warm_until = time.monotonic() + load.warmup_s

        async def warm() -> None:
            i = 0
            while time.monotonic() < warm_until:
                await one(i)
                i += 1

        await asyncio.gather(*(warm() for _ in range(load.concurrency)))
        report(_MEASURING)  # the window the caller's meters cover starts here
        started_cpu = time.process_time()
        started = time.monotonic()
        deadline = started + load.duration_s

        async def worker() -> None:
            nonlocal counter, errors
            while time.monotonic() < deadline and counter < load.max_requests:
                i = counter
                counter += 1
                if load.rate_per_s:
                    due = started + i / load.rate_per_s
                    if due >= deadline:
                        return
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                try:
                    ms, status = await one(i)
                except aiohttp.ClientError:
                    errors += 1
                    continue
                statuses[status] = statuses.get(status, 0) + 1
                if status == 200:
                    latencies.append(ms)
                else:
                    errors += 1

        await asyncio.gather(*(worker() for _ in range(load.concurrency)))
        elapsed = time.monotonic() - started
        cpu_cores = (time.process_time() - started_cpu) / max(1e-9, elapsed)
        result = LoadResult(counter, errors, elapsed, latencies, statuses, cpu_cores, load.concurrency)
        report(result)  # before the connections close: the window ends with the load
    return result


async def _drive_spread(load: Load, report: Callable[[Any], None]) -> LoadResult:
    """`load` with `spread` (see Load): one kept-alive HTTP/1.1 connection each, opened and used once before the
    window, a batch at a time; each request with the headers a node agent's client sends."""
    assert load.method == "GET" and load.rate_per_s > 0, "spread is for a paced GET"
    url = urlsplit(load.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    options = client_options(load.url, load.token, 5.0)
    request = request_head(options["base_url"], tuple(options["headers"].items()), load.path, "GET") + b"\r\n"
    loop = asyncio.get_running_loop()
    connections: list[Connection] = []
    batch = 256
    for first in range(0, load.concurrency, batch):
        opened = await asyncio.gather(
            *(loop.create_connection(Connection, host, port) for _ in range(min(batch, load.concurrency - first)))
        )
        connections += [connection for _, connection in opened]
        await asyncio.gather(*(c.exchange(request, 60) for c in connections[first:]))
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0

    async def one(i: int) -> None:
        nonlocal errors
        t = time.perf_counter()
        try:
            reply = await connections[i % len(connections)].exchange(request, 60)
        except (ConnectionError, TimeoutError):
            errors += 1
            return
        statuses[reply.status_code] = statuses.get(reply.status_code, 0) + 1
        if reply.status_code == 200:
            latencies.append((time.perf_counter() - t) * 1000)
        else:
            errors += 1

    report(_MEASURING)
    started_cpu = time.process_time()
    started = time.monotonic()
    sent: list[asyncio.Task[None]] = []
    while (due := started + len(sent) / load.rate_per_s) < started + load.duration_s:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        sent.append(asyncio.ensure_future(one(len(sent))))
    await asyncio.gather(*sent)
    elapsed = time.monotonic() - started
    cpu_cores = (time.process_time() - started_cpu) / max(1e-9, elapsed)
    result = LoadResult(len(sent), errors, elapsed, latencies, statuses, cpu_cores, min(len(sent), len(connections)))
    report(result)
    for connection in connections:
        connection.close()
    return result


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()
