"""When a request reached the API process: uvicorn's httptools protocol, stamping each request's scope with the
monotonic time its first bytes were parsed (`ftplane serve` runs it). A route can then tell how long the request
waited for its turn on the event loop (api/services/ingest/lateness.py). Time spent in the kernel before the loop
read the bytes is not in it: at most the loop's previous round, which refusing late requests keeps short."""

from __future__ import annotations

import time
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

RECEIVED_AT = "ftplane.received_at"  # scope key: time.monotonic() when the request's first bytes were parsed
PROTOCOL = f"{__name__}:StampedHttpToolsProtocol"  # uvicorn's `http` setting


class StampedHttpToolsProtocol(HttpToolsProtocol):
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[RECEIVED_AT] = time.monotonic()  # type: ignore[literal-required]


def waited_s(scope: dict[str, Any]) -> float | None:
    """Seconds since the request's first bytes were parsed; None when the server does not stamp them (tests'
    in-process clients)."""
    received = scope.get(RECEIVED_AT)
    return time.monotonic() - received if isinstance(received, float) else None
