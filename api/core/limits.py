"""Bounds on requests, enforced before the app reads them: body size, and text no store can hold."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from starlette.routing import Match, Mount

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
            message: dict[str, Any] = await receive()
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


# What a JSON body may spell that no database column or JSON reader downstream takes:
# NUL (PostgreSQL text cannot hold it), a lone UTF-16 surrogate (not encodable as UTF-8: it could
# be stored but never served back) and NaN/Infinity (not JSON; Python's reader accepts them).
_SUSPECT = re.compile(rb"\\u0000|\\u[dD][89a-fA-F][0-9a-fA-F]{2}|NaN|Infinity")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class TextGuard:
    """Pure ASGI middleware: 422 naming the field for NUL, lone surrogates or NaN/Infinity in a JSON
    body, and 404 for a path with a NUL in it (no resource can have such an id).

    Each body is scanned once with a regular expression; only a body that matches it is parsed here,
    to find the field (a match inside a valid string, such as an emoji's surrogate pair, passes).
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if "\x00" in scope.get("path", ""):
            await _send_error(send, 404, "no such resource: the path contains a NUL character")
            return
        if scope.get("method") not in _BODY_METHODS or not _is_json(scope):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message: dict[str, Any] = await receive()
            if message["type"] != "http.request":
                return  # the client went away before sending its body
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        problem = _unstorable_value(body) if _SUSPECT.search(body) else None
        if problem is not None and _served(scope):
            field, why = problem
            await _send_error(send, 422, f"invalid request: {field}: {why}", [{"field": field, "message": why}])
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return dict(await receive())
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _served(scope: Scope) -> bool:
    """Whether a route serves this method at this path: a request no route takes gets the router's 404
    or 405, whatever its body holds."""
    app = scope.get("app")
    routes = getattr(getattr(app, "router", None), "routes", None)
    if routes is None:
        return True
    return any(route.matches(scope)[0] == Match.FULL for route in routes if not isinstance(route, Mount))


def _is_json(scope: Scope) -> bool:
    for name, value in scope.get("headers", []):
        if name == b"content-type":
            media: bytes = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or media.endswith(b"+json")
    return True  # FastAPI reads a body without a content type as JSON


def _unstorable_value(body: bytes) -> tuple[str, str] | None:
    """(field, why) for the first value that cannot be stored, in document order; None if all can."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None  # not JSON this guard can read: FastAPI answers that itself
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            why = _bad_text(value)
            if why:
                return path or "body", why
        elif isinstance(value, float) and not math.isfinite(value):
            return path or "body", "NaN and Infinity are not JSON numbers: send a finite number or null"
        elif isinstance(value, dict):
            for key in value:
                why = _bad_text(key)
                if why:
                    return _join(path, key), f"in a key: {why}"
            stack.extend((_join(path, k), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _bad_text(text: str) -> str | None:
    if "\x00" in text:
        return "NUL characters are not allowed in text: remove them"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "a lone UTF-16 surrogate is not a character: send valid Unicode (pair surrogates)"
    return None


async def _send_error(send: Any, status: int, message: str, fields: list[dict[str, str]] | None = None) -> None:
    error: dict[str, Any] = {"status": status, "message": message}
    if fields is not None:
        error["fields"] = fields
    body = json.dumps({"error": error}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
