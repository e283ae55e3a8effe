"""AsyncUplink: the asyncio driver of ReportBuffer. It must send what the threaded Uplink sends and take the same
decisions (batching, retries, backoff, refusals); the last test runs it against the real report route."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any
from unittest import mock

import httpx
from fastapi.testclient import TestClient

from ftplane.trainer.agent.report_buffer import Outcome, Report, ReportBuffer, classify
from ftplane.trainer.agent.uplink import AsyncUplink, Uplink
from tests.trainer.agent.conftest import events, submitted_job

JOB = "job-1"
STATUS = {"pid": 10, "launcher": {"pid": 11, "alive": True}, "ranks": [], "progress": "sdk", "healthy": True}


def beat(rank: int, step: int) -> dict[str, Any]:
    return {"rank": rank, "step": step, "ts": "2026-01-01T00:00:00+00:00", "node": "node-a"}


class Server:
    """A stand-in for the report route: records each body, answers from a script (then 200)."""

    def __init__(self, *answers: httpx.Response | Exception, then: httpx.Response | Exception | None = None) -> None:
        self.answers = list(answers)
        self.then = then or httpx.Response(200, json={"faults": []})
        self.bodies: list[dict[str, Any]] = []
        self.times: list[float] = []
        self.lock = threading.Lock()

    def answer(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            assert request.url.path == f"/v1/jobs/{JOB}/reports"
            assert request.headers["Authorization"] == "Bearer secret"
            self.bodies.append(json.loads(request.content))
            self.times.append(time.monotonic())
            answer = self.answers.pop(0) if self.answers else self.then
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def answer_async(self, request: httpx.Request) -> httpx.Response:
        return self.answer(request)

    def event_keys(self) -> list[list[str]]:
        return [[e["key"] for e in body["events"]] for body in self.bodies]


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 30))


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def async_uplink(server: Server, **kwargs: Any) -> AsyncUplink:
    kwargs.setdefault("interval_s", 0.2)
    kwargs.setdefault("backoff_base_s", 0.05)
    transport = httpx.MockTransport(server.answer_async)
    return AsyncUplink("http://cp", JOB, 0, "secret", "node-a", transport=transport, **kwargs)


def test_a_report_carries_liveness_heartbeats_and_events_and_an_accepted_one_is_settled() -> None:
    server = Server()
    settled: list[tuple[Report, Outcome, float]] = []

    async def main() -> None:
        uplink = async_uplink(server, on_settled=lambda r, o, s: settled.append((r, o, s)))
        uplink.start()
        uplink.liveness(STATUS)
        uplink.heartbeat(beat(0, 1))
        uplink.heartbeat(beat(0, 2))  # the newest per rank is what goes
        uplink.heartbeat(beat(1, 2))
        key = uplink.event("rank_failed", rank=1, step=2, details={"cause": "x"})
        assert await uplink.close(5.0)
        assert uplink.pending() == (0, 0)
        (body,) = server.bodies
        assert body["attempt"] == 0 and body["node"] == "node-a" and body["agent"] == STATUS
        assert sorted((b["rank"], b["step"]) for b in body["heartbeats"]) == [(0, 2), (1, 2)]
        (event,) = body["events"]
        assert event["key"] == key and event["type"] == "rank_failed" and event["node"] == "node-a"
        assert event["attempt"] == 0 and event["rank"] == 1 and event["details"] == {"cause": "x"}

    run(main)
    ((report, outcome, seconds),) = settled
    assert outcome.ok and report.liveness == STATUS and len(report.events) == 1 and seconds >= 0


def test_it_sends_the_same_bodies_as_the_threaded_uplink() -> None:
    """Same inputs, same reports: both drivers take what they send from ReportBuffer and Report.body."""

    def feed(uplink: Uplink | AsyncUplink) -> None:
        uplink.liveness(STATUS)
        for rank in range(8):
            uplink.heartbeat(beat(rank, 5))
        uplink.event("checkpoint_saved", rank=0, step=5, key="k1", ts="2026-01-01T00:00:01+00:00")
        uplink.forward_event({"key": "k2", "type": "running", "ts": "2026-01-01T00:00:02+00:00", "rank": 3})

    threaded = Server()
    uplink = Uplink("http://cp", JOB, 0, "secret", "node-a", transport=httpx.MockTransport(threaded.answer))
    feed(uplink)
    assert uplink.close(5.0)

    asynchronous = Server()

    async def main() -> None:
        uplink = async_uplink(asynchronous)
        feed(uplink)  # queued before the task starts: one report, as for the thread that was waiting
        uplink.start()
        assert await uplink.close(5.0)

    run(main)
    assert asynchronous.bodies == threaded.bodies and len(threaded.bodies) == 1


def test_reports_keep_to_the_interval_and_events_go_at_once() -> None:
    server = Server()

    async def main() -> None:
        uplink = async_uplink(server, interval_s=2.0)
        uplink.start()
        uplink.heartbeat(beat(0, 1))
        await until(lambda: len(server.bodies) == 1)  # the first report goes at once
        uplink.heartbeat(beat(0, 2))
        uplink.heartbeat(beat(0, 3))
        await asyncio.sleep(0.2)
        assert len(server.bodies) == 1  # heartbeats wait for the interval
        uplink.event("rank_failed", rank=0)
        await until(lambda: len(server.bodies) == 2)  # an event does not
        assert server.times[1] - server.times[0] < 1.5
        await uplink.close(5.0)

    run(main)
    assert [[b["step"] for b in body["heartbeats"]] for body in server.bodies] == [[1], [3]]


def test_the_agents_liveness_sets_the_pace_and_goes_at_once_with_the_heartbeats() -> None:
    """The agent hands over liveness every interval (its loop drifts by its own work); ranks send heartbeats all the
    while. Each liveness goes at once, none is replaced before it went, and there is one report per liveness."""
    interval, tick = 8.0, 0.01
    buffer = ReportBuffer(interval_s=interval)
    handed: list[tuple[dict[str, Any], float]] = []
    reports: list[tuple[Report, float]] = []
    next_status, next_beat, step = 0.0, 0.0, 0
    for i in range(int(200 / tick)):
        now = i * tick
        if now >= next_beat:
            step += 1
            buffer.add_heartbeat(beat(0, step))
            next_beat += 0.5
        if now >= next_status:
            status = dict(STATUS)
            buffer.set_liveness(status)
            handed.append((status, now))
            next_status = now + interval + 0.003  # the agent's observation takes a little time each round
        if buffer.due_in(now) == 0.0:
            report = buffer.take(now)
            buffer.settle(report, Outcome(ok=True), now)
            reports.append((report, now))
    sent_at: dict[int, float] = {}
    for report, at in reports:
        sent_at.setdefault(id(report.liveness), at)
    assert len(reports) == len(handed)
    for status, at in handed:
        assert sent_at[id(status)] - at < 2 * tick
    assert all(report.heartbeats for report, _ in reports)  # the heartbeats ride with the liveness

    alone = ReportBuffer(interval_s=interval)
    alone.add_heartbeat(beat(0, 1))
    assert alone.due_in(0.0) == 0.0
    alone.settle(alone.take(0.0), Outcome(ok=True), 0.0)
    alone.add_heartbeat(beat(0, 2))
    assert alone.due_in(1.0) == 2 * interval - 1.0  # no liveness handed over: two intervals after the last report
    alone.set_liveness(dict(STATUS))
    assert alone.due_in(1.0) == 0.0


def test_a_failed_report_is_retried_with_backoff_and_the_same_keys_honouring_retry_after() -> None:
    server = Server(
        httpx.Response(503, text="busy"),
        httpx.ConnectError("refused"),
        httpx.Response(429, headers={"Retry-After": "0.4"}),
    )

    async def main() -> None:
        uplink = async_uplink(server)
        uplink.start()
        key = uplink.event("rank_failed", rank=0)
        await until(lambda: len(server.bodies) == 4 and not uplink.buffer.events)
        assert uplink.buffer.failures == 0 and uplink.pending() == (0, 0)
        assert server.event_keys() == [[key]] * 4
        await uplink.close(1.0)

    run(main)
    gaps = [b - a for a, b in zip(server.times, server.times[1:], strict=False)]
    assert gaps[0] >= 0.025 and gaps[1] >= 0.05  # backoff: base/2 .. base, then doubled
    assert gaps[2] >= 0.39  # Retry-After outranks a shorter backoff


def test_a_shed_report_whose_liveness_was_taken_sends_its_events_again_not_its_heartbeats() -> None:
    """A busy server sheds a report's events (503) and takes its liveness and heartbeats anyway, and says so."""
    taken = {"error": {"status": 503, "message": "busy", "liveness_taken": True, "accepted": 1}}
    server = Server(httpx.Response(503, json=taken, headers={"Retry-After": "0"}))
    settled: list[Outcome] = []

    async def main() -> None:
        uplink = async_uplink(server, on_settled=lambda r, o, s: settled.append(o))
        uplink.liveness(STATUS)
        uplink.heartbeat(beat(0, 1))
        key = uplink.event("rank_failed", rank=0)
        uplink.start()
        await until(lambda: len(server.bodies) == 2 and not uplink.buffer.events)
        await uplink.close(1.0)
        assert server.event_keys() == [[key], [key]]
        assert [len(body["heartbeats"]) for body in server.bodies] == [1, 0]
        assert uplink.buffer.settled_all()

    run(main)
    assert [(o.ok, o.retry, o.liveness_taken) for o in settled] == [(False, True, True), (True, False, False)]
    for body in ('{"error": {"status": 503, "message": "db down"}}', "busy", '["x"]'):
        assert not classify(503, body, None, "/r").liveness_taken  # said nothing: everything goes again
    assert not classify(500, json.dumps(taken), None, "/r").liveness_taken  # only a shed (503) says it


def test_a_refused_report_is_dropped_not_resent() -> None:
    server = Server(httpx.Response(422, json={"detail": "bad"}))

    async def main() -> None:
        uplink = async_uplink(server)
        uplink.start()
        uplink.event("rank_failed", rank=0)
        assert await uplink.flush(5.0)
        uplink.event("running", rank=0)
        assert await uplink.close(5.0)

    run(main)
    assert [len(keys) for keys in server.event_keys()] == [1, 1]
    assert server.bodies[0]["events"][0]["type"] == "rank_failed"
    assert server.bodies[1]["events"][0]["type"] == "running"


def test_flush_skips_the_backoff_wait_and_close_says_when_something_was_not_delivered() -> None:
    down = Server(then=httpx.ConnectError("down"))

    async def main() -> None:
        uplink = async_uplink(down, backoff_base_s=30.0, backoff_cap_s=60.0)
        uplink.start()
        uplink.event("rank_failed", rank=0)
        await until(lambda: uplink.buffer.failures == 1)
        await asyncio.sleep(0.1)
        assert len(down.bodies) == 1  # then waits 15-30 s
        started = time.monotonic()
        assert not await uplink.close(0.3)  # flushing resends at once, once, and gives up at the timeout
        assert time.monotonic() - started < 2
        # one resend, then the backoff again: an agent whose control plane is away never spins
        assert len(down.bodies) == 2 and uplink.pending() == (1, 0)

    run(main)


def test_an_exiting_agent_past_the_1_s_interval_holds_its_last_report_then_flushes_it() -> None:
    """Both drivers: at the 2 s interval a close with `hold` (an agent exiting on its own) holds what is left for a
    random part of one interval, at most half of close's bound (3 s here: 1.5 s at most), then flushes it. Each draw
    is checked against the time the report went. A node's `running` waits for its next liveness (3 s), so nothing
    goes before the close. A close without `hold` (an agent told to stop) holds nothing."""
    draws: list[float] = []
    real_hold = ReportBuffer.hold_last_flush

    def hold(buffer: ReportBuffer, now: float, timeout: float) -> float:
        draws.append(real_hold(buffer, now, timeout))
        return draws[-1]

    def running(uplink: Uplink | AsyncUplink) -> None:
        uplink.forward_event({"key": "run:0", "type": "running", "ts": "2026-01-01T00:00:00+00:00", "rank": 0})

    with mock.patch.object(ReportBuffer, "hold_last_flush", hold):
        threaded = Server()
        uplink = Uplink(
            "http://cp", JOB, 0, "secret", "node-a", interval_s=2.0, transport=httpx.MockTransport(threaded.answer)
        )
        running(uplink)
        closed = time.monotonic()
        assert uplink.close(3.0, hold=True)

        asynchronous = Server()

        async def main() -> None:
            uplink = async_uplink(asynchronous, interval_s=2.0)
            uplink.start()
            running(uplink)
            asynchronous.times.insert(0, time.monotonic())  # when close began, kept beside the POST's time
            assert await uplink.close(3.0, hold=True)

        run(main)
        told_to_stop = Server()
        uplink = Uplink(
            "http://cp", JOB, 0, "secret", "node-a", interval_s=2.0, transport=httpx.MockTransport(told_to_stop.answer)
        )
        running(uplink)
        assert uplink.close(3.0) and told_to_stop.event_keys() == [["run:0"]]
    assert len(draws) == 2 and 0 <= draws[0] <= 1.5 and 0 <= draws[1] <= 1.5
    assert threaded.event_keys() == [["run:0"]] and threaded.times[0] - closed >= draws[0] - 0.01
    began, sent = asynchronous.times
    assert asynchronous.event_keys() == [["run:0"]] and sent - began >= draws[1] - 0.01


def test_fault_directives_in_a_reply_reach_on_faults() -> None:
    directive = {"id": "f1", "kind": "crash", "rank": 0, "at_step": None, "delivery": "agent"}
    server = Server(httpx.Response(200, json={"faults": [directive]}))
    seen: list[list[dict[str, Any]]] = []

    async def main() -> None:
        uplink = async_uplink(server, on_faults=seen.append)
        uplink.start()
        uplink.liveness(STATUS)
        await uplink.close(5.0)

    run(main)
    assert seen == [[directive]]


def test_stop_abandons_a_report_in_flight() -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(60)
        raise AssertionError("not reached")

    async def main() -> None:
        uplink = AsyncUplink("http://cp", JOB, 0, None, "node-a", transport=httpx.MockTransport(hang))
        uplink.start()
        uplink.event("rank_failed", rank=0)
        await until(lambda: uplink.buffer.reports == 0 and not uplink.buffer.settled_all() and uplink._in_flight)
        await uplink.stop()
        assert uplink.pending() == (1, 0)  # never accepted: still queued

    run(main)


def test_against_the_report_route(admin: TestClient, make_job: Callable[..., dict[str, Any]], live: str) -> None:
    """The real API (on SQLite) stores what it sends (a resent event once) and its liveness."""
    job = submitted_job(admin, make_job)
    keys: list[str] = []

    async def main() -> None:
        uplink = AsyncUplink(live, job["id"], 0, job["token"], "node-a", interval_s=0.2)
        uplink.start()
        uplink.liveness({**STATUS, "ranks": [{"rank": 0, "local_rank": 0, "pid": 12, "alive": True}]})
        uplink.heartbeat({**beat(0, 3), "ts": None})
        keys.append(uplink.event("checkpoint_saved", rank=0, step=3, details={"step": 3, "blocking_s": 0.1}))
        assert await uplink.flush(10.0)
        uplink.forward_event({"key": keys[0], "type": "checkpoint_saved", "rank": 0, "step": 3, "details": {}})
        assert await uplink.close(10.0)

    run(main)
    stored = events(admin, job["id"], "checkpoint_saved")
    assert [e["key"] for e in stored] == keys
    (rank,) = admin.get(f"/v1/jobs/{job['id']}/ranks").json()
    assert rank["rank"] == 0 and rank["step"] == 3
    (node,) = admin.get(f"/v1/jobs/{job['id']}/nodes").json()
    assert node["node"] == "node-a" and node["progress"] == "sdk"
