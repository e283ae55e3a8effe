"""The web dashboard at `/`: jobs, one job's faults and restarts, checkpoints, rank liveness.

Server-rendered (Jinja2); htmx polls small partials every 2 s; the progress chart is uPlot.
Both libraries are vendored under api/static/vendor (nothing is fetched from a CDN). Pages need
a token with a role in a project (or a cluster admin's), kept after /login in an HttpOnly,
SameSite=Strict cookie (the API reads the same cookie, so the dashboard needs no second kind of
session), or a sign-in through the OIDC provider (api/routes/dashboard_sso.py), whose access token
the same cookie holds. Each person sees the jobs of the projects they hold a role in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from api import models
from api.core import oidc
from api.core.authz import Principal, Role, access
from api.core.config import get_settings
from api.database.tables import Job
from api.deps import ANONYMOUS_ADMIN, SESSION_COOKIE, SessionDep, bearer_token
from api.services import dashboard, lifecycle
from api.services.authentication import Unauthenticated, authenticate
from api.services.job_liveness_view import NODE_ROWS_MAX, RANK_CELLS_MAX

PACKAGE = Path(__file__).resolve().parents[1]
STATIC_DIR = PACKAGE / "static"
templates = Jinja2Templates(directory=str(PACKAGE / "templates"))
templates.env.filters["duration"] = lambda s: _duration(s)
templates.env.filters["bytes"] = lambda n: _bytes(n)
templates.env.filters["logs_query"] = dashboard.logs_query
templates.env.filters["count"] = lambda n: f"{n:,}"
templates.env.globals.update(rank_cells_max=f"{RANK_CELLS_MAX:,}", node_rows_max=f"{NODE_ROWS_MAX:,}")

router = APIRouter(include_in_schema=False)

COOKIE_MAX_AGE_S = 12 * 3600
POLL_STOP = 286  # htmx stops polling on this status (a finished job does not change)
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def mount_static(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=str(STATIC_DIR)), name="static")


class LoginRequired(Exception):
    pass


def _person(session: SessionDep, token: str) -> Principal | None:
    """Whom a token or JWT names, when it may look at the dashboard (anyone but a job's trainer token)."""
    try:
        principal = authenticate(session, token)
    except (Unauthenticated, oidc.ProviderUnavailable):
        return None
    return None if principal.is_trainer else principal


def viewer(request: Request, session: SessionDep) -> Principal | None:
    """The person looking at the dashboard, or None (then pages redirect to /login)."""
    if not get_settings().auth_enabled:
        return ANONYMOUS_ADMIN
    token = bearer_token(request)
    return _person(session, token) if token else None


ViewerDep = Annotated[Principal | None, Depends(viewer)]


FLEET_PAGE = "/fleet"


def landing(target: str, cluster_admin: bool) -> str:
    """Where a login goes: where it was asked to, except that the site's root takes a cluster admin to the fleet
    page (api/routes/fleet_dashboard.py), the first page a platform team looks at."""
    return FLEET_PAGE if target == "/" and cluster_admin else target


def _safe_next(target: str | None) -> str:
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


def _page(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    response = templates.TemplateResponse(
        request,
        name,
        {
            "logged_in": get_settings().auth_enabled and bool(request.cookies.get(SESSION_COOKIE)),
            "sso": get_settings().oidc_enabled and get_settings().oidc_client_id is not None,
            **context,
        },
        status_code=status_code,
    )
    response.headers.update(SECURITY_HEADERS)
    return response


def _to_login(request: Request, *, partial: bool = False) -> Response:
    target = "/login?next=" + quote(request.url.path, safe="/")
    if partial:  # htmx follows HX-Redirect: an expired session sends the page to the login form
        return Response(status_code=401, headers={"HX-Redirect": target, **SECURITY_HEADERS})
    return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)


# ---- login -------------------------------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, who: ViewerDep, next: str = "/") -> Response:
    if who is not None and get_settings().auth_enabled and request.cookies.get(SESSION_COOKIE):
        return RedirectResponse(_safe_next(next), status_code=303)
    return _page(request, "login.html", {"next": _safe_next(next), "error": None})


@router.post("/login", response_class=HTMLResponse)
def login(
    request: Request,
    session: SessionDep,
    token: Annotated[str, Form(max_length=512)] = "",
    next: Annotated[str, Form(max_length=2048)] = "/",
) -> Response:
    token = token.strip()
    principal = _person(session, token) if token else None
    if principal is None:
        error = "That token is not valid here. Paste a token with a role in a project (ftp_...), not a job's."
        return _page(request, "login.html", {"next": _safe_next(next), "error": error}, status_code=401)
    response = RedirectResponse(
        landing(_safe_next(next), principal.cluster_admin), status_code=303, headers=SECURITY_HEADERS
    )
    response.set_cookie(
        SESSION_COOKIE,
        token,
        max_age=COOKIE_MAX_AGE_S,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
def logout() -> Response:
    response = RedirectResponse("/login", status_code=303, headers=SECURITY_HEADERS)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response


# ---- pages and their live partials -------------------------------------------------------------


def _status_filter(status: str | None) -> str | None:
    return status if status in {s.value for s in lifecycle.JobStatus} else None


@router.get("/", response_class=HTMLResponse)
def jobs_page(request: Request, session: SessionDep, who: ViewerDep, status: str | None = None) -> Response:
    if who is None:
        return _to_login(request)
    wanted = _status_filter(status)
    return _page(request, "jobs.html", _jobs_context(session, wanted, who))


@router.get("/ui/jobs", response_class=HTMLResponse)
def jobs_rows(request: Request, session: SessionDep, who: ViewerDep, status: str | None = None) -> Response:
    if who is None:
        return _to_login(request, partial=True)
    return _page(request, "_jobs_rows.html", _jobs_context(session, _status_filter(status), who))


def _jobs_context(session: SessionDep, status: str | None, who: Principal) -> dict[str, Any]:
    return {
        "rows": dashboard.job_rows(session, status=status, projects=who.projects(Role.viewer)),
        "status": status,
        "statuses": [s.value for s in lifecycle.JobStatus],
        "rungs": dashboard.RUNGS,
    }


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str, session: SessionDep, who: ViewerDep) -> Response:
    if who is None:
        return _to_login(request)
    job = _visible_job(session, job_id, who)
    if job is None:
        return _page(request, "not_found.html", {"job_id": job_id}, status_code=404)
    return _page(request, "job.html", {"v": dashboard.job_view(session, job), "rungs": dashboard.RUNGS})


@router.get("/ui/jobs/{job_id}/live", response_class=HTMLResponse)
def job_live(request: Request, job_id: str, session: SessionDep, who: ViewerDep) -> Response:
    if who is None:
        return _to_login(request, partial=True)
    job = _visible_job(session, job_id, who)
    if job is None:
        return Response(status_code=POLL_STOP, headers=SECURITY_HEADERS)
    view = dashboard.job_view(session, job)
    status_code = POLL_STOP if view.terminal else 200
    return _page(request, "_job_live.html", {"v": view, "rungs": dashboard.RUNGS}, status_code=status_code)


def _visible_job(session: SessionDep, job_id: str, who: Principal) -> Job | None:
    """The job, when `who` may view it (else None: the page is the same as for a job that does not exist)."""
    job = models.jobs.get(session, job_id)
    if job is None or access(who, job.project, Role.viewer, "job") is not None:
        return None
    return job


# ---- formatting --------------------------------------------------------------------------------


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def _bytes(n: int | None) -> str:
    if n is None:
        return "—"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
