"""A fleet query's window from what the caller gave: [since, until), its buckets, each refusal naming the field."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from api.core.errors import ApiError
from api.schemas.fleet import as_timedelta, seconds_of

DEFAULT_WINDOW = "7d"
MAX_BUCKETS = 1000


@dataclass(frozen=True)
class Span:
    since: datetime
    until: datetime
    bucket_s: float | None


def resolve(
    now: datetime,
    *,
    since: datetime | None,
    until: datetime | None,
    window: str | None,
    bucket: str | None,
) -> Span:
    """until: given, else now; since: given, else until - window (7d without either). A window and a since together,
    a since not before the until, or more than MAX_BUCKETS buckets are refused (422)."""
    if since is not None and window is not None:
        raise ApiError(422, "give since or window, not both: window counts back from until", field="window")
    since, until = _utc(since, "since"), _utc(until, "until")
    end = until or now
    try:
        start = since or end - as_timedelta(window or DEFAULT_WINDOW)
    except OverflowError:
        raise ApiError(422, f"window {window} reaches before the year 1: give a shorter one", field="window") from None
    if start >= end:
        raise ApiError(422, f"since ({start.isoformat()}) must be before until ({end.isoformat()})", field="since")
    bucket_s = seconds_of(bucket) if bucket is not None else None
    if bucket_s is not None:
        count = math.ceil((end - start) / timedelta(seconds=bucket_s))
        if count > MAX_BUCKETS:
            raise ApiError(
                422,
                f"bucket {bucket} cuts the window into {count} buckets; at most {MAX_BUCKETS}: give a longer bucket",
                field="bucket",
            )
    return Span(start, end, bucket_s)


def _utc(value: datetime | None, field: str) -> datetime | None:
    """The time in UTC; one that falls outside the years 1 to 9999 there is refused."""
    if value is None:
        return None
    try:
        return value.astimezone(UTC)
    except (OverflowError, ValueError):
        raise ApiError(422, f"{field} is outside the years 1 to 9999 in UTC", field=field) from None
