"""The event vocabulary and the report bodies the trainer and backends send.

Every fact about a job is an append-only event; heartbeats are not events,
they only update per-rank liveness.
"""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import pydantic_core
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator

from api.schemas.scalars import JsonInt
from ftplane import contract
from ftplane.contract import EventType as EventType

MAX_EVENTS_PER_BATCH = contract.MAX_EVENTS_PER_REPORT
MAX_HEARTBEATS_PER_BATCH = contract.MAX_HEARTBEATS_PER_REPORT
MAX_DETAILS_KEYS = contract.MAX_DETAILS_KEYS
MAX_DETAILS_DEPTH = contract.MAX_DETAILS_DEPTH
MAX_DETAILS_BYTES = contract.MAX_DETAILS_BYTES

# Restart anomalies of the job as a whole (workers/supervision/detect_restart_anomalies.py).
ANOMALY_TYPES = frozenset({EventType.restart_storm, EventType.progress_stalled, EventType.recovery_stuck})


def utcnow() -> datetime:
    return datetime.now(UTC)


EARLIEST_REPORT = datetime(2000, 1, 1, tzinfo=UTC)
MAX_CLOCK_AHEAD = timedelta(days=1)
_NUMBER = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*")


def _not_a_number(value: Any) -> Any:
    # pydantic would read a number as Unix time (seconds or milliseconds, a guess); the API says ISO 8601.
    # Cheap first: an ISO 8601 time has a 'T'; a date alone a '-' after its year, which a number has only in its
    # exponent (1.19e-07); only a string without them can be a number.
    if isinstance(value, int | float) or (
        isinstance(value, str)
        and "T" not in value
        and ("-" not in value[1:] or "e" in value.lower())
        and _NUMBER.fullmatch(value)
    ):
        raise ValueError("give an ISO 8601 timestamp with a time zone, e.g. 2026-01-31T12:00:00Z, not a number")
    return value


def _aware(value: datetime) -> datetime:
    offset = value.utcoffset()
    if offset is None:
        raise ValueError("this timestamp has no time zone: add one, e.g. Z for UTC")
    if not offset and value.tzinfo is UTC:
        return value
    try:
        return value.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError("this timestamp is out of range") from exc


_latest_read_at = 0.0  # monotonic time the bound below was computed
_latest = EARLIEST_REPORT  # the latest time a report may have


def _plausible(value: datetime) -> datetime:
    # The upper bound is a day ahead: read the clock once a second, not once per heartbeat of a large batch.
    global _latest, _latest_read_at
    now = time.monotonic()
    if now - _latest_read_at > 1.0:
        _latest, _latest_read_at = utcnow() + MAX_CLOCK_AHEAD, now
    if not EARLIEST_REPORT <= value <= _latest:
        raise ValueError("must be after 2000-01-01 and at most a day ahead of the control plane: check the clock")
    return value


# A point in time given by a client: ISO 8601 with a time zone (a naive one was a 500 before).
Instant = Annotated[
    datetime,
    BeforeValidator(_not_a_number),
    AfterValidator(_aware),
    WithJsonSchema(
        {"type": "string", "format": "date-time", "description": "ISO 8601 with a time zone: 2026-01-31T12:00:00Z."}
    ),
]
# When a reported event or heartbeat happened: also within a plausible window. Its upper end moves with the
# control plane's clock, which no schema can state: the range is documented, and a time outside it is a 422.
ReportedAt = Annotated[
    Instant,
    AfterValidator(_plausible),
    WithJsonSchema(
        {
            "type": "string",
            "format": "date-time",
            "description": "ISO 8601 with a time zone, from 2000-01-01T00:00:00Z to one day ahead of the control "
            "plane's clock (a time outside that range is refused with 422: check the sender's clock).",
        }
    ),
]

IdempotencyKey = Annotated[str, Field(min_length=1, max_length=contract.MAX_KEY_LENGTH, pattern=r"^[\x21-\x7e]+$")]
# Numbers as JSON writes them (not "3", not true): api/schemas/scalars.py.
AttemptNumber = Annotated[int, JsonInt(ge=0, le=10_000)]
Rank = Annotated[int, JsonInt(ge=0, le=contract.MAX_RANK)]
Step = Annotated[int, JsonInt(ge=0, le=contract.MAX_STEP)]


class EventIn(BaseModel):
    """One event as reported by a trainer or a backend."""

    model_config = ConfigDict(extra="forbid")

    key: IdempotencyKey = Field(description="Sender-chosen idempotency key, unique per job.")
    type: EventType
    ts: ReportedAt | None = Field(default=None, description="When it happened; defaults to receipt time.")
    attempt: AttemptNumber | None = Field(default=None, description="Defaults to the job's current attempt.")
    rank: Rank | None = None
    node: str | None = Field(default=None, max_length=contract.MAX_NODE_NAME)
    step: Step | None = None
    details: dict[str, Any] = Field(default_factory=dict)

    @field_validator("details")
    @classmethod
    def _bounded_details(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(value) > MAX_DETAILS_KEYS:
            raise ValueError(f"at most {MAX_DETAILS_KEYS} keys allowed")
        _check_details(value)
        if len(pydantic_core.to_json(value, fallback=str)) > MAX_DETAILS_BYTES:
            raise ValueError(f"at most {MAX_DETAILS_BYTES} bytes of JSON allowed: put large payloads elsewhere")
        return value


def _check_details(details: dict[str, Any]) -> None:
    """Bounded nesting and finite numbers (iterative: a deep document cannot exhaust the stack). Only containers go
    on the stack: a hang's details are checked 16,384 times in one supervision pass."""
    stack: list[tuple[int, dict[str, Any] | list[Any]]] = [(1, details)]
    while stack:
        depth, container = stack.pop()
        if depth > MAX_DETAILS_DEPTH:
            raise ValueError(f"nested more than {MAX_DETAILS_DEPTH} levels deep: flatten it")
        for value in container.values() if isinstance(container, dict) else container:
            if isinstance(value, dict | list):
                stack.append((depth + 1, value))
            elif isinstance(value, float) and not math.isfinite(value):
                raise ValueError("NaN and Infinity are not JSON numbers: send a finite number or null")


class EventBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    events: list[EventIn] = Field(min_length=1, max_length=MAX_EVENTS_PER_BATCH)


class EventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    job_id: str
    attempt: int
    type: EventType
    ts: datetime
    rank: int | None
    node: str | None
    step: int | None
    details: dict[str, Any]
    key: str


class EventBatchResult(BaseModel):
    stored: int = Field(description="Events newly stored by this request.")
    duplicates: int = Field(description="Events already stored under the same key (a resend).")


class EventPage(BaseModel):
    items: list[EventOut]
    next_cursor: str | None


class HeartbeatIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rank: Rank
    step: Step
    ts: ReportedAt | None = None
    node: str | None = Field(default=None, max_length=contract.MAX_NODE_NAME)
    throughput: float | None = Field(
        default=None, strict=True, ge=0, le=1e15, description="Tokens or samples per second."
    )
    loss: float | None = Field(default=None, strict=True, ge=-1e12, le=1e12)
    step_time_s: float | None = Field(
        default=None, strict=True, ge=0, le=7 * 86400, description="Seconds per step, measured."
    )
    compute_s: float | None = Field(
        default=None,
        strict=True,
        ge=0,
        le=7 * 86400,
        description="Seconds of the rank's own work in its last step (sections it timed, e.g. with the SDK's "
        "run.compute(); no waiting on other ranks). In synchronous training every rank's step time is the job's: "
        "a slow rank shows here.",
    )
    perf_score: float | None = Field(
        default=None,
        strict=True,
        ge=0,
        le=1,
        description="NVRx straggler detection's score of this rank (1: as fast as the best rank), when it runs.",
    )
    total_steps: Annotated[int, JsonInt(ge=1, le=10**12)] | None = Field(
        default=None, description="The steps the job will run."
    )


class HeartbeatBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    attempt: AttemptNumber | None = None
    heartbeats: list[HeartbeatIn] = Field(min_length=1, max_length=MAX_HEARTBEATS_PER_BATCH)


class FaultDirective(BaseModel):
    """A fault the control plane asks the trainer to inject (delivered in heartbeat replies)."""

    id: str
    kind: str
    rank: int
    at_step: int | None = None
    fraction: float | None = Field(default=None, description="slowdown: the fraction of its step time slept.")
    duration_steps: int | None = Field(default=None, description="slowdown: for how many steps.")


class HeartbeatResult(BaseModel):
    accepted: int
    faults: list[FaultDirective] = Field(
        default_factory=list, description="Faults the trainer should inject, at the rank and step given."
    )


class RankOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    rank: int
    attempt: int
    node: str | None
    step: int
    last_seen: datetime
    throughput: float | None
    loss: float | None
    step_time_s: float | None = None
    compute_s: float | None = None
    perf_score: float | None = None
    stale: bool = False
