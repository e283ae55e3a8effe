"""The node-report caches: requests that miss together wait for one load, a failed load fails them all (and is
not cached), and a token is authenticated by the one rule every route uses."""

from __future__ import annotations

import asyncio
import threading

import pytest

from api.services.ingest import caches
from api.services.ingest.caches import JobState


def test_requests_that_miss_together_wait_for_one_load(monkeypatch: pytest.MonkeyPatch) -> None:
    caches.forget_all()
    loads: list[str] = []
    release = threading.Event()

    def load_job(job_id: str) -> JobState:
        loads.append(job_id)
        assert release.wait(10)  # the load is slow: every request below arrives while it runs
        state = JobState("RUNNING", 0, None, frozenset())
        caches._jobs[job_id] = state
        return state

    monkeypatch.setattr(caches, "load_job", load_job)

    async def hundred_requests() -> list[JobState | None]:
        waiting = [asyncio.ensure_future(caches.job_state("j1")) for _ in range(100)]
        await asyncio.sleep(0)  # every request has missed the cache and found the load in flight
        release.set()
        return await asyncio.gather(*waiting)

    states = asyncio.run(hundred_requests())
    assert loads == ["j1"] and {s.status if s else None for s in states} == {"RUNNING"}
    assert asyncio.run(caches.job_state("j1")) == states[0] and loads == ["j1"]  # cached now
    caches.forget_all()


def test_a_failed_load_fails_its_waiters_and_the_next_request_loads_again(monkeypatch: pytest.MonkeyPatch) -> None:
    caches.forget_all()
    calls = 0

    def failing(job_id: str) -> JobState:
        nonlocal calls
        calls += 1
        raise ConnectionError("database away")

    monkeypatch.setattr(caches, "load_job", failing)

    async def two() -> list[object]:
        return await asyncio.gather(caches.job_state("j2"), caches.job_state("j2"), return_exceptions=True)

    assert all(isinstance(r, ConnectionError) for r in asyncio.run(two())) and calls == 1
    with pytest.raises(ConnectionError):
        asyncio.run(caches.job_state("j2"))
    assert calls == 2 and caches._in_flight == {}


def test_a_token_is_authenticated_as_every_route_does_it_and_kept_for_the_ttl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cache asks tokens.authenticate (the one rule of who a token is), once per token within the TTL; a token
    it refuses is kept refused as well."""
    from api.core.authz import Principal
    from api.core.config import get_settings
    from api.models import tokens

    monkeypatch.setenv("FTPLANE_AUTH_CACHE_TTL_S", "60")
    get_settings.cache_clear()
    caches.forget_all()
    asked: list[str] = []

    def authenticate(session: object, token: str) -> Principal | None:
        asked.append(token)
        return Principal(token_id="t1", kind="trainer", job_id="j1") if token == "good" else None

    monkeypatch.setattr(tokens, "authenticate", authenticate)

    async def twice_each() -> list[Principal | None]:
        return [await caches.principal(token) for token in ("good", "good", "bad", "bad")]

    good, again, bad, bad_again = asyncio.run(twice_each())
    assert good == again == Principal(token_id="t1", kind="trainer", job_id="j1")
    assert bad is None and bad_again is None and asked == ["good", "bad"]
    caches.forget_all()
    get_settings.cache_clear()


class SteppingClock:
    """A cache timer that moves on by `step` seconds at every read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_an_entry_that_expires_while_it_is_read_is_a_miss_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read of the clock moves it 0.6 s on a cache of 1 s: an entry stored at 0.6 s is alive at the next read
    (1.2 s) and gone at the one after (1.8 s). Read twice per lookup, it raised KeyError (a 500 under load)."""
    from cachetools import TTLCache

    state = JobState("RUNNING", 0, None, frozenset())
    jobs: TTLCache[str, JobState | None] = TTLCache(10, ttl=1.0, timer=SteppingClock(0.6))
    jobs["j1"] = state
    monkeypatch.setattr(caches, "_jobs", jobs)
    assert caches.cached_job("j1") == (True, state)
    jobs["j2"] = state
    jobs.timer.now += 0.3  # type: ignore[attr-defined]  # j2 is alive at the lookup's one read, barely
    assert caches.cached_job("j2") == (True, state)
    assert caches.cached_job("j2") == (False, None)  # expired: a miss, loaded again by job_state


def test_a_token_that_expires_while_it_is_read_is_a_miss_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from cachetools import TTLCache

    from api.core.security import digest

    principals: TTLCache[str, object] = TTLCache(10, ttl=1.0, timer=SteppingClock(0.6))
    principals[digest("t")] = None  # a token known to be invalid
    monkeypatch.setattr(caches, "_principals", principals)
    monkeypatch.setattr(caches, "_resize_principals", lambda ttl: None)
    assert caches.cached_principal("t") == (True, None)
    assert caches.cached_principal("t") == (False, None)
