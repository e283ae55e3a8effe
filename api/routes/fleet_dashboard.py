"""The dashboard's fleet page, `/fleet`: where the fleet's GPU-hours went (ETTR over time, lost time stacked by
cause per bucket), the teams and jobs that lost the most, nodes by state, objectives and their budgets. The first
page a cluster admin sees after logging in; a project's admins see their projects' jobs."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from api.deps import SessionDep
from api.routes.dashboard import ViewerDep, _page, _to_login
from api.services.fleet.view import fleet_view

router = APIRouter(include_in_schema=False)


@router.get("/fleet", response_class=HTMLResponse)
def fleet_page(
    request: Request, session: SessionDep, who: ViewerDep, window: str | None = None, by: str | None = None
) -> Response:
    if who is None:
        return _to_login(request)
    return _page(request, "fleet.html", {"v": fleet_view(session, who, window, by)})
