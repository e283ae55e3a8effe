"""The fake's answer to a pod exec: a WebSocket (v4.channel.k8s.io) with stdout on channel 1, the status on 3."""

from __future__ import annotations

import base64
import hashlib
import json
from http.server import BaseHTTPRequestHandler
from typing import Any

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def answer_exec(handler: BaseHTTPRequestHandler, output: str, code: int) -> None:
    """Upgrade the request to a WebSocket, send what the command printed and its exit status, and close."""
    key = handler.headers.get("Sec-WebSocket-Key", "")
    accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
    handler.send_response(101, "Switching Protocols")
    handler.send_header("Upgrade", "websocket")
    handler.send_header("Connection", "Upgrade")
    handler.send_header("Sec-WebSocket-Accept", accept)
    handler.send_header("Sec-WebSocket-Protocol", "v4.channel.k8s.io")
    handler.end_headers()
    if code == 0:
        status: dict[str, Any] = {"metadata": {}, "status": "Success"}
    else:
        status = {
            "metadata": {},
            "status": "Failure",
            "message": f"command terminated with non-zero exit code: {code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }
    for channel, payload in ((1, output.encode()), (3, json.dumps(status).encode())):
        if payload:
            handler.wfile.write(_ws_frame(0x2, bytes([channel]) + payload))
    handler.wfile.write(_ws_frame(0x8, (1000).to_bytes(2, "big")))
    handler.wfile.flush()
    handler.close_connection = True


def _ws_frame(opcode: int, payload: bytes) -> bytes:
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([n])
    elif n < 1 << 16:
        head += bytes([126]) + n.to_bytes(2, "big")
    else:
        head += bytes([127]) + n.to_bytes(8, "big")
    return head + payload
