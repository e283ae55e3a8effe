"""Who a bearer credential is: one of this API's tokens, or a JWT of the configured OIDC provider whose
groups and subject role bindings map to project roles."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.orm import Session

from api import models
from api.core import oidc
from api.core.authz import Principal
from api.core.config import get_settings


class Unauthenticated(Exception):
    """The credential is not valid; the message says why."""


def authenticate(session: Session, bearer: str) -> Principal:
    """Raises Unauthenticated, or oidc.ProviderUnavailable when a JWT cannot be checked now."""
    verifier = oidc.verifier()
    if verifier is not None and oidc.looks_like_jwt(bearer):
        try:
            claims = verifier.verify(bearer)
        except oidc.InvalidJwt as exc:
            raise Unauthenticated(str(exc)) from None
        return from_claims(session, claims)
    principal = models.tokens.authenticate(session, bearer)
    if principal is None:
        raise Unauthenticated("invalid or revoked token")
    return principal


def from_claims(session: Session, claims: oidc.Claims) -> Principal:
    admin_group = get_settings().oidc_cluster_admin_group
    return Principal(
        token_id=f"jwt:{claims.issuer}#{claims.subject}",
        kind="jwt",
        name=claims.subject,
        cluster_admin=admin_group is not None and admin_group in claims.groups,
        roles=models.projects.roles_of(session, claims.subject, claims.groups),
        issuer=claims.issuer,
        subject=claims.subject,
        expires_at=datetime.fromtimestamp(claims.expires_at, UTC),
    )
