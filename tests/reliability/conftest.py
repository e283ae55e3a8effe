"""Helpers for the reliability tests: the API and a worker as real processes to kill, a TCP proxy to cut.

Fixtures (`admin`, `make_job`, `database_url`, `postgres_url`, ...) come from tests/conftest.py.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest

from ftplane.devserver import ROOT
from tests.support.ports import free_port
from tests.support.processes import CeleryWorker, kill_group
from tests.support.waiting import wait_for


def bare_app() -> Any:
    """The app, for its routes and OpenAPI only: no database, and the logging set-up undone."""
    import logging

    from api.core.config import Settings
    from api.main import create_app

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return create_app(Settings(database_url="sqlite://"), migrate=False)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def child_env(**extra: str) -> dict[str, str]:
    """This environment without FTPLANE_* settings, the repository importable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTPLANE_")}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class ApiProcess:
    """`ftplane serve --only api` (uvicorn) as a child process, on a port that survives restarts."""

    def __init__(self, workdir: Path, env: dict[str, str], port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.env = child_env(FTPLANE_PORT=str(self.port), **env)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "api.log"
        self.process: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    def start(self, timeout: float = 60) -> ApiProcess:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ftplane.cli", "serve", "--only", "api"],
                env=self.env,
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(f"the API on {self.url}", self._healthy, timeout, interval=0.2)
        return self

    def _healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the API exited:\n{self.log.read_text()[-3000:]}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            kill_group(self.process, sig)
        self.process = None


def worker_process(env: dict[str, str], log: Path, loglevel: str = "INFO") -> CeleryWorker:
    """A Celery worker with embedded beat on `env`'s settings (see `child_env`); `.start()` it."""
    return CeleryWorker(child_env(**env), log, loglevel=loglevel, extra_args=["--without-heartbeat"])


class TcpProxy:
    """A TCP proxy in a thread, between the app and a server, to cut and restore the network.

    `cut()` resets every proxied connection and refuses new ones (the port is closed), as when the
    database restarts or its host goes away; `stall()` accepts new connections but forwards nothing
    (a server that takes connections and never answers); `restore()` forwards again, on the same port.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.mode = "forward"
        self.stalled = 0  # connections accepted while stalled: each one a client waiting out its connect timeout
        self._selector = selectors.DefaultSelector()
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._stop = False
        self._listen()
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ)

    def _close_all(self) -> None:
        for sock in list(self._pairs):
            self._drop(sock, reset=True)

    def _drop(self, sock: socket.socket, *, reset: bool = False) -> None:
        if sock not in self._pairs:
            return  # closed already, with its other end
        other = self._pairs.pop(sock)
        for s in (sock, other):
            self._pairs.pop(s, None)
            with suppress(KeyError, ValueError):
                self._selector.unregister(s)
            if reset:  # RST, as a dead peer's kernel or a middlebox would answer
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()

    def cut(self) -> None:
        with self._lock:
            self.mode = "cut"
            if self._listener is not None:
                self._selector.unregister(self._listener)
                self._listener.close()
                self._listener = None
            self._close_all()

    def stall(self) -> None:
        with self._lock:
            self.mode = "stall"
            self._close_all()
            if self._listener is None:
                self._listen()

    def restore(self) -> None:
        with self._lock:
            self._close_all()
            self.mode = "forward"
            if self._listener is None:
                self._listen()

    def close(self) -> None:
        self._stop = True
        self.cut()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        held: list[socket.socket] = []  # stalled connections: accepted, never answered
        while not self._stop:
            with self._lock:
                events = self._selector.select(timeout=0.05)
                for key, _ in events:
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._listener:
                        self._accept(sock, held)
                    elif sock in self._pairs:
                        self._pump(sock)
                if self.mode != "stall" and held:
                    for sock in held:
                        sock.close()
                    held.clear()

    def _accept(self, listener: socket.socket, held: list[socket.socket]) -> None:
        try:
            client, _ = listener.accept()
        except BlockingIOError:
            return
        if self.mode == "stall":
            held.append(client)
            self.stalled += 1
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        for s in (client, upstream):
            s.setblocking(False)
            self._selector.register(s, selectors.EVENT_READ)
        self._pairs[client] = upstream
        self._pairs[upstream] = client

    def _pump(self, sock: socket.socket) -> None:
        other = self._pairs[sock]
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock)
            return
        try:
            other.setblocking(True)
            other.sendall(data)
            other.setblocking(False)
        except OSError:
            self._drop(sock)


@contextmanager
def tcp_proxy(host: str, port: int) -> Iterator[TcpProxy]:
    proxy = TcpProxy(host, port)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def proxy_factory() -> Iterator[Callable[[str, int], TcpProxy]]:
    made: list[TcpProxy] = []

    def make(host: str, port: int) -> TcpProxy:
        proxy = TcpProxy(host, port)
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.close()
