"""An httpx transport to the app in this process, for code under test that brings its own httpx client (the node
agent's uplink). Starlette's TestClient speaks httpx2 where it is installed (the Hugging Face hub client brings it),
so its own transport cannot serve an httpx client: requests and replies are copied across here."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi.testclient import TestClient

HOP_BY_HOP = {"host", "content-length", "transfer-encoding", "connection"}


class InProcessTransport(httpx.BaseTransport):
    def __init__(self, app: Any, **client_options: Any) -> None:
        self.client = TestClient(app, **client_options)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in HOP_BY_HOP]
        reply = self.client.request(request.method, str(request.url), headers=headers, content=request.read())
        kept = [(k, v) for k, v in reply.headers.multi_items() if k.lower() not in HOP_BY_HOP]
        return httpx.Response(reply.status_code, headers=kept, content=reply.content, request=request)
