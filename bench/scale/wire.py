"""Each simulated node's connection to the control plane: what its `AsyncUplink` sends its reports with.

`Network` is one node's link, with a switch that makes every request fail to connect (a partition). Over it runs
either `NodeClient` (`--transport http11`, the default) or the uplink's own httpx client with httpx's transport
(`--transport httpx`). `NodeClient` sends the bytes the uplink's httpx client would send (its request line and
headers are built once by httpx from the uplink's own `client_options`; the body is httpx's JSON encoding of the
product's `Report.body`) over one kept-alive HTTP/1.1 connection, parses the response with httptools, and honours
the same connect and read timeouts. What the uplink decides from a reply is the product's code either way.

Why a client of its own: every node runs in one of two processes on the machine under test, and httpx's client
costs most of a simulated node's CPU: against a canned server, 567-582 µs of CPU per POST with httpx's client over
a minimal transport, most of it in building requests and responses (bench/RESULTS.md, scale, 2026-12-07 morning).
A simulator that spends the machine's CPU on its own clients delays its own timers until the agents' 2 s connect
and 5 s read timeouts expire on its side, and the retries it then sends are its own making.
"""

from __future__ import annotations

import asyncio
import functools
import json as jsonlib
import ssl
import sys
from typing import Any, cast

import httptools
import httpx

from ftplane.trainer.agent.uplink import ReportClient

# One TLS context for every node's httpx transport: httpx builds one per client otherwise (~35 ms of CPU each).
TLS = ssl.create_default_context()
# httpcore asks `import sniffio` which async library runs, at every lock it sets up (several per request). Where
# sniffio is not installed each ask is a failed import that searches sys.path again (~0.25 ms): a third of the
# simulator's CPU with httpx's transport. A None entry makes the import fail at once, with the answer httpcore then
# takes ("asyncio").
sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]

TRANSPORTS = ("http11", "httpx")


class Network:
    """A node's link to the control plane: `cut` makes every request fail to connect (a partition)."""

    def __init__(self, transport: str = "http11") -> None:
        self.transport = transport
        self.cut = False

    def client(self, options: dict[str, Any]) -> ReportClient:
        """What the node's uplink sends with, given the uplink's `client_options`."""
        if self.transport == "httpx":
            return httpx.AsyncClient(**options, transport=Partitioned(self, httpx.AsyncHTTPTransport(verify=TLS)))
        return NodeClient(self, options)

    def check(self) -> None:
        if self.cut:
            raise httpx.ConnectError("network partitioned by the simulator")


class Partitioned(httpx.AsyncBaseTransport):
    """httpx's transport behind a node's `Network` switch."""

    def __init__(self, network: Network, inner: httpx.AsyncBaseTransport) -> None:
        self.network = network
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.network.check()
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


OWN_HEADERS = (b"content-length", b"accept-encoding")


@functools.lru_cache(maxsize=64)
def request_head(base_url: str, headers: tuple[tuple[str, str], ...], path: str, method: str = "POST") -> bytes:
    """The request line and headers httpx's client sends for a JSON POST to `path` (or a GET), less the body's length
    and Accept-Encoding (this client decodes no compression)."""
    with httpx.Client(base_url=base_url, headers=dict(headers)) as client:
        request = client.build_request(method, path, json={} if method == "POST" else None)
    lines = [b"%s %s HTTP/1.1\r\n" % (method.encode(), request.url.raw_path)]
    lines += [name + b": " + value + b"\r\n" for name, value in request.headers.raw if name.lower() not in OWN_HEADERS]
    return b"".join(lines)


def json_body(value: Any) -> bytes:
    """The body httpx makes of `json=value`."""
    return jsonlib.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class Reply:
    """A response as the uplink reads it (`report_buffer.Reply`)."""

    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers  # by lowercase name
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return jsonlib.loads(self.content)


class NodeClient:
    """One node's HTTP/1.1 client (loopback, no TLS): one request at a time on one connection, kept alive until the
    server closes it. A kept-alive connection the server closed meanwhile is opened again once, as httpx does; the
    timeouts are the uplink's own (connect, then the whole response)."""

    def __init__(self, network: Network, options: dict[str, Any]) -> None:
        self.network = network
        url = httpx.URL(options["base_url"])
        self.host, self.port = url.host, url.port or 80
        self.base_url, self.headers = str(url), tuple(options["headers"].items())
        timeout: httpx.Timeout = options["timeout"]
        self.connect_timeout, self.read_timeout = timeout.connect, timeout.read
        self.connection: Connection | None = None

    async def post(self, url: str, *, json: Any) -> Reply:
        self.network.check()
        body = json_body(json)
        request = request_head(self.base_url, self.headers, url) + b"Content-Length: %d\r\n\r\n" % len(body) + body
        for _ in range(2):
            reused = self.connection is not None and self.connection.open
            if not reused:
                self.connection = await self._connect()
            assert self.connection is not None
            try:
                return await self.connection.exchange(request, self.read_timeout)
            except ConnectionError as exc:
                await self.aclose()
                if not reused:
                    raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from exc
            except TimeoutError as exc:
                await self.aclose()
                raise httpx.ReadTimeout("no whole response in time") from exc
        raise httpx.ReadError("the connection closed twice")

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(Connection, self.host, self.port)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout("connect timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        return connection

    async def aclose(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: a request written whole, its response parsed by httptools as it arrives."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.open = True
        self.reply: asyncio.Future[Reply] | None = None
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []

    async def exchange(self, request: bytes, timeout: float | None) -> Reply:
        assert self.transport is not None
        self.reply = asyncio.get_running_loop().create_future()
        self.headers, self.body = {}, []
        self.transport.write(request)
        async with asyncio.timeout(timeout):
            return await self.reply

    def close(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: Exception) -> None:
        if self.reply is not None and not self.reply.done():
            self.reply.set_exception(exc)

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one, though not by class

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.close()
            self._fail(ConnectionResetError(f"bad response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self._fail(ConnectionResetError("closed by the server"))

    # ---- httptools' callbacks ----

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if not self.parser.should_keep_alive():
            self.close()
        if self.reply is not None and not self.reply.done():
            self.reply.set_result(Reply(self.parser.get_status_code(), self.headers, b"".join(self.body)))
