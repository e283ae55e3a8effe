"""The node-local channel between a node's ranks and its agent: JSON datagrams over a Unix socket.

Why datagrams: each message arrives whole or not at all, a sender never waits on a reader (a
non-blocking send either goes into the socket buffer or fails at once), and there is no
connection to manage when either side restarts. The agent binds `FTPLANE_AGENT_SOCKET`; a rank
that wants replies (fault directives) binds a socket of its own and names it in `reply_to`.

Messages, rank → agent (every one a JSON object with a `type`):

    {"type": "hello", "rank": 3, "reply_to": "/run/.../r3.sock"}       the SDK started in this rank

    {"type": "heartbeat", "rank": 3, "step": 120, "ts": "2026-...Z", "reply_to": "/run/.../r3.sock",
     "throughput": 812.5, "loss": 2.31, "step_time_s": 0.42, "compute_s": 0.31, "perf_score": 0.97,
     "total_steps": 1000}
    {"type": "event", "event": {"key": "...", "type": "checkpoint_saved", "ts": "...", "attempt": 0,
     "rank": 3, "step": 100, "details": {...}}}
    {"type": "exclude_node", "rank": 3, "reason": "ECC errors on GPU 2"}

Agent → rank:

    {"type": "faults", "faults": [{"id": "...", "kind": "exception", "rank": 3, "at_step": 40}]}

A message that is not JSON, not an object, of an unknown type, with fields of the wrong types,
or over MAX_MESSAGE_BYTES is refused by `parse` (the agent drops it with a warning). The ranks
never see the job's token: only the agent talks to the control plane.

Standard library only: this runs in the user's image, inside the training processes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ftplane.contract import MAX_DETAILS_KEYS, MAX_KEY_LENGTH, MAX_RANK, MAX_STEP

SOCKET_ENV = "FTPLANE_AGENT_SOCKET"
MAX_MESSAGE_BYTES = 64 * 1024


class BadMessage(ValueError):
    """A message from a rank that the agent will not accept; the text says why."""


@dataclass(frozen=True)
class Heartbeat:
    rank: int
    step: int
    ts: str | None = None
    reply_to: str | None = None
    throughput: float | None = None
    loss: float | None = None
    step_time_s: float | None = None
    compute_s: float | None = None  # the rank's own work in its last step (sections it timed)
    perf_score: float | None = None  # NVRx straggler detection's score, when the rank runs it
    total_steps: int | None = None

    def for_control_plane(self, node: str) -> dict[str, Any]:
        beat: dict[str, Any] = {"rank": self.rank, "step": self.step, "node": node}
        for name in ("ts", "throughput", "loss", "step_time_s", "compute_s", "perf_score", "total_steps"):
            value = getattr(self, name)
            if value is not None:
                beat[name] = value
        return beat


@dataclass(frozen=True)
class Hello:
    rank: int
    reply_to: str | None = None


@dataclass(frozen=True)
class RankEvent:
    event: dict[str, Any]


@dataclass(frozen=True)
class ExcludeNode:
    rank: int | None
    reason: str


Message = Hello | Heartbeat | RankEvent | ExcludeNode


def encode(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise BadMessage(f"message of {len(data)} bytes is over the {MAX_MESSAGE_BYTES}-byte limit")
    return data


def parse(data: bytes) -> Message:
    """Validate one datagram from a rank; raises BadMessage naming what is wrong."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise BadMessage(f"{len(data)} bytes, over the {MAX_MESSAGE_BYTES}-byte limit")
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadMessage(f"not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadMessage("not a JSON object")
    kind = body.get("type")
    if kind == "heartbeat":
        return Heartbeat(
            rank=_int(body, "rank", 0, MAX_RANK),
            step=_int(body, "step", 0, MAX_STEP),
            ts=_optional_str(body, "ts", 64),
            reply_to=_optional_str(body, "reply_to", 4096),
            throughput=_optional_number(body, "throughput", 0, 1e15),
            loss=_optional_number(body, "loss", -1e12, 1e12),
            step_time_s=_optional_number(body, "step_time_s", 0, 86400 * 7),
            compute_s=_optional_number(body, "compute_s", 0, 86400 * 7),
            perf_score=_optional_number(body, "perf_score", 0, 1),
            total_steps=_optional_int(body, "total_steps", 1, MAX_STEP),
        )
    if kind == "hello":
        return Hello(rank=_int(body, "rank", 0, MAX_RANK), reply_to=_optional_str(body, "reply_to", 4096))
    if kind == "event":
        return RankEvent(_event(body.get("event")))
    if kind == "exclude_node":
        rank = body.get("rank")
        return ExcludeNode(
            rank=_int(body, "rank", 0, MAX_RANK) if rank is not None else None,
            reason=_optional_str(body, "reason", 2000) or "a rank asked to exclude this node",
        )
    raise BadMessage(f"unknown message type {kind!r}")


def _int(body: dict[str, Any], name: str, low: int, high: int) -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadMessage(f"{name} must be an integer in [{low}, {high}]")
    return value


def _optional_int(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    return None if body.get(name) is None else _int(body, name, low, high)


def _optional_number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise BadMessage(f"{name} must be a finite number")
    if not low <= value <= high:
        raise BadMessage(f"{name} must be in [{low:g}, {high:g}]")
    return float(value)


def _optional_str(body: dict[str, Any], name: str, limit: int) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise BadMessage(f"{name} must be a string of at most {limit} characters")
    return value


def _event(event: Any) -> dict[str, Any]:
    if not isinstance(event, dict):
        raise BadMessage("event must be a JSON object")
    key, kind = event.get("key"), event.get("type")
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH:
        raise BadMessage(f"event.key must be a string of 1 to {MAX_KEY_LENGTH} characters")
    if not isinstance(kind, str) or not 0 < len(kind) <= 64:
        raise BadMessage("event.type must be a short string")
    details = event.get("details", {})
    if not isinstance(details, dict) or len(details) > MAX_DETAILS_KEYS:
        raise BadMessage(f"event.details must be an object of at most {MAX_DETAILS_KEYS} keys")
    allowed = {"key", "type", "ts", "attempt", "rank", "node", "step", "details"}
    extra = set(event) - allowed
    if extra:
        raise BadMessage(f"event has unknown fields: {', '.join(sorted(extra))}")
    return dict(event)
