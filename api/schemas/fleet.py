"""Shapes of the fleet's goodput (`GET /v1/goodput`) and of ETTR objectives (`/v1/objectives`).

The rules behind the figures are in `api/services/fleet/__init__.py`.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from api.schemas.kubernetes_spec import LabelValue, keys_match_pattern
from api.schemas.spec import DNS_LABEL, LABEL_KEY, LabelKey

_KEY = LABEL_KEY.removeprefix("^").removesuffix("$")
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
DURATION = r"^[1-9][0-9]{0,3}[mhdw]$"
GROUP_BY = rf"^(backend|status|project|label:{_KEY})$"
LABEL_MATCH = rf"^{_KEY}={_VALUE}$"

# A span of time: a whole number of minutes, hours, days or weeks (30m, 1h, 1d, 7d, 2w).
Duration = Annotated[str, StringConstraints(min_length=2, max_length=5, pattern=DURATION)]
GroupBy = Annotated[str, StringConstraints(min_length=6, max_length=6 + 253, pattern=GROUP_BY)]
LabelMatch = Annotated[str, StringConstraints(min_length=2, max_length=253 + 1 + 63, pattern=LABEL_MATCH)]

_UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def seconds_of(duration: str) -> float:
    """`7d` in seconds."""
    found = re.fullmatch(DURATION, duration)
    if found is None:
        raise ValueError(f"{duration!r} is not a duration like 30m, 1h, 7d or 2w")
    return float(int(duration[:-1]) * _UNIT_S[duration[-1]])


def as_timedelta(duration: str) -> timedelta:
    return timedelta(seconds=seconds_of(duration))


# ---- GET /v1/goodput --------------------------------------------------------------------------------------------


class FleetCost(BaseModel):
    """The same GPU-hours in money, at FTPLANE_GPU_HOUR_PRICE."""

    wall: float
    productive: float
    lost: dict[str, float] = Field(description="By cause, as lost_gpu_hours.")
    unpriced_gpu_hours: float = Field(description="GPU-hours of jobs the price list gives no price.")


class FleetFigures(BaseModel):
    jobs: int = Field(description="Jobs with any wall time in the range.")
    wall_hours: float = Field(description="Wall hours of those jobs, not weighted by their GPUs.")
    wall_gpu_hours: float = Field(description="Wall hours x GPUs.")
    productive_gpu_hours: float
    lost_gpu_hours: dict[str, float] = Field(description="By cause: the buckets of a job's goodput (every key).")
    ettr: float | None = Field(description="productive_gpu_hours / wall_gpu_hours (null without wall time).")
    faults: dict[str, int] = Field(description="Failures by cause class (api/schemas/causes.py), those seen only.")
    faults_total: int
    mtbf_hours: float | None = Field(description="Mean time between faults: wall_hours / faults_total.")
    cost: FleetCost | None = Field(description="With FTPLANE_GPU_HOUR_PRICE set; else null.")


class FleetBucket(FleetFigures):
    start: datetime
    end: datetime


class FleetGroup(FleetFigures):
    key: str | None = Field(
        description="The group's label value (null: jobs without the label), backend, status or project."
    )
    series: list[FleetBucket] = Field(description="Per bucket, oldest first (empty without `bucket`).")


class TopJob(BaseModel):
    """A job that lost the most GPU-hours in the window."""

    job_id: str
    name: str
    project: str
    status: str
    labels: dict[str, str]
    gpus: int
    wall_gpu_hours: float
    lost_gpu_hours: float
    lost_by_cause: dict[str, float] = Field(description="GPU-hours lost by cause (those that lost any).")
    ettr: float | None


class FleetGoodputOut(BaseModel):
    since: datetime
    until: datetime
    now: datetime = Field(description="Running jobs count up to this time.")
    bucket_s: float | None
    group_by: str | None
    total: FleetFigures = Field(description="Every job the query selects, over the whole window.")
    series: list[FleetBucket] = Field(description="The total per bucket (empty without `bucket`).")
    groups: list[FleetGroup] = Field(description="Per group, most wall GPU-hours first (empty without group_by).")
    top_jobs: list[TopJob] = Field(description="The jobs that lost the most GPU-hours over the window.")


# ---- objectives -------------------------------------------------------------------------------------------------


class ObjectiveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str = Field(
        default="default",
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        description="The project whose jobs it covers (the caller must be its admin).",
    )
    name: str = Field(
        default="ettr",
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        description="A name people read (need not be unique).",
    )
    selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description="Only the project's jobs carrying every one of these labels (empty: all of them).",
        json_schema_extra=keys_match_pattern,
    )
    target: float = Field(gt=0, lt=1, strict=True, description="The ETTR the jobs should reach over the window.")
    window: Duration = Field(default="7d", description="The rolling window: 1h to 9999w, e.g. 7d.")
    burn_rate: float = Field(
        default=10.0,
        ge=1,
        le=1000,
        strict=True,
        description="Breached also when, over the window's last 1/28 (6 h of 7 d), the budget burns at this many "
        "times the rate that would spend it exactly over the window: (1 - ETTR) / (1 - target).",
    )


class Spender(BaseModel):
    job_id: str
    name: str
    lost_gpu_hours: float
    lost_by_cause: dict[str, float]


class ObjectiveStatus(BaseModel):
    """An evaluation of the objective now."""

    evaluated_at: datetime
    ettr: float | None = Field(description="Over the window (null: no wall time in it).")
    wall_gpu_hours: float
    lost_gpu_hours: float
    budget_gpu_hours: float = Field(description="(1 - target) x wall GPU-hours: what may be lost.")
    budget_left: float | None = Field(description="1 - lost / budget (below 0: overspent; null without wall time).")
    burn_rate: float | None = Field(description="Over the window's last 1/28 (null: no wall time there).")
    breached: bool
    reason: Literal["below_target", "burn_rate"] | None
    top_causes: dict[str, float] = Field(description="GPU-hours lost by cause, most first.")
    top_jobs: list[Spender] = Field(description="The jobs that spent the most of the budget.")


class ObjectiveOut(BaseModel):
    id: str
    project: str
    name: str
    selector: dict[str, str]
    target: float
    window: str
    burn_rate: float
    created_at: datetime
    breached_since: datetime | None
    status: ObjectiveStatus | None = Field(description="Now (null where it was not asked for).")
