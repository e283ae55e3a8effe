"""The rank's end of the node-local channel: JSON datagrams to the node agent over a Unix socket.

The training thread only ever stores (O(1), no I/O): `heartbeat()` replaces the one newest
heartbeat, `send()` appends a message to a bounded queue. A daemon thread sends them:

- queued messages (events, exclude_node) go at once and in order. One the agent cannot take now
  (not there yet, restarting, its socket buffer full) stays queued with the ones after it and is
  tried again after a capped backoff, so nothing is lost or reordered while the agent is away. At
  most `max_queued` are kept; beyond that new ones are dropped and counted, and the thread says
  how many in a warning;
- the newest heartbeat goes once per `interval_s`, and only when it is newer than the last one
  sent: a rank whose loop stopped goes silent, which is how the control plane sees a hang. While
  the agent is away only the newest is kept.

A second daemon thread listens on the rank's own socket, named in each heartbeat's `reply_to`, for
what the agent sends back: fault directives, handed to `on_faults`.

The wire format is trainer/agent/protocol.py's. Standard library only: this runs inside the
user's training processes.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import math
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ftplane.contract import MAX_STEP
from ftplane.trainer.agent import protocol

log = logging.getLogger(__name__)

MAX_SOCKET_PATH = 107  # sun_path is 108 bytes on Linux, NUL included
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 2.0
BUSY_RETRY_S = 0.002  # the agent took some of a pass and then its buffer was full: it is reading, go on soon
SEND_BATCH = 256  # messages sent per pass before the lock is taken again


def _finite(value: float | None, low: float, high: float) -> float | None:
    """A number the agent accepts in [low, high], or None (NaN, infinities, out of range)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) and low <= value <= high else None


def plain(value: Any, depth: int = 0) -> Any:
    """`value` as JSON can carry it: NaN and infinities become None, scalars of array libraries their
    Python value (`.item()`), mappings and sequences are walked, anything else becomes its text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth > 8:
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v, depth + 1) for v in value]
    item = getattr(value, "item", None)
    if callable(item):
        with contextlib.suppress(Exception):
            return plain(item(), depth + 1)
    return str(value)


class AgentChannel:
    """Sends one rank's heartbeats and messages to its node's agent; receives the agent's replies."""

    def __init__(
        self,
        agent_socket: str,
        *,
        rank: int,
        interval_s: float = 0.5,
        max_queued: int = 10_000,
        on_faults: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        self.agent_socket = agent_socket
        self.rank = rank
        self.interval_s = interval_s
        self.max_queued = max_queued
        self.on_faults = on_faults
        self.sent = 0  # messages the agent's socket took (heartbeats included)
        self.dropped = 0  # messages refused because the queue was full, or that could not be encoded
        self.failures = 0  # consecutive failed sends: drives the backoff

        self._cond = threading.Condition()
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._beat: dict[str, Any] | None = None  # the newest heartbeat, replaced whole by the training thread
        self._beat_seq = 0
        self._sent_seq = 0
        self._next_beat_at = 0.0
        self._retry_at = 0.0
        self._flushing = 0
        self._stopping = False
        self._reported_drops = 0

        self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._out.setblocking(False)  # a full agent buffer is an error at once, never a wait
        self._reply: socket.socket | None = None
        self.reply_to: str | None = None
        self._reply_dir: str | None = None  # a directory we made for the reply socket, removed at close
        self._bind_reply_socket()

        # First word to the agent: this rank reports through the SDK (and where it listens for faults).
        self._queue.append({"type": "hello", "rank": rank, "reply_to": self.reply_to})
        self._sender = threading.Thread(target=self._send_loop, name="ftplane-sdk-sender", daemon=True)
        self._sender.start()
        self._receiver: threading.Thread | None = None
        if self._reply is not None:
            self._receiver = threading.Thread(target=self._receive_loop, name="ftplane-sdk-receiver", daemon=True)
            self._receiver.start()

    # --- the training thread's side: O(1), no I/O ---------------------------------------------------

    def heartbeat(self, beat: dict[str, Any]) -> None:
        """Make `beat` the newest heartbeat (fields of protocol.py's heartbeat; `ts` a time.time())."""
        self._beat = beat
        self._beat_seq += 1

    def refresh(self) -> None:
        """Make the newest heartbeat new again, as of now: a rank busy with other work than steps is alive."""
        beat = self._beat
        if beat is not None:
            self.heartbeat({**beat, "ts": time.time()})

    def send(self, message: dict[str, Any]) -> bool:
        """Queue a message, to be sent in order; False (and counted) when the queue is full."""
        with self._cond:
            if len(self._queue) >= self.max_queued:
                self.dropped += 1
                return False
            self._queue.append(message)
            self._cond.notify()
        return True

    def pending(self) -> tuple[int, bool]:
        """(messages queued, whether a heartbeat newer than the last one sent waits)."""
        with self._cond:
            return len(self._queue), self._beat_seq != self._sent_seq

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` s until every queued message and the newest heartbeat are in the agent's
        socket (a datagram there survives this process); tries at once rather than after the current
        backoff. True if so."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._flushing += 1
            self._retry_at = 0.0  # try at once, then back off again from the shortest wait
            self.failures = 0
            self._cond.notify_all()
            try:
                while self._queue or self._beat_seq != self._sent_seq:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._sender.is_alive():
                        return False
                    self._cond.wait(min(remaining, 0.05))
                return True
            finally:
                self._flushing -= 1

    def close(self, timeout: float = 5.0) -> bool:
        """Flush (bounded), stop both threads, remove the reply socket. Returns whether all was sent."""
        delivered = self.flush(timeout)
        if not delivered:
            queued, beat = self.pending()
            log.warning(
                "the node agent at %s took not everything: %d message(s)%s left unsent",
                self.agent_socket,
                queued,
                " and a heartbeat" if beat else "",
            )
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._sender.join(timeout=1.0)
        if self._receiver is not None:
            self._receiver.join(timeout=1.0)
        self._out.close()
        if self._reply is not None:
            self._reply.close()
            if self.reply_to is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self.reply_to)
            if self._reply_dir is not None:
                with contextlib.suppress(OSError):
                    os.rmdir(self._reply_dir)
        return delivered

    # --- the sender thread -------------------------------------------------------------------------

    def _send_loop(self) -> None:
        while not self._stopping:
            try:
                self._send_pass()
            except Exception:  # a sender that dies would make this rank silent: log, pause, go on
                log.exception("sending to the node agent failed")
                time.sleep(BACKOFF_CAP_S)

    def _send_pass(self) -> None:
        """Wait until something is due, then send it: the queued messages in order, then the newest heartbeat."""
        with self._cond:
            while True:
                if self._stopping:
                    return
                now = time.monotonic()
                # heartbeats are stored without a wake-up (no lock on the training thread): look every interval
                wait = self.interval_s
                if self._queue:
                    if now >= self._retry_at:
                        break
                    wait = min(wait, self._retry_at - now)
                if self._beat_seq != self._sent_seq:
                    due = max(0.0 if self._flushing else self._next_beat_at, self._retry_at)
                    if now >= due:
                        break
                    wait = min(wait, due - now)
                self._cond.wait(wait)
            batch = [self._queue[i] for i in range(min(len(self._queue), SEND_BATCH))]
            beat, beat_seq = self._beat, self._beat_seq
            beat_due = beat_seq != self._sent_seq and (self._flushing > 0 or now >= self._next_beat_at)
            drops = self.dropped - self._reported_drops
            self._reported_drops = self.dropped
        if drops:
            log.warning("%d message(s) to the node agent dropped: %d were queued already", drops, self.max_queued)

        done, failure = self._send_messages(batch)
        if failure is None and beat_due and beat is not None:
            failure = self._send_heartbeat(beat)
        with self._cond:
            for _ in range(done):
                self._queue.popleft()  # only this thread removes, always from the left
            if failure is None:
                if beat_due:
                    self._sent_seq = beat_seq
                    self._next_beat_at = now + self.interval_s
                self.failures = 0
                self._retry_at = 0.0
            elif done and isinstance(failure, BlockingIOError):
                self.failures = 0
                self._retry_at = time.monotonic() + BUSY_RETRY_S
            else:  # absent, restarting, or not reading at all: back off
                self.failures += 1
                backoff = BACKOFF_BASE_S * 2 ** min(self.failures - 1, 10)
                self._retry_at = time.monotonic() + min(BACKOFF_CAP_S, backoff)
            failures = self.failures
            self._cond.notify_all()
        if failure is not None and (failures in (3, 30) or (failures and failures % 500 == 0)):
            log.warning(
                "the node agent at %s is not taking messages (%s); %d queued, retrying (attempt %d)",
                self.agent_socket,
                failure,
                len(self._queue),
                failures,
            )

    def _send_messages(self, batch: list[dict[str, Any]]) -> tuple[int, OSError | None]:
        """Send in order until one fails; returns (how many are done, the failure). A message that can
        never be sent (too big for the protocol) counts as done, with a warning."""
        done = 0
        for message in batch:
            try:
                data = protocol.encode(plain(message))
            except (protocol.BadMessage, TypeError, ValueError) as exc:
                with self._cond:
                    self.dropped += 1
                    self._reported_drops += 1
                log.warning("dropped a message of type %s for the node agent: %s", message.get("type"), exc)
                done += 1
                continue
            try:
                self._out.sendto(data, self.agent_socket)
            except OSError as exc:  # absent, refused, full (EAGAIN), no buffers
                return done, exc
            self.sent += 1
            done += 1
        return done, None

    def _send_heartbeat(self, beat: dict[str, Any]) -> OSError | None:
        message: dict[str, Any] = {
            "type": "heartbeat",
            "rank": self.rank,
            "step": min(max(int(beat["step"]), 0), MAX_STEP),
            "ts": datetime.fromtimestamp(beat["ts"], UTC).isoformat(),
        }
        if self.reply_to is not None:
            message["reply_to"] = self.reply_to
        for name, low, high in (
            ("throughput", 0.0, 1e15),
            ("loss", -1e12, 1e12),
            ("step_time_s", 0.0, 86400.0 * 7),
            ("compute_s", 0.0, 86400.0 * 7),
            ("perf_score", 0.0, 1.0),
        ):
            value = _finite(beat.get(name), low, high)
            if value is not None:
                message[name] = value
        total = beat.get("total_steps")
        if isinstance(total, int) and 1 <= total <= MAX_STEP:
            message["total_steps"] = total
        try:
            self._out.sendto(protocol.encode(message), self.agent_socket)
        except OSError as exc:
            return exc
        self.sent += 1
        return None

    # --- the reply socket ----------------------------------------------------------------------------

    def _bind_reply_socket(self) -> None:
        """Our own socket, next to the agent's (its directory is this node's alone) when the path fits,
        else in a fresh temporary directory. Without one, directives from the control plane can't reach
        this rank; everything else works."""
        name = f"rank{self.rank}-{os.getpid()}.sock"
        candidates = [str(Path(self.agent_socket).parent / name)]
        try:
            scratch = tempfile.mkdtemp(prefix="ftplane-")
        except OSError:
            scratch = None
        if scratch is not None:
            candidates.append(os.path.join(scratch, name))
        for path in candidates:
            if len(path.encode()) > MAX_SOCKET_PATH:
                continue
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # a socket of a previous process with our pid
                sock.bind(path)
            except OSError as exc:
                sock.close()
                log.debug("cannot bind the reply socket at %s: %s", path, exc)
                continue
            sock.settimeout(0.5)  # so close() is seen within half a second
            self._reply, self.reply_to = sock, path
            break
        if scratch is not None and (self.reply_to is None or not self.reply_to.startswith(scratch)):
            with contextlib.suppress(OSError):
                os.rmdir(scratch)
        elif scratch is not None:
            self._reply_dir = scratch
        if self._reply is None:
            log.warning("no reply socket for rank %d: faults asked for by the control plane won't reach it", self.rank)

    def _receive_loop(self) -> None:
        assert self._reply is not None
        while not self._stopping:
            try:
                data = self._reply.recv(protocol.MAX_MESSAGE_BYTES + 1)
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            try:
                message = json.loads(data)
            except (ValueError, UnicodeDecodeError):
                log.warning("ignored a message from the node agent that is not JSON (%d bytes)", len(data))
                continue
            kind = message.get("type") if isinstance(message, dict) else type(message).__name__
            if kind != "faults":
                log.warning("ignored a message from the node agent of type %r", kind)
                continue
            directives = message.get("faults")
            if not isinstance(directives, list) or self.on_faults is None:
                continue
            try:
                self.on_faults([d for d in directives if isinstance(d, dict)])
            except Exception:
                log.exception("handling fault directives from the node agent failed")
