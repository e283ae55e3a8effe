"""A fake HTTP receiver on the loopback interface: what a webhook subscription points at."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

T = TypeVar("T")

HOLD_LIMIT_S = 20.0  # a held request is answered after this long even if never released


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]  # names lower-cased; repeated headers joined with ", "
    body: bytes
    at: float  # time.monotonic() on arrival
    wall: float  # time.time() on arrival

    def json(self) -> Any:
        return json.loads(self.body)

    def raw(self) -> bytes:
        """Headers and body, as sent."""
        head = "".join(f"{name}: {value}\r\n" for name, value in self.headers.items())
        return head.encode() + b"\r\n" + self.body

    @property
    def webhook_id(self) -> str:
        return self.headers.get("webhook-id", "")


class Receiver:
    """Records every POST and answers each path with its next scripted status (then 200), after the
    path's delay. With `hold_first`, the first request is held until `release` is set (a receiver
    that is slow exactly while something else happens). Start it with `with Receiver() as r:`."""

    def __init__(self, *, hold_first: bool = False) -> None:
        self.requests: list[Received] = []
        self.script: dict[str, list[int]] = {}  # path -> statuses to answer, in order
        self.delay_s: dict[str, float] = {}  # path -> seconds to wait before answering
        self.hold_first = hold_first
        self.first_arrived = threading.Event()
        self.release = threading.Event()
        self.cond = threading.Condition()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def at(self, path: str) -> list[Received]:
        with self.cond:
            return [r for r in self.requests if r.path == path]

    def wait_for(self, path: str, count: int, timeout: float) -> list[Received]:
        """The first `count` (or more) requests to `path`; fails after `timeout` seconds."""
        got = self._wait(lambda: found if len(found := self.at(path)) >= count else None, timeout)
        if got is None:
            raise AssertionError(f"{path} got {len(self.at(path))} requests in {timeout} s, wanted {count}")
        return got

    def first(self, predicate: Callable[[Received], bool], timeout: float) -> Received | None:
        """The first request `predicate` holds for, or None after `timeout` seconds."""
        return self._wait(lambda: next((r for r in self.requests if predicate(r)), None), timeout)

    def _wait(self, find: Callable[[], T | None], timeout: float) -> T | None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while (found := find()) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)
            return found

    def _record(self, path: str, headers: dict[str, str], body: bytes, at: float, wall: float) -> tuple[int, bool]:
        """Store the request; returns the status to answer and whether to hold the answer."""
        with self.cond:
            self.requests.append(Received(path, headers, body, at, wall))
            self.cond.notify_all()
            script = self.script.get(path, [])
            status = script.pop(0) if script else 200
            hold = self.hold_first and not self.first_arrived.is_set()
            self.first_arrived.set()
        return status, hold

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the http.server API)
                at, wall = time.monotonic(), time.time()
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers: dict[str, str] = {}
                for name, value in self.headers.items():
                    name = name.lower()
                    headers[name] = f"{headers[name]}, {value}" if name in headers else value
                status, hold = receiver._record(self.path, headers, body, at, wall)
                if hold:
                    receiver.release.wait(HOLD_LIMIT_S)
                time.sleep(receiver.delay_s.get(self.path, 0))
                payload = b"receiver says no" if status >= 400 else b"ok"
                try:
                    self.send_response(status)
                    if 300 <= status < 400:
                        self.send_header("Location", receiver.url + "/elsewhere")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the sender is gone (timed out, or killed)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
