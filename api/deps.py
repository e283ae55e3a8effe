"""Dependencies shared by the routes: the database session, who is calling, what they may do, the audit trail.

Authorization is one dependency per need (the rule itself is `api/core/authz.py`'s `access`):

    _: JobViewerDep         the caller holds viewer (or more) in the project of the path's {job_id}
    _: JobOperatorDep       ... operator: submit-like changes to one job (cancel, inject)
    _: ProjectAdminDep      ... admin in the path's {project}
    _: ClusterAdminDep      a cluster admin (the fleet, nodes, projects)
    require(Role.x)         the same for any role, on a route with a {job_id} path parameter
    in_project(Role.x)      ... on a route with a {project} path parameter

A caller without a role in the project gets the same 404 as for an object that does not exist; a role too
low gets 403 naming the role needed. The trainer token of a job only reports for it (`ReporterDep`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from api import models
from api.core import oidc, ratelimit
from api.core.authz import (
    ANONYMOUS,
    TRAINER_REFUSED,
    Principal,
    Refusal,
    Role,
    access,
    cluster_admin_refusal,
    report_refusal,
)
from api.core.config import get_settings
from api.core.db import session_scope
from api.core.errors import ApiError
from api.services import audit
from api.services.authentication import Unauthenticated, authenticate

SESSION_COOKIE = "ftplane_token"
ANONYMOUS_ADMIN = ANONYMOUS
_CHALLENGE = {"WWW-Authenticate": "Bearer"}
PROVIDER_RETRY_AFTER_S = 5


def get_session() -> Iterator[Session]:
    with session_scope() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.cookies.get(SESSION_COOKIE)


def current_principal(request: Request, session: SessionDep) -> Principal:
    if not get_settings().auth_enabled:
        return ANONYMOUS
    token = bearer_token(request)
    if not token:
        raise ApiError(401, "missing bearer token: send 'Authorization: Bearer <token>'", headers=_CHALLENGE)
    try:
        return authenticate(session, token)
    except Unauthenticated as exc:
        raise ApiError(401, str(exc), headers=_CHALLENGE) from None
    except oidc.ProviderUnavailable as exc:
        raise ApiError(
            503,
            f"the identity provider's keys cannot be read now ({exc}); retry shortly",
            headers={"Retry-After": str(PROVIDER_RETRY_AFTER_S)},
        ) from None


PrincipalDep = Annotated[Principal, Depends(current_principal)]


def audit_trail(request: Request, session: SessionDep, principal: PrincipalDep) -> audit.AuditTrail | None:
    """The audit row of a changing request, in the request's session (see api/services/audit.py); None for reads.
    `api/main.py` puts it on every audited router, so it runs before the route's own dependencies."""
    return audit.begin(request, session, principal)


AuditDep = Annotated[audit.AuditTrail | None, Depends(audit_trail)]


def refuse(refusal: Refusal, field: str) -> ApiError:
    return ApiError(refusal.status, refusal.message, field=field if refusal.status == 404 else None)


def _note_project(request: Request, project: str | None) -> None:
    trail: audit.AuditTrail | None = getattr(request.state, "audit", None)
    if trail is not None and project is not None:
        trail.about(project=project)


def require(needed: Role) -> Callable[..., Principal]:
    """A dependency for routes with a {job_id}: the caller holds `needed` in the job's project."""

    def check(request: Request, job_id: str, session: SessionDep, principal: PrincipalDep) -> Principal:
        project = models.jobs.project_of(session, job_id)
        _note_project(request, project)
        if principal.is_trainer:  # refused whatever the job (its existence is not told either)
            raise ApiError(403, TRAINER_REFUSED)
        what = f"job with id {job_id!r}"
        refusal = access(principal, project, needed, what) if project is not None else Refusal(404, f"no {what}")
        if refusal is not None:
            raise refuse(refusal, "job_id")
        return principal

    return check


def in_project(needed: Role) -> Callable[..., Principal]:
    """A dependency for routes with a {project}: the caller holds `needed` in it."""

    def check(request: Request, project: str, session: SessionDep, principal: PrincipalDep) -> Principal:
        exists = models.projects.get(session, project) is not None
        _note_project(request, project if exists else None)
        what = f"project {project!r}"
        refusal = access(principal, project, needed, what) if exists else Refusal(404, f"no {what}")
        if refusal is not None:
            raise refuse(refusal, "project")
        return principal

    return check


def require_cluster_admin(principal: PrincipalDep) -> Principal:
    refusal = cluster_admin_refusal(principal)
    if refusal is not None:
        raise refuse(refusal, "")
    return principal


JobViewerDep = Annotated[Principal, Depends(require(Role.viewer))]
JobOperatorDep = Annotated[Principal, Depends(require(Role.operator))]
JobAdminDep = Annotated[Principal, Depends(require(Role.admin))]
ProjectViewerDep = Annotated[Principal, Depends(in_project(Role.viewer))]
ProjectAdminDep = Annotated[Principal, Depends(in_project(Role.admin))]
ClusterAdminDep = Annotated[Principal, Depends(require_cluster_admin)]
# Routes written before projects existed said AdminDep: they are the cluster admins' until they say otherwise.
AdminDep = ClusterAdminDep


def require_member(principal: PrincipalDep) -> Principal:
    """Any caller but a trainer token: routes that list what the caller's roles let it see."""
    if principal.is_trainer:
        raise ApiError(403, TRAINER_REFUSED)
    return principal


MemberDep = Annotated[Principal, Depends(require_member)]


def authorize(principal: Principal, project: str, needed: Role, what: str, field: str) -> None:
    """The same rule inside a route, for an object the route loaded (a webhook's project, a token's)."""
    refusal = access(principal, project, needed, what)
    if refusal is not None:
        raise refuse(refusal, field)


def project_for(session: Session, request: Request, principal: Principal, name: str, needed: Role) -> str:
    """A project named in a request's body, where the caller must hold `needed`: an unknown project, or one the
    caller holds no role in, is 422 naming it (as a field of the body); a role too low is 403."""
    _note_project(request, name)
    if not principal.is_trainer and (principal.role_in(name) is None or models.projects.get(session, name) is None):
        raise ApiError(
            422,
            f"unknown project {name!r}: no such project, or you hold no role in it (a cluster admin creates "
            "projects; an admin of the project gives roles)",
            field="project",
        )
    authorize(principal, name, needed, f"project {name!r}", "project")
    return name


def require_reporter(job_id: str, principal: PrincipalDep, session: SessionDep) -> Principal:
    """The trainer token of this very job, or an operator of its project."""
    project = None if principal.job_id == job_id else models.jobs.project_of(session, job_id)
    refusal = report_refusal(principal, job_id, project)
    if refusal is not None:
        raise refuse(refusal, "job_id")
    return principal


ReporterDep = Annotated[Principal, Depends(require_reporter)]


def within_limit(principal: Principal, endpoint: str) -> Principal:
    """The principal, when its token has not used up its rate limit on this ingest endpoint (else 429)."""
    limiter = ratelimit.ingest_limiter()
    _refuse_past_limit(endpoint, limiter.take(f"{principal.token_id}:{endpoint}") if limiter else 0.0)
    return principal


async def within_limit_async(principal: Principal, endpoint: str) -> Principal:
    """`within_limit` for a route on the event loop."""
    limiter = ratelimit.ingest_limiter()
    _refuse_past_limit(endpoint, await limiter.take_async(f"{principal.token_id}:{endpoint}") if limiter else 0.0)
    return principal


def _refuse_past_limit(endpoint: str, wait: float) -> None:
    if wait > 0:
        seconds = ratelimit.retry_after(wait)
        raise ApiError(
            429,
            f"this token sent {endpoint} faster than its rate limit; retry in {seconds} s",
            headers={"Retry-After": str(seconds)},
        )


def within_ingest_limit(endpoint: str) -> Callable[[Principal], Principal]:
    """A reporter whose token has not used up its rate limit on this ingest endpoint (else 429)."""

    def check(principal: ReporterDep) -> Principal:
        return within_limit(principal, endpoint)

    return check


EventsReporterDep = Annotated[Principal, Depends(within_ingest_limit("events"))]
HeartbeatsReporterDep = Annotated[Principal, Depends(within_ingest_limit("heartbeats"))]
