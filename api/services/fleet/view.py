"""The dashboard's fleet page (api/routes/fleet_dashboard.py): the fleet's goodput over a window as the page draws
it, the teams and jobs that lost the most, the objectives with their budgets."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from api.core.authz import Principal, Role
from api.core.config import get_settings
from api.schemas.events import utcnow
from api.schemas.fleet import DURATION, FleetGoodputOut, FleetGroup, ObjectiveOut, as_timedelta
from api.schemas.goodput import LOST_BUCKETS
from api.schemas.spec import LABEL_KEY
from api.services.fleet import objectives, pricing
from api.services.fleet.query import Scope
from api.services.fleet.report import fleet_goodput

WINDOWS = {"1d": "1h", "7d": "1d", "30d": "1d"}  # window -> bucket
DEFAULT_WINDOW, DEFAULT_BY = "7d", "team"
TOP = 10


@dataclass
class FleetView:
    allowed: bool
    window: str = DEFAULT_WINDOW
    by: str = DEFAULT_BY
    bucket: str = WINDOWS[DEFAULT_WINDOW]
    out: FleetGoodputOut | None = None
    teams: list[FleetGroup] = field(default_factory=list)  # most GPU-hours lost first
    objectives: list[ObjectiveOut] = field(default_factory=list)
    chart: dict[str, Any] = field(default_factory=dict)
    windows: tuple[str, ...] = tuple(WINDOWS)

    @staticmethod
    def lost(figures: Any) -> float:
        return float(sum(figures.lost_gpu_hours.values()))

    @staticmethod
    def causes(figures: Any, top: int = 3) -> list[tuple[str, float]]:
        lost = sorted(
            ((c.replace("_", " "), h) for c, h in figures.lost_gpu_hours.items() if h > 0), key=lambda x: -x[1]
        )
        return lost[:top]


def fleet_view(session: Session, who: Principal, window: str | None, by: str | None) -> FleetView:
    """The page for `who`: the jobs of the projects it administers (every job for a cluster admin)."""
    visible = who.projects(Role.admin)
    chosen = window if window in WINDOWS else DEFAULT_WINDOW
    key = by if by and len(by) <= 253 and re.match(LABEL_KEY, by) else DEFAULT_BY
    if visible is not None and not visible:
        return FleetView(allowed=False, window=chosen, by=key)
    now = utcnow()
    assert re.match(DURATION, chosen)
    out = fleet_goodput(
        session,
        since=now - as_timedelta(chosen),
        until=now,
        now=now,
        scope=Scope(projects=visible),
        bucket_s=as_timedelta(WINDOWS[chosen]).total_seconds(),
        group_by=f"label:{key}",
        pricing=pricing.parse(get_settings().gpu_hour_price),
        top=TOP,
    )
    rows = objectives.list_all(session, who.projects(Role.viewer))
    return FleetView(
        allowed=True,
        window=chosen,
        by=key,
        bucket=WINDOWS[chosen],
        out=out,
        teams=sorted(out.groups, key=lambda g: -FleetView.lost(g)),
        objectives=[objectives.out(row, objectives.evaluate(session, row, now)) for row in rows],
        chart=chart(out),
    )


def chart(out: FleetGoodputOut) -> dict[str, Any]:
    """What fleet.js draws: per bucket, the ETTR and the GPU-hours lost by each cause that lost any."""
    causes = [c for c in LOST_BUCKETS if any(b.lost_gpu_hours[c] > 0 for b in out.series)]
    return {
        "t": [b.start.timestamp() for b in out.series],
        "bucket_s": out.bucket_s,
        "ettr": [b.ettr for b in out.series],
        "causes": causes,
        "lost": {c: [round(b.lost_gpu_hours[c], 6) for b in out.series] for c in causes},
    }
