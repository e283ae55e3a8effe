"""The report route's caches: requests that miss together wait for one load, and a failed load fails them all
(and is not cached)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from api.services import report_gate
from api.services.report_gate import JobState


def test_requests_that_miss_together_wait_for_one_load(monkeypatch: pytest.MonkeyPatch) -> None:
    report_gate.forget_all()
    loads: list[str] = []
    release = threading.Event()

    def load_job(job_id: str) -> JobState:
        loads.append(job_id)
        assert release.wait(10)  # the load is slow: every request below arrives while it runs
        state = JobState("RUNNING", 0, None, frozenset())
        report_gate._jobs[job_id] = state
        return state

    monkeypatch.setattr(report_gate, "load_job", load_job)

    async def hundred_requests() -> list[JobState | None]:
        waiting = [asyncio.ensure_future(report_gate.job_state("j1")) for _ in range(100)]
        await asyncio.sleep(0)  # every request has missed the cache and found the load in flight
        release.set()
        return await asyncio.gather(*waiting)

    states = asyncio.run(hundred_requests())
    assert loads == ["j1"] and {s.status if s else None for s in states} == {"RUNNING"}
    assert asyncio.run(report_gate.job_state("j1")) == states[0] and loads == ["j1"]  # cached now
    report_gate.forget_all()


def test_a_failed_load_fails_its_waiters_and_the_next_request_loads_again(monkeypatch: pytest.MonkeyPatch) -> None:
    report_gate.forget_all()
    calls = 0

    def failing(job_id: str) -> JobState:
        nonlocal calls
        calls += 1
        raise ConnectionError("database away")

    monkeypatch.setattr(report_gate, "load_job", failing)

    async def two() -> list[object]:
        return await asyncio.gather(report_gate.job_state("j2"), report_gate.job_state("j2"), return_exceptions=True)

    assert all(isinstance(r, ConnectionError) for r in asyncio.run(two())) and calls == 1
    with pytest.raises(ConnectionError):
        asyncio.run(report_gate.job_state("j2"))
    assert calls == 2 and report_gate._in_flight == {}
