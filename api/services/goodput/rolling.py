"""Rolling goodput: the ETTR of the last 5, 15 and 60 minutes of a job's wall time (to now, or to its end), from
the same labelled intervals as the whole-job figure, so a job that has started to degrade shows before its
average moves."""

from __future__ import annotations

from collections.abc import Sequence

from api.schemas.goodput import RollingGoodput
from api.services.goodput.attempts import PRODUCTIVE, Interval

ROLLING_WINDOWS_S = (300.0, 900.0, 3600.0)


def rolling(intervals: Sequence[Interval], wall: float) -> list[RollingGoodput]:
    out = []
    for window in ROLLING_WINDOWS_S:
        lo = max(0.0, wall - window)
        span = wall - lo
        productive = sum(max(0.0, min(e, wall) - max(b, lo)) for b, e, bucket in intervals if bucket == PRODUCTIVE)
        out.append(
            RollingGoodput(
                window_s=window,
                wall_s=round(span, 6),
                productive_s=round(productive, 6),
                ettr=min(1.0, productive / span) if span > 0 else None,
            )
        )
    return out
