"""The agent's end of the node-local channel: receives the ranks' datagrams, answers with fault directives.

A malformed, oversized or unknown message is dropped with a warning (at most one a second per
kind of problem) and never stops the channel or holds up the other ranks. See protocol.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftplane.trainer.agent import protocol

log = logging.getLogger(__name__)


class RankChannel:
    def __init__(self, path: Path, on_message: Callable[[protocol.Message], None]) -> None:
        self.path = path
        self.on_message = on_message
        self.reply_to: dict[int, str] = {}  # rank -> its socket
        self.dropped = 0
        self._warned_at: dict[str, float] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        os.chmod(path, 0o600)
        # room for bursts: every rank of a node flushing its events at once
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        self._sock.settimeout(0.5)  # so close() is seen within half a second
        self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._out.setblocking(False)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="ftplane-rank-channel", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping:
            try:
                data = self._sock.recv(protocol.MAX_MESSAGE_BYTES + 1)
            except OSError:
                if self._stopping:
                    return
                continue
            try:
                message = protocol.parse(data)
            except protocol.BadMessage as exc:
                self._drop(str(exc))
                continue
            if isinstance(message, protocol.Heartbeat | protocol.Hello) and message.reply_to:
                self.reply_to[message.rank] = message.reply_to
            try:
                self.on_message(message)
            except Exception:
                log.exception("handling a message from a rank failed")

    def _drop(self, why: str) -> None:
        self.dropped += 1
        kind = why.split(":")[0][:60]
        now = time.monotonic()
        if now - self._warned_at.get(kind, -10.0) >= 1.0:
            self._warned_at[kind] = now
            log.warning("dropped a message from a rank: %s (%d dropped so far)", why, self.dropped)

    def send_faults(self, rank: int, faults: list[dict[str, Any]]) -> bool:
        """Hand fault directives to a rank; False when the rank has not said where it listens."""
        target = self.reply_to.get(rank)
        if target is None:
            return False
        try:
            self._out.sendto(protocol.encode({"type": "faults", "faults": faults}), target)
            return True
        except OSError as exc:
            log.warning("could not hand faults to rank %d: %s", rank, exc)
            return False

    def close(self) -> None:
        self._stopping = True
        self._thread.join(timeout=2.0)
        self._sock.close()
        self._out.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
