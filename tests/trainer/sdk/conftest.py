"""A fake node agent for the SDK: a real Unix datagram socket bound by the test.

It reads what the SDK sends, checks every message with the agent's own protocol
(trainer/agent/protocol.py), and can answer a rank on its reply socket, go away (its socket
removed), come back at the same path, or stop reading while its socket buffer fills.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ftplane.trainer.agent import protocol
from ftplane.trainer.sdk.environment import Environment
from ftplane.trainer.sdk.run import Run
from tests.support.waiting import wait_for


@dataclass
class FakeAgent:
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ftplane-sdk-")))
    receive_buffer: int | None = None  # SO_RCVBUF, to fill the socket quickly
    messages: list[protocol.Message] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    reading: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _sock: socket.socket | None = None
    _thread: threading.Thread | None = None

    @property
    def path(self) -> str:
        return str(self.directory / "agent.sock")

    def start(self, *, reading: bool = True) -> FakeAgent:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if self.receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer)
        sock.bind(self.path)
        sock.settimeout(0.05)
        self._sock = sock
        if reading:
            self.reading.set()
        self._thread = threading.Thread(target=self._run, args=(sock,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """The agent goes away: its socket file is gone until `start()`."""
        sock, self._sock = self._sock, None
        self.reading.set()  # let the thread see it is done
        if self._thread is not None:
            self._thread.join(timeout=5)
        if sock is not None:
            sock.close()
        with contextlib.suppress(FileNotFoundError):
            Path(self.path).unlink()
        self.reading.clear()

    def _run(self, sock: socket.socket) -> None:
        while self._sock is sock:
            if not self.reading.wait(0.05):
                continue
            try:
                data = sock.recv(protocol.MAX_MESSAGE_BYTES + 1)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                message = protocol.parse(data)
            except protocol.BadMessage as exc:
                with self.lock:
                    self.refused.append(str(exc))
                continue
            with self.lock:
                self.messages.append(message)

    # --- what arrived ---

    def heartbeats(self, rank: int | None = None) -> list[protocol.Heartbeat]:
        with self.lock:
            return [m for m in self.messages if isinstance(m, protocol.Heartbeat) and rank in (None, m.rank)]

    def events(self, type_: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            found = [m.event for m in self.messages if isinstance(m, protocol.RankEvent)]
        return [e for e in found if type_ in (None, e["type"])]

    def exclusions(self) -> list[protocol.ExcludeNode]:
        with self.lock:
            return [m for m in self.messages if isinstance(m, protocol.ExcludeNode)]

    def wait_events(self, n: int, type_: str | None = None, timeout: float = 10) -> list[dict[str, Any]]:
        """The events (of `type_`) once there are at least `n` of them."""

        def ready() -> list[dict[str, Any]] | None:
            found = self.events(type_)
            return found if len(found) >= n else None

        return wait_for(f"{n} {type_ or ''} event(s)", ready, timeout, 0.01)

    # --- answering ---

    def send_faults(self, reply_to: str, faults: list[dict[str, Any]]) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
            out.sendto(json.dumps({"type": "faults", "faults": faults}).encode(), reply_to)


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    fake = FakeAgent().start()
    yield fake
    fake.stop()
    shutil.rmtree(fake.directory, ignore_errors=True)


def sdk_env(agent: FakeAgent | None, tmp_path: Path, **extra: str) -> dict[str, str]:
    """What a rank under a node agent sees (no agent: reporting off)."""
    env = {"FTPLANE_JOB_ID": "job-1", "FTPLANE_ATTEMPT": "2", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}
    env["FTPLANE_CHECKPOINT_DIR"] = str(tmp_path / "ckpt")
    if agent is not None:
        env.update({"FTPLANE_AGENT_SOCKET": agent.path, "FTPLANE_URL": "http://control-plane:8000"})
    env.update(extra)
    return env


@pytest.fixture
def make_run(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    """A Run from an explicit environment (not the process's `init()` one); finished at teardown."""
    runs: list[Run] = []

    def make(agent: FakeAgent | None, *, interval_s: float = 0.05, env: dict[str, str] | None = None, **kw: Any) -> Run:
        run = Run(Environment.read({**sdk_env(agent, tmp_path), **(env or {})}), interval_s=interval_s, **kw)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.finish(timeout=1)


class DictStore:
    """The part of a torch.distributed Store that failures are shared through."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        if key not in self.data and expected == "":
            self.data[key] = desired.encode()
        return self.data.get(key, expected.encode())

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key]


SOCKET_CALLS = ("sendto", "send", "sendall", "recv", "recvfrom", "connect")


@contextlib.contextmanager
def socket_calls_on_this_thread() -> Iterator[list[str]]:
    """The socket calls (any socket's) made by the calling thread inside the block: what "never waits on the
    agent" means for a training thread, whatever the machine's load."""
    caller = threading.get_ident()
    seen: list[str] = []
    originals = {name: getattr(socket.socket, name) for name in SOCKET_CALLS}

    def watched(name: str) -> Callable[..., Any]:
        original = originals[name]

        def call(self: socket.socket, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == caller:
                seen.append(name)
            return original(self, *args, **kwargs)

        return call

    for name in SOCKET_CALLS:
        setattr(socket.socket, name, watched(name))
    try:
        yield seen
    finally:
        for name, original in originals.items():
            setattr(socket.socket, name, original)
