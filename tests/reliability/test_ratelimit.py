"""Per-token rate limits on the ingest endpoints: a 16,384-rank job is never throttled, a runaway is.

The sizing argument is in api/core/ratelimit.py; these tests check it against the traffic such a
job makes (simulated on a fake clock, request by request) and check the 429 itself end to end.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.core.config import Settings
from api.core.ratelimit import RedisTokenBuckets, TokenBuckets, retry_after
from ftplane.trainer.agent.uplink import Uplink
from tests.conftest import REDIS_URL, configure_env, require, tiny_spec
from tests.support.inprocess_transport import InProcessTransport

RANKS = 16_384


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_16384_rank_job_is_never_throttled_by_the_default_limits() -> None:
    """Every rank reports once a second, checkpoints and restarts make all ranks report at once, and
    after a 60 s outage every rank flushes a heartbeat and its event backlog together."""
    defaults = Settings()
    clock = FakeClock()
    limiter = TokenBuckets(defaults.ingest_rate_per_s, defaults.ingest_burst, clock=clock)
    rng = random.Random(16384)
    phase = [rng.random() for _ in range(RANKS)]  # where in its second each rank reports
    throttled = {"heartbeats": 0, "events": 0}
    sent = {"heartbeats": 0, "events": 0}

    def post(endpoint: str, at: float) -> None:
        clock.now = at
        sent[endpoint] += 1
        if limiter.take(f"job-token:{endpoint}") > 0:
            throttled[endpoint] += 1

    def all_ranks_at_once(endpoint: str, start: float, requests_per_rank: int, spread_s: float) -> None:
        for rank in range(RANKS):
            for _ in range(requests_per_rank):
                post(endpoint, start + spread_s * rank / RANKS)

    start = clock.now
    for second in range(12):  # steady state: one heartbeat batch per rank per second
        beats = sorted((start + second + phase[r] + rng.uniform(-0.05, 0.05), r) for r in range(RANKS))
        for at, _ in beats:
            post("heartbeats", at)
        if second % 5 == 0:  # a checkpoint: every rank reports checkpoint_saved within 50 ms
            all_ranks_at_once("events", start + second + 0.5, 1, 0.05)
    # An in-job restart: every rank reports running (and its restart) at once.
    all_ranks_at_once("events", start + 12.2, 2, 0.01)
    # A 60 s outage of the control plane, then every rank flushes at once, within 100 ms: its newest
    # heartbeat, and its queued events (up to 4 batches of 1000 each: 4,000 events per rank).
    back = start + 13 + 60
    all_ranks_at_once("heartbeats", back, 1, 0.1)
    all_ranks_at_once("events", back, 4, 0.1)
    for second in range(5):  # and steady state again right after
        for r in range(RANKS):
            post("heartbeats", back + 1 + second + phase[r])

    assert sent["heartbeats"] > 17 * RANKS and sent["events"] > 8 * RANKS
    assert throttled == {"heartbeats": 0, "events": 0}
    print(
        f"\nsimulated {RANKS:,}-rank job on a fake clock: {sent['heartbeats']:,} heartbeat and {sent['events']:,} "
        f"event requests through one limiter with the default settings, {sum(throttled.values())} throttled"
    )


def test_a_runaway_token_is_throttled_and_told_when_to_retry() -> None:
    defaults = Settings()
    clock = FakeClock()
    limiter = TokenBuckets(defaults.ingest_rate_per_s, defaults.ingest_burst, clock=clock)
    rate = defaults.ingest_rate_per_s
    waits = []
    # Three times the limit, for 5 s: the burst is spent after ~1 s, then two requests in three wait.
    for i in range(int(3 * rate * 5)):
        clock.now = 1000.0 + i / (3 * rate)
        waits.append(limiter.take("runaway:events"))
    throttled = [w for w in waits if w > 0]
    assert len(throttled) / len(waits) > 0.5
    assert all(0 < w <= 1 / rate + 1e-9 for w in throttled)
    assert retry_after(max(throttled)) == 1
    # Another token is not affected by the runaway.
    assert limiter.take("well-behaved:events") == 0


def test_idle_buckets_are_forgotten() -> None:
    clock = FakeClock()
    limiter = TokenBuckets(10, 5, clock=clock)
    from api.core import ratelimit

    for i in range(ratelimit.MAX_IDLE_BUCKETS + 10):
        limiter.take(f"t{i}")
        clock.now += 1  # each bucket is full again a second later
    assert len(limiter._buckets) <= ratelimit.MAX_IDLE_BUCKETS


@pytest.fixture
def limiter_clock() -> FakeClock:
    """The clock of the `limited` app's buckets: it stands still unless a test moves it, so no request is refused
    or let through because of how long the requests before it took on a busy machine."""
    return FakeClock()


@pytest.fixture
def limited(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, limiter_clock: FakeClock) -> Iterator[TestClient]:
    """The app on SQLite with tiny limits: 2 requests/s, 3 at once, its buckets on `limiter_clock`."""
    configure_env(
        monkeypatch,
        tmp_path / "state",
        f"sqlite:///{tmp_path / 'ftplane.db'}",
        FTPLANE_INGEST_RATE_PER_S="2",
        FTPLANE_INGEST_BURST="3",
    )
    from api.core import ratelimit
    from api.core.db import session_scope
    from api.main import create_app
    from api.models import tokens

    ratelimit._limiter.cache_clear()  # buckets of this test's own
    limiter = ratelimit.ingest_limiter()
    assert isinstance(limiter, TokenBuckets)
    limiter.clock = limiter_clock
    app = create_app()
    with session_scope() as session:
        _, token = tokens.create_admin(session, "tests")
    yield TestClient(app, headers={"Authorization": f"Bearer {token}"})
    ratelimit._limiter.cache_clear()  # no later test gets buckets on a clock that stands still


def test_over_the_limit_is_429_with_retry_after_and_nothing_stored(
    limited: TestClient, limiter_clock: FakeClock
) -> None:
    job = limited.post("/v1/jobs", json=tiny_spec()).json()
    other = limited.post("/v1/jobs", json=tiny_spec(name="other")).json()
    trainer = TestClient(limited.app, headers={"Authorization": f"Bearer {job['token']}"})
    beats = f"/v1/jobs/{job['id']}/heartbeats"

    for step in (1, 2, 3):
        assert trainer.post(beats, json={"heartbeats": [{"rank": 0, "step": step}]}).status_code == 200
    refused = trainer.post(beats, json={"heartbeats": [{"rank": 0, "step": 4}]})
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["Retry-After"]) <= 2
    assert "rate limit" in refused.json()["error"]["message"]
    assert limited.get(f"/v1/jobs/{job['id']}/ranks").json()[0]["step"] == 3  # the refused beat changed nothing

    # Per token and per endpoint: the same token's events, another job's token, and admins reading are
    # not affected.
    event = {"events": [{"key": "e1", "type": "checkpoint_saved", "step": 3}]}
    assert trainer.post(f"/v1/jobs/{job['id']}/events", json=event).status_code == 200
    other_trainer = TestClient(limited.app, headers={"Authorization": f"Bearer {other['token']}"})
    assert other_trainer.post(f"/v1/jobs/{other['id']}/heartbeats", json={"heartbeats": [{"rank": 0, "step": 1}]})
    for _ in range(10):
        assert limited.get(f"/v1/jobs/{job['id']}").status_code == 200

    # The bucket refills: one request every half second.
    limiter_clock.now += float(refused.headers["Retry-After"])
    assert trainer.post(beats, json={"heartbeats": [{"rank": 0, "step": 5}]}).status_code == 200


def test_unauthenticated_requests_do_not_spend_a_tokens_limit(limited: TestClient) -> None:
    job = limited.post("/v1/jobs", json=tiny_spec()).json()
    beats = f"/v1/jobs/{job['id']}/heartbeats"
    anonymous = TestClient(limited.app)
    for _ in range(5):
        assert anonymous.post(beats, json={"heartbeats": [{"rank": 0, "step": 1}]}).status_code == 401
    trainer = TestClient(limited.app, headers={"Authorization": f"Bearer {job['token']}"})
    assert trainer.post(beats, json={"heartbeats": [{"rank": 0, "step": 1}]}).status_code == 200


def test_the_agents_uplink_waits_out_a_429_and_loses_nothing(
    limited: TestClient, limiter_clock: FakeClock, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's real uplink against the real API: 12 event batches through a limit of 3 at once, 2/s. The
    buckets' time passes only while the uplink waits out a refusal (its Retry-After), as if every batch it
    sends at once arrived at once however busy the machine."""
    caplog.set_level(logging.WARNING, logger="ftplane.trainer.agent.uplink")  # whatever an earlier test left
    from api.core import ratelimit

    limiter = ratelimit.ingest_limiter()
    assert isinstance(limiter, TokenBuckets)
    take = limiter.take

    def take_then_wait_out_a_refusal(key: str, cost: float = 1.0) -> float:
        wait = take(key, cost)
        limiter_clock.now += retry_after(wait) if wait > 0 else 0.0  # the refused uplink waits that long
        return wait

    monkeypatch.setattr(limiter, "take", take_then_wait_out_a_refusal)
    job = limited.post("/v1/jobs", json=tiny_spec()).json()
    transport = InProcessTransport(limited.app)  # the app in process, over httpx
    reporter = Uplink("http://testserver", job["id"], 0, job["token"], "node-a", transport=transport, interval_s=0.05)
    keys = []
    for step in range(12):
        keys.append(reporter.event("checkpoint_saved", rank=0, step=step, details={"step": step}))
        assert reporter.flush(30)  # one batch each, sent at once: the fourth inside the first half second is over
    reporter.close()
    stored = limited.get(f"/v1/jobs/{job['id']}/events", params={"limit": 100}).json()["items"]
    assert sorted(e["key"] for e in stored) == sorted(keys)
    assert sorted(e["step"] for e in stored) == list(range(12))
    assert any("HTTP 429" in r.getMessage() for r in caplog.records), "the limit was never hit"


@pytest.mark.redis
def test_limits_are_shared_by_api_processes_through_redis() -> None:
    url = require(REDIS_URL, "FTPLANE_TEST_REDIS_URL")
    prefix = f"ftplane-test-{uuid.uuid4().hex[:8]}:ratelimit:"
    first = RedisTokenBuckets(url, rate=1, burst=5, prefix=prefix)
    second = RedisTokenBuckets(url, rate=1, burst=5, prefix=prefix)  # another API process
    allowed = sum(1 for limiter in (first, second) * 5 if limiter.take("job-token:events") == 0)
    assert allowed == 5  # one bucket for both, not 5 each
    assert 0 < second.take("job-token:events") <= 1.0
    assert first.take("another-token:events") == 0


def test_an_unreachable_redis_never_refuses_reports() -> None:
    limiter = RedisTokenBuckets("redis://127.0.0.1:1/0", rate=1, burst=3, prefix="x:")
    started = time.monotonic()
    assert [limiter.take("t") for _ in range(3)] == [0, 0, 0]  # this process's own buckets take over
    assert limiter.take("t") > 0
    assert time.monotonic() - started < 5


@pytest.mark.redis
def test_the_report_routes_async_take_shares_the_bucket_of_the_sync_one() -> None:
    """The node-report route takes from the bucket on the event loop (redis.asyncio), the other routes in a thread:
    one bucket per token whichever way, and from loops one after another (a client per loop)."""
    url = require(REDIS_URL, "FTPLANE_TEST_REDIS_URL")
    prefix = f"ftplane-test-{uuid.uuid4().hex[:8]}:ratelimit:"
    limiter = RedisTokenBuckets(url, rate=1, burst=5, prefix=prefix)
    waits = [asyncio.run(limiter.take_async("job-token:reports")) for _ in range(3)]  # three loops
    waits += [limiter.take("job-token:reports") for _ in range(2)]
    assert waits == [0, 0, 0, 0, 0]
    assert 0 < asyncio.run(limiter.take_async("job-token:reports")) <= 1.0


def test_an_unreachable_redis_never_refuses_reports_on_the_event_loop_either() -> None:
    limiter = RedisTokenBuckets("redis://127.0.0.1:1/0", rate=1, burst=3, prefix="x:")

    async def four() -> list[float]:
        return [await limiter.take_async("t") for _ in range(4)]

    started = time.monotonic()
    waits = asyncio.run(four())
    assert waits[:3] == [0, 0, 0] and waits[3] > 0  # this process's own buckets take over
    assert time.monotonic() - started < 5


@pytest.mark.redis
def test_the_report_route_takes_tokens_in_leases_and_never_overdraws_the_bucket() -> None:
    url = require(REDIS_URL, "FTPLANE_TEST_REDIS_URL")
    prefix = f"ftplane-test-{uuid.uuid4().hex[:8]}:ratelimit:"
    reports = RedisTokenBuckets(url, rate=0.001, burst=64, prefix=prefix)  # no refill within the test
    assert reports.lease_size == 8
    assert asyncio.run(reports.take_async("job-token")) == 0  # one round trip: a lease of 8
    other_process = RedisTokenBuckets(url, rate=0.001, burst=64, prefix=prefix)
    assert sum(other_process.take("job-token") == 0 for _ in range(60)) == 56  # the bucket held 64 - 8

    async def eight() -> list[float]:
        return [await reports.take_async("job-token") for _ in range(8)]

    waits = asyncio.run(eight())
    assert waits[:7] == [0] * 7 and waits[7] > 0  # the lease's other 7, then the bucket is empty: 64 in all


def buckets_counting_round_trips() -> tuple[RedisTokenBuckets, list[float]]:
    """Shared buckets with room for leases of 32 (no refill within a test), and the cost of each round trip to Redis."""
    url = require(REDIS_URL, "FTPLANE_TEST_REDIS_URL")
    prefix = f"ftplane-test-{uuid.uuid4().hex[:8]}:ratelimit:"
    reports = RedisTokenBuckets(url, rate=0.001, burst=65536, prefix=prefix)
    trips: list[float] = []
    take_from_redis = reports._take_from_redis

    async def counted(key: str, cost: float) -> float:
        trips.append(cost)
        return await take_from_redis(key, cost)

    reports._take_from_redis = counted  # type: ignore[method-assign]
    return reports, trips


@pytest.mark.redis
def test_reports_arriving_together_wait_for_one_lease_not_a_round_trip_each() -> None:
    """300 reports at once on one token (a 16,384-node job's agents share it): a lease of 32 is asked for at a time,
    so 10 round trips serve them all; each asking for its own, they held 300 connections at once, past the client's
    pool, and the limits fell back to this process's buckets."""
    reports, trips = buckets_counting_round_trips()
    assert reports.lease_size == 32

    async def together() -> list[float]:
        return await asyncio.gather(*(reports.take_async("job-token") for _ in range(300)))

    assert asyncio.run(together()) == [0.0] * 300
    assert trips == [32.0] * 10 and time.monotonic() >= reports._down_until  # never fell back


@pytest.mark.redis
def test_a_flood_past_the_leases_waits_for_redis_connections_instead_of_falling_back() -> None:
    """A burst of 8 leaves no room for leases: each of 300 reports at once takes its own token from Redis. They wait
    for the event loop's connections (ASYNC_CONNECTIONS); with redis.asyncio's default pool the 101st in flight
    raised MaxConnectionsError and the limits fell back to this process's own buckets for a while."""
    url = require(REDIS_URL, "FTPLANE_TEST_REDIS_URL")
    prefix = f"ftplane-test-{uuid.uuid4().hex[:8]}:ratelimit:"
    reports = RedisTokenBuckets(url, rate=0.001, burst=8, prefix=prefix)
    assert reports.lease_size == 1  # a token per request, straight from Redis

    async def together() -> list[float]:
        return await asyncio.gather(*(reports.take_async("runaway") for _ in range(300)))

    waits = asyncio.run(together())
    assert sum(w == 0 for w in waits) == 8 and time.monotonic() >= reports._down_until  # the shared bucket decided


@pytest.mark.redis
def test_a_finished_lease_still_listed_is_asked_for_again_not_awaited_in_a_loop() -> None:
    """Between a lease's end and the callback that unlists it, other requests can spend it. One that then found the
    finished lease awaited it again (which never yields to the loop) and spun forever: an API process at a full core
    that no signal reached, found after a 16,384-node run. It must ask Redis for a new lease instead."""
    reports, trips = buckets_counting_round_trips()

    async def with_a_spent_lease_still_listed() -> bool:
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[bool] = loop.create_future()
        finished.set_result(True)  # its 32 tokens already spent by others: none left in the lease
        reports._asking[loop] = {"job-token": finished}  # type: ignore[dict-item]
        return await reports._lease_once("job-token")

    assert asyncio.run(with_a_spent_lease_still_listed()) is True
    assert trips == [32.0] and reports._leases["job-token"] == 32.0  # a new lease, from Redis
