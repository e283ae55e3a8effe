"""The scale benchmark's node client (bench/scale/wire.py) against a scripted HTTP/1.1 server on loopback: it sends the
bytes the uplink's httpx client sends, reads what the uplink reads of a reply, keeps its connection, opens it again
once when the server closed it, and fails as httpx fails (so the product's uplink classifies it the same)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import httpx
import pytest

from bench.scale.loop import run_loop
from bench.scale.wire import Network, NodeClient
from ftplane.trainer.agent.report_buffer import outcome_of
from ftplane.trainer.agent.uplink import client_options

PATH = "/v1/jobs/job-1/reports"
BODY = {"attempt": 0, "node": "node-é", "agent": {"ranks": [1, 2]}, "heartbeats": [], "events": []}
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 13\r\n\r\n" + b'{"faults":[]}'


class Scripted:
    """A server whose every request is answered by `answer(request bytes) -> response bytes | None` (None: keep
    silent); `close_after` closes each connection after that many answers."""

    def __init__(self, answer: Callable[[bytes], bytes | None], close_after: int = 0) -> None:
        self.answer = answer
        self.close_after = close_after
        self.requests: list[bytes] = []
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered = 0
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):  # the client closed it
                return
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
            )
            request = head + await reader.readexactly(length)
            self.requests.append(request)
            response = self.answer(request)
            if response is None:
                await asyncio.sleep(60)
            writer.write(response or b"")
            answered += 1
            if answered == self.close_after:
                writer.close()
                return


def with_server(server: Scripted, test: Callable[[str], Awaitable[None]]) -> None:
    async def main() -> None:
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = listening.sockets[0].getsockname()[1]
        async with listening:
            await test(f"http://127.0.0.1:{port}")

    run_loop(main())


def node_client(url: str, network: Network | None = None, timeout_s: float = 5.0) -> NodeClient:
    return NodeClient(network or Network(), client_options(url, "secret", timeout_s))


def test_it_sends_what_the_uplinks_httpx_client_sends() -> None:
    sent_by_httpx: list[httpx.Request] = []

    def capture(request: httpx.Request) -> httpx.Response:
        sent_by_httpx.append(request)
        return httpx.Response(200, json={})

    async def test(url: str) -> None:
        options = client_options(url, "secret", 5.0)
        async with httpx.AsyncClient(**options, transport=httpx.MockTransport(capture)) as client:
            await client.post(PATH, json=BODY)
        await node_client(url).post(PATH, json=BODY)

    server = Scripted(lambda request: OK)
    with_server(server, test)
    (theirs,), (ours,) = sent_by_httpx, server.requests
    head, _, body = ours.partition(b"\r\n\r\n")
    request_line, *header_lines = head.split(b"\r\n")
    assert request_line == b"POST " + PATH.encode() + b" HTTP/1.1"
    assert body == theirs.content and json.loads(body) == BODY  # httpx's JSON encoding, byte for byte
    headers = [tuple(line.split(b": ", 1)) for line in header_lines]
    expected = [(name, value) for name, value in theirs.headers.raw if name.lower() != b"accept-encoding"]
    assert sorted(headers) == sorted(expected)  # the same headers and values, the token among them


def test_a_reply_is_read_as_the_uplink_reads_an_httpx_response() -> None:
    shed = json.dumps({"error": {"code": "busy", "liveness_taken": True}}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (shed[:10], shed[10:])) + b"0\r\n\r\n"
    replies = iter(
        [
            OK,
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\ntransfer-encoding: chunked\r\n\r\n" + chunked,
            b"HTTP/1.1 422 Unprocessable\r\ncontent-length: 9\r\n\r\n" + b'{"bad":1}',
        ]
    )
    outcomes = []

    async def test(url: str) -> None:
        client = node_client(url)
        for _ in range(3):
            outcomes.append(outcome_of(await client.post(PATH, json=BODY), PATH))

    server = Scripted(lambda request: next(replies))
    with_server(server, test)
    accepted, busy, refused = outcomes
    assert accepted.ok and accepted.reply == {"faults": []}
    assert busy.retry and busy.retry_after == 7.0 and busy.liveness_taken
    assert not refused.ok and not refused.retry and "422" in refused.reason
    assert server.connections == 1  # kept alive between reports


def test_a_connection_the_server_closed_is_opened_again_once() -> None:
    async def test(url: str) -> None:
        client = node_client(url)
        for _ in range(3):
            assert (await client.post(PATH, json=BODY)).status_code == 200

    server = Scripted(lambda request: OK, close_after=1)
    with_server(server, test)
    assert len(server.requests) == 3 and server.connections == 3


def test_timeouts_refusals_and_partitions_fail_as_httpx_fails() -> None:
    async def test(url: str) -> None:
        network = Network()
        silent = node_client(url, network, timeout_s=0.3)
        with pytest.raises(httpx.ReadTimeout):
            await silent.post(PATH, json=BODY)
        assert silent.connection is None  # a timed-out connection is not reused
        network.cut = True
        with pytest.raises(httpx.ConnectError, match="partitioned"):
            await silent.post(PATH, json=BODY)
        free = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = free.sockets[0].getsockname()[1]
        free.close()
        await free.wait_closed()
        with pytest.raises(httpx.ConnectError):
            await node_client(f"http://127.0.0.1:{port}").post(PATH, json=BODY)

    server = Scripted(lambda request: None)
    with_server(server, test)
    assert server.connections == 1  # the partition sent nothing
