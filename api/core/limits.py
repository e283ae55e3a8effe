"""A bound on request bodies, enforced before any of it is parsed."""

from __future__ import annotations

import json
from typing import Any

Scope = dict[str, Any]


class BodySizeLimit:
    """Pure ASGI middleware: 413 when Content-Length or the streamed body exceeds `max_bytes`."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max_bytes
                except ValueError:
                    too_big = False
                if too_big:
                    await self._reject(send)
                    return
        seen = 0
        rejected = False

        async def limited_receive() -> dict[str, Any]:
            nonlocal seen, rejected
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    rejected = True
                    raise _TooLarge()
            return message

        started = False

        async def guarded_send(message: dict[str, Any]) -> None:
            # Whatever the app answers to a body it could not read fully, the answer is 413.
            nonlocal started
            if rejected:
                if not started:
                    started = True
                    await self._reject(send)
                return
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            if not started:
                await self._reject(send)

    async def _reject(self, send: Any) -> None:
        body = json.dumps(
            {
                "error": {
                    "status": 413,
                    "message": f"request body over {self.max_bytes} bytes: send smaller batches",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass
