"""Per-token rate limits on the ingest endpoints (`POST .../events`, `POST .../heartbeats`).

A token bucket per (token, endpoint): `FTPLANE_INGEST_RATE_PER_S` requests per second refill it, up
to `FTPLANE_INGEST_BURST`; a request takes one. An empty bucket answers 429 with Retry-After (the
trainer's reporter waits that long and resends; nothing is lost).

Sizing: every rank of a job reports with the job's one token, from its own process, at most one
heartbeat batch per report interval (1 s) plus an event batch when it has events (up to 1000 per
batch). A 16,384-rank job therefore sends about 16,384 heartbeat requests per second, and events in
bursts: a checkpoint or an in-job restart makes every rank report at once, and after a control-plane
outage every rank flushes its backlog at once. The defaults, 32,768 requests/s and a burst of
65,536 per token and endpoint, are twice the steady heartbeat load and four requests per rank at
once, so such a job is never throttled; what is throttled is a token sending more than twice what
the largest job sends (a reporter stuck in a loop, a leaked token).

One process: buckets live in memory (a lock and a dict entry per token). With several API
processes, each keeps its own buckets unless FTPLANE_REDIS_URL is set: a token could then send up
to N times the limit through N processes. With Redis, all processes share one bucket per token
(atomic in a Lua script, Redis's clock): one round trip per request on the events and heartbeats
routes. The node-report route, on the event loop, takes tokens in leases of up to MAX_LEASE (an
eighth of the burst at most) and serves its requests from the lease: one round trip per lease,
not waited for by the requests the lease covers. The bucket is never overdrawn: a lease is spent a
little after it was taken, and what of it a process never spends is lost to the token (at most one
lease per process and token). While Redis is unreachable, each process falls back to its own
buckets rather than refusing reports.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from api.core.config import get_settings

log = logging.getLogger(__name__)

# Buckets kept in memory before full (idle) ones are dropped; a full bucket is the same as none.
MAX_IDLE_BUCKETS = 10_000
# Tokens an API process takes from a shared bucket at once for the node-report route (at most an eighth of the burst)
MAX_LEASE = 32
# Connections to Redis an API process's event loop holds at most (the node-report route's takes)
ASYNC_CONNECTIONS = 32


class Limiter(Protocol):
    def take(self, key: str, cost: float = 1.0) -> float:
        """Take `cost` from the bucket `key`: 0 when allowed, else the seconds until it would be."""
        ...

    async def take_async(self, key: str, cost: float = 1.0) -> float:
        """`take` for a route on the event loop: waiting for Redis never blocks the loop's other requests."""
        ...


@dataclass
class _Bucket:
    tokens: float
    updated: float


class TokenBuckets:
    """Token buckets in this process's memory."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def take(self, key: str, cost: float = 1.0) -> float:
        with self._lock:
            now = self.clock()
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= MAX_IDLE_BUCKETS:
                    self._forget_full(now)
                bucket = self._buckets[key] = _Bucket(self.burst, now)
            bucket.tokens = min(self.burst, bucket.tokens + max(0.0, now - bucket.updated) * self.rate)
            bucket.updated = now
            if bucket.tokens >= cost:
                bucket.tokens -= cost
                return 0.0
            return (cost - bucket.tokens) / self.rate

    async def take_async(self, key: str, cost: float = 1.0) -> float:
        return self.take(key, cost)

    def _forget_full(self, now: float) -> None:
        full = [k for k, b in self._buckets.items() if b.tokens + (now - b.updated) * self.rate >= self.burst]
        for key in full:
            del self._buckets[key]


# KEYS[1]: the bucket; ARGV: rate, burst, cost. Returns the wait in seconds (0: allowed), as a string.
_TAKE_SCRIPT = """
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local held = redis.call('HMGET', KEYS[1], 'tokens', 'updated')
local tokens = tonumber(held[1]) or burst
local updated = tonumber(held[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - updated) * rate)
local wait = 0
if tokens >= cost then tokens = tokens - cost else wait = (cost - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'updated', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 1)
return tostring(wait)
"""


class RedisTokenBuckets:
    """Token buckets shared by every API process through Redis; this process's own while it is down."""

    def __init__(self, url: str, rate: float, burst: float, prefix: str, *, retry_after_s: float = 5.0) -> None:
        import redis

        self.rate = rate
        self.burst = burst
        self.prefix = prefix
        self.retry_after_s = retry_after_s
        self.fallback = TokenBuckets(rate, burst)
        self.url = url
        self._client: Any = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        self._script: Any = self._client.register_script(_TAKE_SCRIPT)
        # an asyncio client belongs to the loop it first ran on: one per loop (a test's client makes loops of its own)
        self._async_scripts: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        self._down_until = 0.0
        # tokens this process took from a bucket ahead of its requests (take_async): a lease per key
        self.lease_size = float(max(1, min(MAX_LEASE, int(burst) // 8)))
        self._leases: dict[str, float] = {}
        self._lease_lock = threading.Lock()
        self._asking: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Task[bool]]] = (
            weakref.WeakKeyDictionary()
        )

    def take(self, key: str, cost: float = 1.0) -> float:
        if time.monotonic() >= self._down_until:
            try:
                return float(self._script(keys=[f"{self.prefix}{key}"], args=[self.rate, self.burst, cost]))
            except Exception as exc:  # a limiter must never be the reason reports are refused
                self._unreachable(exc)
        return self.fallback.take(key, cost)

    async def take_async(self, key: str, cost: float = 1.0) -> float:
        """From this process's lease on the bucket while it lasts; else a new lease of `lease_size` tokens from
        Redis (one round trip per lease, not per request); else, near the limit, this request's own token.

        One lease is asked for at a time per key and loop: the requests that find the lease spent while it is on
        its way wait for it. Each asking for its own, a 16,384-node job's reports held over a hundred round trips
        in flight at once, past the client's pool (MaxConnectionsError), and the limits fell back to this
        process's own buckets."""
        while self.lease_size > cost:
            with self._lease_lock:
                held = self._leases.get(key, 0.0)
                if held >= cost:
                    self._leases[key] = held - cost
                    return 0.0
            if not await self._lease_once(key):
                break
        return await self._take_from_redis(key, cost)

    async def _lease_once(self, key: str) -> bool:
        """Whether a lease of `lease_size` was added to `key`'s, by this call or by the one already asking."""
        loop = asyncio.get_running_loop()
        asking = self._asking.setdefault(loop, {})
        lease = asking.get(key)
        # A finished lease may still be listed (its callback below has not run yet), and awaiting it would not yield
        # to the loop: a request that found it (and the lease spent) went round this loop forever.
        if lease is None or lease.done():
            lease = asking[key] = loop.create_task(self._lease(key))
            lease.add_done_callback(lambda done: asking.pop(key) if asking.get(key) is done else None)
        return await asyncio.shield(lease)

    async def _lease(self, key: str) -> bool:
        if await self._take_from_redis(key, self.lease_size) != 0:
            return False
        with self._lease_lock:
            if len(self._leases) >= MAX_IDLE_BUCKETS:
                self._leases.clear()
            self._leases[key] = self._leases.get(key, 0.0) + self.lease_size
        return True

    async def _take_from_redis(self, key: str, cost: float) -> float:
        if time.monotonic() >= self._down_until:
            try:
                script = self._async_script()
                return float(await script(keys=[f"{self.prefix}{key}"], args=[self.rate, self.burst, cost]))
            except Exception as exc:
                self._unreachable(exc)
        return self.fallback.take(key, cost)

    def _unreachable(self, exc: Exception) -> None:
        """This process's own buckets stand in for `retry_after_s`."""
        self._down_until = time.monotonic() + self.retry_after_s
        log.warning(
            "rate limits: Redis unreachable (%s); limiting in this process for %.0f s",
            type(exc).__name__,
            self.retry_after_s,
        )

    def _async_script(self) -> Any:
        import redis.asyncio

        loop = asyncio.get_running_loop()
        script = self._async_scripts.get(loop)
        if script is None:
            # Requests past the pool's connections wait for one (the default pool raises MaxConnectionsError at
            # 100 in flight, and the limits would fall back to this process's buckets under a flood).
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                self.url,
                max_connections=ASYNC_CONNECTIONS,
                timeout=self.retry_after_s,
                socket_timeout=0.5,
                socket_connect_timeout=0.5,
            )
            client = redis.asyncio.Redis(connection_pool=pool)
            script = self._async_scripts[loop] = client.register_script(_TAKE_SCRIPT)
        return script


def ingest_limiter() -> Limiter | None:
    """The limiter for the current settings; None when limits are off (rate 0)."""
    settings = get_settings()
    return _limiter(settings.ingest_rate_per_s, settings.ingest_burst, settings.redis_url, settings.queue)


@lru_cache(maxsize=8)
def _limiter(rate: float, burst: int, redis_url: str | None, queue: str) -> Limiter | None:
    if rate <= 0:
        return None
    if redis_url:
        return RedisTokenBuckets(redis_url, rate, burst, prefix=f"ftplane:{queue}:ratelimit:")
    return TokenBuckets(rate, burst)


def retry_after(wait_s: float) -> int:
    """The Retry-After header for a wait: whole seconds, at least 1."""
    return max(1, math.ceil(wait_s))
