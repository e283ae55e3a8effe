"""Each simulated node's connection to the control plane: the transport under its `AsyncUplink`'s httpx client.

`Network` is one node's own connection, with a switch that makes every request fail to connect (a partition). Under
it runs either httpx's own transport (`--transport httpx`) or `Http11` (the default): HTTP/1.1 over one asyncio
stream, kept alive until the server closes it, as a real node's client would keep it. Both send the bytes httpx
built (method, path, headers, body) and hand httpx back the status, headers and body; what the uplink decides
from them is the product's code either way.

Why a second transport: every node runs in this one process, and httpx's own costs about 1 ms more CPU per POST
(measured against an idle server: 2.3-2.5 ms with httpx's transport, 1.1-1.7 ms with this one, per report). On two
shared cores that is the difference between a simulator that keeps its own timers and one whose event loop falls
seconds behind, so that the agents' 2 s connect and 5 s read timeouts expire on the simulator's side and the
retries it then sends are its own making.
"""

from __future__ import annotations

import asyncio
import ssl
import sys

import httpx

# One TLS context for every node's httpx transport: httpx builds one per client otherwise (~35 ms of CPU each).
TLS = ssl.create_default_context()
# httpcore asks `import sniffio` which async library runs, at every lock it sets up (several per request). Where
# sniffio is not installed each ask is a failed import that searches sys.path again (~0.25 ms): a third of the
# simulator's CPU with httpx's transport. A None entry makes the import fail at once, with the answer httpcore then
# takes ("asyncio").
sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]

TRANSPORTS = ("http11", "httpx")


class Http11(httpx.AsyncBaseTransport):
    """HTTP/1.1 on one asyncio stream (loopback, no TLS). A kept-alive connection the server closed meanwhile is
    opened again once, as httpcore does; the timeouts are httpx's (connect, then the whole response)."""

    def __init__(self) -> None:
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        for _ in range(2):
            reused = self.writer is not None
            if not reused:
                await self._connect(request, timeouts.get("connect"))
            try:
                return await self._exchange(request, timeouts.get("read"))
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                self._drop()
                if not reused:
                    raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request) from exc
            except TimeoutError as exc:
                self._drop()
                raise httpx.ReadTimeout("no whole response in time", request=request) from exc
        raise httpx.ReadError("the connection closed twice", request=request)

    async def _connect(self, request: httpx.Request, timeout: float | None) -> None:
        try:
            async with asyncio.timeout(timeout):
                self.reader, self.writer = await asyncio.open_connection(request.url.host, request.url.port)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout("connect timed out", request=request) from exc
        except OSError as exc:
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}", request=request) from exc

    async def _exchange(self, request: httpx.Request, timeout: float | None) -> httpx.Response:
        assert self.reader is not None and self.writer is not None
        head = [b"%s %s HTTP/1.1\r\n" % (request.method.encode(), request.url.raw_path)]
        head += [name + b": " + value + b"\r\n" for name, value in request.headers.raw]
        self.writer.write(b"".join(head) + b"\r\n" + request.content)
        async with asyncio.timeout(timeout):
            status = await self.reader.readline()
            if not status:
                raise ConnectionResetError("closed by the server")
            headers: list[tuple[bytes, bytes]] = []
            while (line := await self.reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                headers.append((name.strip().lower(), value.strip()))
            fields = dict(headers)
            if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
                body = await self._chunks()
            else:
                body = await self.reader.readexactly(int(fields.get(b"content-length", b"0")))
        if fields.get(b"connection", b"").lower() == b"close":
            self._drop()
        return httpx.Response(int(status.split()[1]), headers=headers, content=body)

    async def _chunks(self) -> bytes:
        assert self.reader is not None
        parts = []
        while size := int((await self.reader.readline()).split(b";")[0], 16):
            parts.append(await self.reader.readexactly(size))
            await self.reader.readline()
        await self.reader.readline()
        return b"".join(parts)

    def _drop(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def aclose(self) -> None:
        self._drop()


class Network(httpx.AsyncBaseTransport):
    """A node's own connection to the control plane; `cut` makes every request fail to connect."""

    def __init__(self, transport: str = "http11") -> None:
        self.inner: httpx.AsyncBaseTransport = (
            Http11() if transport == "http11" else httpx.AsyncHTTPTransport(verify=TLS)
        )
        self.cut = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.cut:
            raise httpx.ConnectError("network partitioned by the simulator", request=request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()
