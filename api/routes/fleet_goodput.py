"""`GET /v1/goodput`: where the fleet's GPU-hours went, per group and time bucket (project admins: their projects'
jobs; cluster admins: every job)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.core.authz import Role
from api.core.config import get_settings
from api.core.errors import ApiError, responses
from api.deps import MemberDep, SessionDep, authorize
from api.schemas.events import Instant, utcnow
from api.schemas.fleet import Duration, FleetGoodputOut, GroupBy, LabelMatch
from api.schemas.spec import DNS_LABEL
from api.services import lifecycle
from api.services.fleet import pricing, window
from api.services.fleet.query import Scope
from api.services.fleet.report import fleet_goodput

router = APIRouter(prefix="/v1/goodput", tags=["goodput"])


@router.get("", response_model=FleetGoodputOut, responses=responses(404))
def get_fleet_goodput(
    session: SessionDep,
    principal: MemberDep,
    since: Annotated[Instant | None, Query(description="Start of the window (default: until - window).")] = None,
    until: Annotated[Instant | None, Query(description="End of the window (default: now).")] = None,
    window_: Annotated[
        Duration | None,
        Query(alias="window", description="The window's length back from until when since is not given (7d)."),
    ] = None,
    bucket: Annotated[Duration | None, Query(description="Cut the window into buckets this long.")] = None,
    group_by: Annotated[GroupBy | None, Query(description="label:<key>, backend, status or project.")] = None,
    label: Annotated[
        list[LabelMatch], Query(max_length=32, description="key=value; every given label must match (repeatable).")
    ] = [],  # noqa: B006
    status_: Annotated[list[lifecycle.JobStatus], Query(alias="status", max_length=8)] = [],  # noqa: B006
    project: Annotated[str | None, Query(max_length=63, pattern=DNS_LABEL, description="Only this one.")] = None,
    top: Annotated[int, Query(ge=0, le=100, description="How many of the jobs that lost the most to list.")] = 10,
) -> FleetGoodputOut:
    """Wall, productive and lost GPU-hours by cause, ETTR, faults by cause class, mean time between faults and jobs,
    per group (`group_by`) and per bucket (`bucket`), over [since, until): a job crossing an edge counts its overlap
    only, a running job up to now; with FTPLANE_GPU_HOUR_PRICE, in money too. The rules are in
    `api/services/fleet/__init__.py`; a group of one job equals that job's own goodput over the same window.

    Beyond the schema: since and window together, a since not before the until, or a bucket cutting the window into
    more than 1,000 buckets are 422 naming the field. Project admins see their projects' jobs (`project`: one of
    them), cluster admins every job."""
    if project is not None:
        authorize(principal, project, Role.admin, f"project {project!r}", "project")
    visible = principal.projects(Role.admin)
    if visible is not None and not visible:
        raise ApiError(403, "fleet goodput needs the admin role in a project (or cluster-admin)")
    now = utcnow()
    span = window.resolve(now, since=since, until=until, window=window_, bucket=bucket)
    labels = dict(item.split("=", 1) for item in label)
    scope = Scope(projects=[project] if project else visible, labels=labels, statuses=[s.value for s in status_])
    return fleet_goodput(
        session,
        since=span.since,
        until=span.until,
        now=now,
        scope=scope,
        bucket_s=span.bucket_s,
        group_by=group_by,
        pricing=pricing.parse(get_settings().gpu_hour_price),
        top=top,
    )
