"""Dependencies shared by the routes: the database session and who is calling."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from api.core import ratelimit
from api.core.config import get_settings
from api.core.db import session_scope
from api.core.errors import ApiError
from api.models import tokens
from api.models.tokens import Principal

SESSION_COOKIE = "ftplane_token"
ANONYMOUS_ADMIN = Principal(token_id="auth-disabled", role="admin")


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
        return ANONYMOUS_ADMIN
    token = bearer_token(request)
    if not token:
        raise ApiError(
            401,
            "missing bearer token: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = tokens.authenticate(session, token)
    if principal is None:
        raise ApiError(401, "invalid or revoked token", headers={"WWW-Authenticate": "Bearer"})
    return principal


PrincipalDep = Annotated[Principal, Depends(current_principal)]


def require_admin(principal: PrincipalDep) -> Principal:
    if not principal.is_admin:
        raise ApiError(403, "this endpoint needs an admin token; trainer tokens may only report for their job")
    return principal


AdminDep = Annotated[Principal, Depends(require_admin)]


def require_reporter(job_id: str, principal: PrincipalDep) -> Principal:
    """Admins, or the trainer token of this very job."""
    if principal.is_admin or principal.job_id == job_id:
        return principal
    raise ApiError(403, "this token belongs to another job")


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
