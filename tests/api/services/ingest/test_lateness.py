"""A node report that waited past the bound for the API's turn is refused unread, 503 with Retry-After: through a
real uvicorn server whose protocol stamps each request (api/core/arrival.py), with the report pipelined behind a
request that holds the event loop, and at the middleware's own boundary."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httptools
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from api.core.arrival import PROTOCOL, RECEIVED_AT
from api.services.ingest import caches, lateness
from api.services.ingest.lateness import Pace, RefuseLateReports
from ftplane import contract
from tests.support.waiting import wait_for

HOLD_S = 2.0  # what the first request holds the event loop for: past the 1 s bound


async def hold_the_loop(request: Request) -> JSONResponse:
    time.sleep(HOLD_S)  # blocking on purpose: every request behind it waits
    return JSONResponse({"held": HOLD_S})


async def report(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse({"read": len(body), "waited": time.monotonic() - request.scope[RECEIVED_AT]})


def served(max_wait_s: float) -> Iterator[int]:
    app = Starlette(
        routes=[
            Route("/hold", hold_the_loop, methods=["POST"]),
            Route("/v1/jobs/{job}/reports", report, methods=["POST"]),
        ]
    )
    config = uvicorn.Config(
        RefuseLateReports(app, max_wait_s=max_wait_s), http=PROTOCOL, lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for("the server up", lambda: server.started, 30, interval=0.02)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(30)


@pytest.fixture
def strict() -> Iterator[int]:
    yield from served(max_wait_s=1.0)


@pytest.fixture
def patient() -> Iterator[int]:
    yield from served(max_wait_s=60.0)


def pipelined(port: int, first: str) -> list[tuple[int, dict[str, str], bytes]]:
    """POST `first`, then a report, written together on one connection: uvicorn reads both at once and takes the
    report up when the first is answered. The two replies, as (status, headers, body)."""
    data = b""
    for target, body in ((first, b""), ("/v1/jobs/j1/reports", b'{"node": "node-a"}')):
        head = f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        data += f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
    replies: list[tuple[int, dict[str, str], bytes]] = []
    reply = Reply(replies)
    parser = reply.parser = httptools.HttpResponseParser(reply)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        while len(replies) < 2:
            received = sock.recv(65536)
            assert received, f"the server closed the connection after {len(replies)} replies"
            parser.feed_data(received)
    return replies


class Reply:
    """httptools' callbacks: each complete reply appended as (status, headers, body)."""

    def __init__(self, replies: list[tuple[int, dict[str, str], bytes]]) -> None:
        self.replies, self.headers, self.body = replies, dict[str, str](), b""
        self.parser: Any = None

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.replies.append((self.status, self.headers, self.body))
        self.headers, self.body = {}, b""


def test_a_report_that_waited_past_the_bound_is_refused_unread_with_retry_after(strict: int) -> None:
    held, late = pipelined(strict, "/hold")
    assert held[0] == 200
    status, headers, body = late
    assert status == 503, body
    assert b"waited 2." in body and b"send it again after Retry-After" in body
    assert 1 <= int(headers["retry-after"]) <= 2  # job j1's interval is not cached: 1 s, so at most 2


def test_a_report_within_the_bound_is_read_and_answered(patient: int) -> None:
    held, taken = pipelined(patient, "/hold")
    assert held[0] == 200
    status, _, body = taken
    assert status == 200 and b'"read":18' in body
    assert b'"waited":2.' in body or b'"waited":3.' in body  # it did wait behind the held loop: the stamp says so


class Inner:
    def __init__(self) -> None:
        self.called = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.called += 1


async def never_read() -> dict[str, Any]:
    raise AssertionError("a late report's body is not read")


@pytest.mark.parametrize(
    ("method", "path", "waited", "refused"),
    [
        ("POST", "/v1/jobs/j1/reports", 3.0, True),
        ("POST", "/v1/jobs/j1/reports", 0.1, False),
        ("GET", "/v1/jobs/j1/reports", 3.0, False),  # only node reports are refused
        ("POST", "/v1/jobs/j1/events", 3.0, False),
        ("POST", "/v1/jobs/j1/reports/x", 3.0, False),
        ("POST", "/v1/jobs/j1/reports", None, False),  # an in-process client: no stamp, nothing to judge by
    ],
)
def test_only_a_late_node_report_is_refused(method: str, path: str, waited: float | None, refused: bool) -> None:
    inner, sent = Inner(), []
    scope: dict[str, Any] = {"type": "http", "method": method, "path": path}
    if waited is not None:
        scope[RECEIVED_AT] = time.monotonic() - waited

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(RefuseLateReports(inner, max_wait_s=1.0)(scope, never_read, send))
    assert inner.called == (0 if refused else 1)
    assert [m.get("status") for m in sent[:1]] == ([503] if refused else [])


def test_retry_after_spreads_the_refused_over_the_time_to_take_them_up_within_two_intervals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lateness.random, "uniform", lambda low, high: high)  # the top of the range
    pace = Pace()
    for _ in range(100):
        pace.count(refused=False)
    for _ in range(1000):
        pace.count(refused=True)
    assert pace.retry_after(interval_s=30.0) == 11  # 1 + 1,000 refused / 100 taken up
    assert pace.retry_after(interval_s=3.0) == 6  # at most two intervals
    assert Pace().retry_after(interval_s=30.0) == 1  # nothing refused: the least wait


@pytest.mark.parametrize("interval_s", [1.0, 8.0, 30.0])
def test_an_agents_last_report_outlasts_the_longest_retry_after(
    monkeypatch: pytest.MonkeyPatch, interval_s: float
) -> None:
    """A refused report is sent again after Retry-After; an agent at its exit keeps trying long enough for that
    and its answer (the agents' 5 s read timeout), so a busy server loses it no event."""
    monkeypatch.setattr(lateness.random, "uniform", lambda low, high: high)
    pace = Pace()
    for _ in range(100_000):
        pace.count(refused=True)
    assert pace.retry_after(interval_s) + 5 <= contract.exit_flush_s(interval_s)


def test_a_cached_jobs_interval_bounds_the_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        caches, "cached_job", lambda job_id: (True, caches.JobState("RUNNING", 0, None, frozenset(), "default", 30.0))
    )
    assert lateness._interval_of("j1") == 30.0
    monkeypatch.setattr(caches, "cached_job", lambda job_id: (False, None))
    assert lateness._interval_of("j1") == 1.0
